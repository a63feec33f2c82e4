"""The streaming safetensors writer and reader against the safetensors package, and the
shard plan against huggingface_hub's own."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from treadle.checkpoint.manifest import CheckpointError, CorruptCheckpointError
from treadle.checkpoint.safetensors_stream import SafetensorsFile, TensorSpec, parse_size, plan_shards, write_safetensors


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "b.bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "a.f32": torch.randn(4, 2, generator=g),
        "flag": torch.tensor([True, False, True]),
        "count": torch.tensor(7, dtype=torch.int64),  # a scalar
        "empty": torch.zeros(0, 4),
        "half": torch.randn(7, generator=g).half(),
        "u8": torch.arange(5, dtype=torch.uint8),
        "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
    }


def _specs(tensors):
    return [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]


def test_a_file_written_tensor_by_tensor_is_read_by_safetensors(tmp_path):
    tensors = _tensors()
    path = tmp_path / "m.safetensors"
    read = []
    size = write_safetensors(path, _specs(tensors), lambda k: read.append(k) or tensors[k],
                             metadata={"format": "pt"})
    assert size == path.stat().st_size and sorted(read) == sorted(tensors)  # each tensor read once
    loaded = load_file(path)
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_the_reader_reads_the_packages_files(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "ref.safetensors")
    f = SafetensorsFile(tmp_path / "ref.safetensors")
    assert f.specs == {s.name: s for s in _specs(tensors)}
    for k, v in tensors.items():
        assert torch.equal(f.read(k), v), k


def test_at_most_one_tensor_is_held_at_a_time(tmp_path):
    tensors = _tensors()
    held: set[str] = set()
    most = 0

    def read(key):
        nonlocal most
        held.add(key)
        most = max(most, len(held))
        return tensors[key].clone()

    write_safetensors(tmp_path / "m.safetensors", _specs(tensors), read, done=held.discard)
    assert most == 1 and not held


def test_a_tensor_that_is_not_its_spec_is_refused(tmp_path):
    spec = TensorSpec("w", torch.float32, (2, 2))
    with pytest.raises(CheckpointError, match=r"'w': read as torch.float32 \(3,\), expected torch.float32 \(2, 2\)"):
        write_safetensors(tmp_path / "m.safetensors", [spec], lambda k: torch.zeros(3))


def test_a_damaged_file_is_named(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(CorruptCheckpointError, match="bad.safetensors: not a safetensors file"):
        SafetensorsFile(path)


def test_shards_are_cut_as_huggingface_hub_cuts_them():
    hub = pytest.importorskip("huggingface_hub")
    g = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(int(n), generator=g) for i, n in enumerate([30, 50, 10, 300, 40, 25, 25, 5])}
    for limit in (100, 200, 400, 10_000):
        theirs = hub.split_torch_state_dict_into_shards(tensors, max_shard_size=limit)
        ours = plan_shards(_specs(tensors), limit)
        assert [[s.name for s in shard] for shard in ours] == list(theirs.filename_to_tensors.values()), limit


def test_sizes_are_read_as_huggingface_writes_them():
    hub = pytest.importorskip("huggingface_hub.serialization._base")
    for text in ("5GB", "50GB", "500MB", "1.5KB", "2TB"):
        assert parse_size(text) == hub.parse_size_to_int(text), text
    assert parse_size("2GiB") == 2 * 2**30 and parse_size(1234) == 1234 and parse_size("1234") == 1234
    for bad in ("lots", "0", "-5MB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_a_box_is_read_block_by_block_whatever_its_dtype_and_shape(tmp_path, monkeypatch):
    """A process's shard of a tensor (a box: a range per dimension), read a few rows at a
    time, equals the slice of the tensor; into another dtype too."""
    import treadle.checkpoint.safetensors_stream as stream

    tensors = {"a": torch.randn(37, 11), "b": torch.randn(5, 3, 4).bfloat16(), "c": torch.tensor(3.5),
               "d": torch.arange(10), "e": torch.rand(4) > 0.5}
    save_file(tensors, tmp_path / "x.safetensors")
    f = SafetensorsFile(tmp_path / "x.safetensors")
    monkeypatch.setattr(stream, "BOX_BLOCK", 50)  # a few rows per read: the blocks' seams are crossed
    out = torch.empty(10, 4)
    f.read_box("a", (3, 5), (10, 4), out)
    assert torch.equal(out, tensors["a"][3:13, 5:9])
    out = torch.empty(2, 2, 3)  # bfloat16 read into float32
    f.read_box("b", (1, 1, 1), (2, 2, 3), out)
    assert torch.equal(out, tensors["b"][1:3, 1:3, 1:4].float())
    for key in ("c", "d", "e"):
        whole = torch.empty(tensors[key].shape, dtype=tensors[key].dtype)
        f.read_box(key, (0,) * whole.dim(), tuple(whole.shape), whole)
        assert torch.equal(whole, tensors[key])
    with pytest.raises(ValueError, match=r"a: the box at \[30, 0\] of size \[10, 11\] is outside its shape \[37, 11\]"):
        f.read_box("a", (30, 0), (10, 11), torch.empty(10, 11))
