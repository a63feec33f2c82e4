"""``treadle export CKPT --out FILE.safetensors``: written one tensor at a time, whatever the
checkpoint (one-process ``state.pt``, sharded, EMA, a ``.pt`` or ``.safetensors`` file, a state
dict); safetensors' own ``load_file`` reads it equal to the checkpoint's weights bit for bit;
it appears whole or not at all; the export's peak memory is about one tensor, not the model."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cli_support import run
from treadle.checkpoint.io import CheckpointError, save_checkpoint
from treadle.checkpoint.sharded import save_sharded
from treadle.checkpoint.tensor_sources import MappedWeights
from treadle.checkpoint.weights import export_safetensors


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights of every kind the export meets: dtypes, a scalar, an empty tensor, two keys
    of one tensor (tied), a transposed (non-contiguous) one and a view into a larger one."""
    torch.manual_seed(seed)
    embed = torch.randn(10, 6)
    rows = torch.randn(5, 4)
    return {"embed.weight": embed, "head.weight": embed, "proj.weight": torch.randn(4, 6).t(),
            "proj.bias": rows[2], "norm.weight": torch.randn(6).to(torch.bfloat16),
            "half.weight": torch.randn(3, 2).half(), "bn.num_batches_tracked": torch.tensor(seed + 7),
            "mask": torch.rand(7) > 0.5, "ids": torch.arange(5, dtype=torch.int32), "empty": torch.empty(0, 3),
            "double": torch.randn(2, dtype=torch.float64)}


def _assert_file_holds(path, expected: dict[str, torch.Tensor]) -> None:
    """``load_file(path)`` equals ``expected`` bit for bit, as safetensors' own file of it reads."""
    got = load_file(str(path))
    reference = path.parent / "reference.safetensors"
    save_file({k: v.contiguous().clone() for k, v in expected.items()}, str(reference))
    theirs = load_file(str(reference))
    reference.unlink()
    assert set(got) == set(expected) == set(theirs)
    for k, v in expected.items():
        assert got[k].dtype == v.dtype == theirs[k].dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k], v) and torch.equal(got[k], theirs[k]), k


@pytest.mark.parametrize("entry", ["model", "ema_hook", "ema_entry"])
def test_a_one_process_checkpoint_exports_its_weights_bit_for_bit(tmp_path, entry):
    model, ema = _weights(0), _weights(1)
    state = {"model": {f"module._orig_mod.{k}": v for k, v in model.items()}, "iter": 3}
    if entry == "ema_hook":  # a training checkpoint: the averaged weights are the EMAHook's state
        state["hooks"] = {"EMAHook": {"ema": {"module": ema, "momentum": 0.5}}}
    elif entry == "ema_entry":  # a best-weights checkpoint: a top-level "ema"
        state["ema"] = ema
    ckpt = save_checkpoint(tmp_path / "iter_3", {"state.pt": state})
    key = "model" if entry == "model" else "ema"
    out = export_safetensors(ckpt, tmp_path / "out" / "w.safetensors", key=key)
    _assert_file_holds(out, model if entry == "model" else ema)
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata()["source"] == str(ckpt) and f.metadata()["key"] == key
    assert [p.name for p in out.parent.iterdir()] == ["w.safetensors"]


def test_the_command_line_exports_a_training_checkpoint_s_ema(tmp_path, capsys):
    state = {"model": _weights(0), "hooks": {"EMAHook": {"ema": {"module": _weights(2)}}}}
    ckpt = save_checkpoint(tmp_path / "ckpt", {"state.pt": state})
    rc, out, err = run(capsys, "export", ckpt, "--ema", "--out", tmp_path / "ema.safetensors")
    assert rc == 0 and out.strip() == str(tmp_path / "ema.safetensors"), err
    _assert_file_holds(tmp_path / "ema.safetensors", _weights(2))


def test_a_sharded_checkpoint_exports_tensor_by_tensor(tmp_path, monkeypatch):
    from treadle.checkpoint import sharded

    weights = {k: v.contiguous() for k, v in _weights(3).items() if k != "head.weight"}  # DCP: one key per tensor
    save_sharded(tmp_path / "ckpt", {"model": {f"module.{k}": v for k, v in weights.items()}},
                 {"state.pt": {"iter": 0}})
    monkeypatch.setattr(sharded, "consolidate", None)  # never the whole state at once
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "w.safetensors")
    _assert_file_holds(out, weights)
    with pytest.raises(CheckpointError, match="a sharded checkpoint's weights are under 'model'; key='ema' is not"):
        export_safetensors(tmp_path / "ckpt", tmp_path / "ema.safetensors", key="ema")
    assert not (tmp_path / "ema.safetensors").exists()


def test_a_sharded_checkpoint_of_what_is_not_weights_is_refused(tmp_path):
    save_sharded(tmp_path / "ckpt", {"model": {"w": torch.ones(2), "python": "x", "b._extra_state": b"x"}},
                 {"state.pt": {"iter": 0}})
    with pytest.raises(CheckpointError, match=r"ckpt: not a model's weights \('python' not tensors\)"):
        export_safetensors(tmp_path / "ckpt", tmp_path / "w.safetensors")
    assert not (tmp_path / "w.safetensors").exists()


@pytest.mark.parametrize("kind", ["pt", "legacy_pt", "safetensors", "state_dict"])
def test_files_and_state_dicts_export_bit_for_bit(tmp_path, kind):
    weights = _weights(4)
    if kind == "state_dict":
        source = {"state_dict": weights}
    elif kind == "safetensors":
        source = tmp_path / "in.safetensors"
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, str(source))
    else:  # an MMEngine-style file; the legacy (not zip) format cannot be mapped: read whole
        source = tmp_path / "in.pt"
        torch.save({"state_dict": weights, "meta": {"epoch": 1}}, source,
                   _use_new_zipfile_serialization=kind == "pt")
    _assert_file_holds(export_safetensors(source, tmp_path / "w.safetensors"), weights)


def test_a_failure_midway_leaves_the_existing_file_and_nothing_else(tmp_path, monkeypatch):
    ckpt = save_checkpoint(tmp_path / "ckpt", {"state.pt": {"model": _weights(5)}})
    out = export_safetensors(ckpt, tmp_path / "out" / "w.safetensors")
    before = out.read_bytes()
    real, calls = MappedWeights.read, []

    def read(self, key):
        calls.append(key)
        if len(calls) == 3:
            raise CheckpointError(f"reading {key!r} failed")
        return real(self, key)

    monkeypatch.setattr(MappedWeights, "read", read)
    with pytest.raises(CheckpointError, match="reading .* failed"):
        export_safetensors(_weights(6), out)
    assert out.read_bytes() == before and [p.name for p in out.parent.iterdir()] == ["w.safetensors"]


MEASURE = r"""
import sys
from treadle.cli import main
rc = main(["export", *sys.argv[1:]])
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(rc, peak * 1024)
"""


def _peak(*argv) -> int:
    """The peak resident memory (VmHWM) in bytes of ``treadle export ARGV`` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", MEASURE, *map(str, argv)], capture_output=True, text=True,
                          check=True)
    rc, peak = map(int, done.stdout.split()[-2:])
    assert rc == 0, done.stderr
    return peak


@pytest.mark.slow
def test_the_export_holds_about_one_tensor_not_the_model(tmp_path):
    """A 144 MiB model whose largest tensor is 16 MiB: gathering it whole would add some
    3x the model (the state dict, then its serialization). Over the same export of a tiny
    model, a ``state.pt``'s (with and without --ema) adds about its largest tensor (measured
    1.0x), a sharded one's a few (3.0x: DCP reads a tensor's bytes, loads them, then copies
    them into place)."""
    mib = 2**20
    torch.manual_seed(0)
    big = {f"layers.{i}.weight": torch.randn(1024, 2048) for i in range(16)}  # 8 MiB each
    big["embed.weight"] = torch.randn(2048, 2048)  # 16 MiB: the largest
    largest, total = 16 * mib, sum(t.numel() * t.element_size() for t in big.values())
    tiny = {"w": torch.randn(4, 4)}
    for name, weights in (("tiny", tiny), ("big", big)):
        save_checkpoint(tmp_path / name / "plain", {"state.pt": {
            "model": weights, "hooks": {"EMAHook": {"ema": {"module": {k: v + 1 for k, v in weights.items()}}}}}})
        save_sharded(tmp_path / name / "sharded", {"model": weights}, {"state.pt": {"iter": 0}})
    del big
    for kind, flags, bound in (("plain", [], 1.5), ("plain", ["--ema"], 1.5), ("sharded", [], 4.0)):
        peaks = [_peak(tmp_path / name / kind, "--out", tmp_path / name / f"{kind}{len(flags)}.safetensors", *flags)
                 for name in ("tiny", "big")]
        excess = peaks[1] - peaks[0]
        assert excess < bound * largest, (kind, flags, f"{excess / mib:.0f} MiB over the tiny model's export, "
                                          f"model {total / mib:.0f} MiB, largest tensor {largest / mib:.0f} MiB")
