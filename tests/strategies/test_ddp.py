"""DDP on 2 gloo processes: equal to one process with the doubled batch, exact
resume after SIGKILL and preemption, another world size, rank-0-only files, and a
failure on one rank ending the run quickly. Each test starts real processes with
torchrun's environment (see support.run_ranks)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, TinyNet, make_data
from trainer_ranks import SCRIPT, _final, _reference, _run

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
              pytest.mark.slow]  # 2 processes on gloo


def test_ddp_with_compile_and_accumulation_syncs_once_per_window(tmp_path):
    """compile=True wraps the DDP module; the optimizer wrapper still gets DDP's no_sync
    (set up on the DDP module before it is compiled), so gradients cross once per window."""
    out = tmp_path / "out"
    _run(out, "--accumulate", "2", "--shuffle", "--compile")
    for k, v in _reference(True, 2).items():
        torch.testing.assert_close(_final(out)[k], v, rtol=1e-5, atol=1e-6)
    assert torch.load(out / "result_rank0.pt", weights_only=True)["allreduces"] == 6


@pytest.mark.parametrize("shuffle,accumulate", [(False, 1), (True, 2)])
def test_ddp_matches_one_process_with_the_doubled_batch(tmp_path, shuffle, accumulate):
    out, work = tmp_path / "out", tmp_path / "run"
    args = ["--work-dir", str(work), "--val", "--accumulate", str(accumulate)] + (["--shuffle"] if shuffle else [])
    _run(out, *args)
    w0, w1 = _final(out, 0), _final(out, 1)
    ref = _reference(shuffle, accumulate)
    for k in ref:
        assert torch.equal(w0[k], w1[k]), k  # replicas stay identical
        torch.testing.assert_close(w0[k], ref[k], rtol=1e-5, atol=1e-6)
    result = torch.load(out / "result_rank0.pt", weights_only=True)
    assert result["strategy"] == "ddp" and result["world_size"] == 2
    # no_sync: gradients cross the network once per optimizer step, not per micro-batch.
    assert result["allreduces"] == 12 // accumulate

    # Validation covers the 37 samples exactly once across the 2 ranks (no padding).
    model = TinyNet()
    model.load_state_dict(w0)
    x, y = make_data(37, seed=1).tensors
    with torch.no_grad():
        logits = model(x)
    assert result["metrics"]["val/acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert result["metrics"]["val/loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    assert torch.load(out / "result_rank1.pt", weights_only=True)["metrics"] == result["metrics"]

    # Only rank 0 wrote: one copy of every record and file; the checkpoint holds both RNGs.
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    train_iters = [r["iter"] for r in records if r["mode"] == "train"]
    assert train_iters == [2, 4, 6, 8, 10, 12]
    assert [r["mode"] for r in records].count("val") == 2
    assert len(list((work / "tensorboard").iterdir())) == 1
    assert len((work / "log.csv").read_text().splitlines()) == len(records) + 1  # one row per record + header
    assert sorted(p.name for p in (work / "checkpoints" / "epoch_0002").iterdir()) == [
        "manifest.json", "rng_rank0.pt", "rng_rank1.pt", "state.pt"]
    # aligned to the longest key, which a CUDA build adds
    assert re.search(r"^world size +2$", (work / "env.txt").read_text(), re.M)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A 2-rank run with dropout and shuffling, never stopped."""
    root = tmp_path_factory.mktemp("ddp_ref")
    _run(root / "out", "--work-dir", str(root / "run"), "--shuffle", "--dropout", "0.3", "--interval", "2")
    return _final(root / "out")


def test_ddp_preemption_of_one_rank_then_sigkill_then_resume_is_exact(tmp_path, uninterrupted):
    """SIGTERM reaches rank 1 only: both ranks stop after the same iteration, rank 0
    saves, both exit 143. Resumed, the run is SIGKILLed on rank 1 (rank 0 fails on
    its next collective). Resumed again, it ends with the uninterrupted weights."""
    out, work = tmp_path / "out", tmp_path / "run"
    common = ["--work-dir", str(work), "--shuffle", "--dropout", "0.3", "--interval", "2"]
    results = _run(out, *common, "--term-at", "5", expect=None)
    assert [code for code, _ in results] == [143, 143], results[0][1][-3000:]
    assert (work / "checkpoints" / "iter_00000005" / "manifest.json").exists()  # saved right after iter 5
    results = _run(out, *common, "--resume", "--kill-at", "9", expect=None)
    assert results[1][0] == -9 and results[0][0] != 0
    assert not (out / "final_rank0.pt").exists()
    _run(out, *common, "--resume")  # from iter_00000008
    for k, v in uninterrupted.items():
        assert torch.equal(_final(out)[k], v), k
        assert torch.equal(_final(out, 1)[k], v), k


def test_ctrl_c_on_one_rank_stops_both_which_save_and_exit_130(tmp_path, uninterrupted):
    """SIGINT reaches rank 1 only: the ranks agree on it as on SIGTERM, stop after the
    same iteration, rank 0 saves, both exit 130 (no requeue); resumed, the run ends
    with the uninterrupted weights."""
    out, work = tmp_path / "out", tmp_path / "run"
    common = ["--work-dir", str(work), "--shuffle", "--dropout", "0.3", "--interval", "2"]
    results = _run(out, *common, "--int-at", "5", expect=None)
    assert [code for code, _ in results] == [130, 130], results[0][1][-3000:]
    assert "interrupted (Ctrl-C received by another rank): saved" in results[0][1]
    assert (work / "checkpoints" / "iter_00000005" / "manifest.json").exists()
    _run(out, *common, "--resume")
    for k, v in uninterrupted.items():
        assert torch.equal(_final(out)[k], v), k


def _single_process(work: Path, batch: int, epochs: int, resume: bool) -> dict[str, torch.Tensor]:
    """The one-process half of a run that changes its world size: on the CPU, as its
    2-process half (gloo) and the reference are; the subject is the world size."""
    torch.manual_seed(0)
    model = TinyNet()
    trainer = treadle.Trainer(model, work_dir=work, train_dataloader=DataLoader(make_data(48), batch_size=batch),
                              loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1, momentum=0.9),
                              max_epochs=epochs, seed=7, resume=resume, log_writers=("jsonl",), strategy=ON_CPU)
    trainer.fit()
    return model.state_dict()


@pytest.mark.parametrize("direction", ["2->1", "1->2"])
def test_resume_with_another_world_size(tmp_path, direction):
    """Epoch 1 on one world size, epoch 2 on the other, the global batch kept (8):
    the same weights as 2 epochs on 2 processes (shuffle off)."""
    out, work = tmp_path / "out", tmp_path / "run"
    if direction == "2->1":
        _run(out, "--work-dir", str(work), "--max-epochs", "1")
        final = _single_process(work, batch=8, epochs=2, resume=True)
    else:
        _single_process(work, batch=8, epochs=1, resume=False)
        _run(out, "--work-dir", str(work), "--max-epochs", "2", "--resume")
        final = _final(out)
        assert torch.load(out / "result_rank0.pt", weights_only=True)["iter"] == 12
    for k, v in _reference(shuffle=False, accumulate=1).items():  # = 2 epochs on 2 processes (first test)
        torch.testing.assert_close(final[k], v, rtol=1e-5, atol=1e-6)


def test_resume_inside_an_epoch_with_another_world_size_takes_up_the_same_samples(tmp_path):
    """Preempted after 3 of epoch 1's 6 iterations on 2 processes (batch 4 each), resumed on
    one process with batch 8 (the global batch kept): it goes on at sample 24, not 48."""
    out, work = tmp_path / "out", tmp_path / "run"
    results = _run(out, "--work-dir", str(work), "--term-at", "3", expect=None)
    assert [code for code, _ in results] == [143, 143], results[0][1][-3000:]
    final = _single_process(work, batch=8, epochs=2, resume=True)
    for k, v in _reference(shuffle=False, accumulate=1).items():
        torch.testing.assert_close(final[k], v, rtol=1e-5, atol=1e-6)


def test_an_exception_on_rank_1_ends_every_rank_quickly_with_that_error(tmp_path):
    """Through the --nproc launcher (torch.distributed.run's API): the agent stops
    rank 0 at once instead of letting it wait for the 30-minute collective timeout."""
    code = ("import sys; from treadle.distributed.launch import launch_local; "
            f"sys.exit(launch_local(2, [{SCRIPT!r}, {str(tmp_path / 'out')!r}, '--raise-at', '3']))")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # gloo: a GPU machine's one GPU is not two
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "boom on rank 1 at iteration 3" in proc.stdout + proc.stderr
    assert elapsed < 60, f"took {elapsed:.0f} s"
    assert not (tmp_path / "out" / "final_rank0.pt").exists()


def test_ddp_resume_inside_an_accumulation_window_restores_each_ranks_gradients(tmp_path):
    """Under no_sync each rank holds its own gradients of the open window: each rank's
    file keeps them (state.pt is rank 0's alone), so the resumed all-reduce sums the same."""
    out, work = tmp_path / "out", tmp_path / "run"
    common = ["--work-dir", str(work), "--shuffle", "--accumulate", "2", "--interval", "3"]
    results = _run(out, *common, "--term-at", "3", expect=None)  # saved after iteration 3: a window half done
    assert [code for code, _ in results] == [143, 143], results[0][1][-3000:]
    _run(out, *common, "--resume")
    whole = tmp_path / "whole"
    _run(whole, "--work-dir", str(tmp_path / "whole_run"), "--shuffle", "--accumulate", "2", "--interval", "3")
    for k, v in _final(whole).items():
        assert torch.equal(_final(out)[k], v), k
        assert torch.equal(_final(out, 1)[k], v), k
