"""treadle/compat.py: the torch floor, and the shims for what differs between releases."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from treadle import compat


@pytest.mark.parametrize("version,expected", [
    ("2.6.0", (2, 6)), ("2.11.0+cu130", (2, 11)), ("2.14.1", (2, 14)), ("2.10.0.dev20250101", (2, 10)),
    ("2.7.0a0+git1234", (2, 7)), ("3.0", (3, 0)),
])
def test_release_reads_major_and_minor(version, expected):
    assert compat.release(version) == expected


def test_below_the_floor_is_one_line_naming_both_releases():
    with pytest.raises(ImportError) as info:
        compat.check_torch("2.5.1+cu124")
    message = str(info.value)
    assert "\n" not in message
    assert message == ("treadle needs torch>=2.6, but torch 2.5.1+cu124 is installed: pip install 'torch>=2.6'")
    compat.check_torch("2.6.0")  # the floor itself is fine
    compat.check_torch(str(torch.__version__))


def test_the_floor_is_pyprojects():
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"torch>={compat.TORCH_FLOOR_TEXT},' in pyproject


@pytest.mark.slow
def test_import_treadle_below_the_floor_fails_with_that_line():
    code = "import torch; torch.__version__ = '2.5.1'; import treadle"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ImportError: treadle needs torch>=2.6, but torch 2.5.1 is installed: pip install 'torch>=2.6'")


def test_dcp_gets_no_dist_only_where_it_takes_it():
    def new(state, *, storage_writer=None, no_dist=False):
        pass

    def old(state, *, storage_writer=None):  # torch 2.6's dcp.save
        pass

    assert compat.dcp_kwargs(new, True) == {"no_dist": True}
    assert compat.dcp_kwargs(old, True) == {}


def test_storage_data_is_read_back_when_the_save_returned_none():
    class Metadata:
        def __init__(self, storage_data):
            self.storage_data = storage_data

    assert compat.saved_storage_data(Metadata({"a": 1}), lambda: pytest.fail("read back")) == {"a": 1}
    assert compat.saved_storage_data(Metadata(None), lambda: Metadata({"b": 2})) == {"b": 2}  # torch 2.11


@pytest.mark.parametrize("version,plain,mixed", [
    ("2.6.0", False, False), ("2.7.1", False, False), ("2.8.0", True, False), ("2.11.0", True, False),
    ("2.12.1", True, True), ("2.14.1", True, True),
])
def test_fsdp_on_the_cpu_is_refused_where_that_release_cannot_train_it(version, plain, mixed):
    assert (compat.fsdp_cpu_problem(False, version) is None) is plain
    assert (compat.fsdp_cpu_problem(False, version, replicas=True) is None) is plain  # HSDP: the same average
    assert (compat.fsdp_cpu_problem(True, version) is None) is mixed
    if not mixed:
        assert compat.fsdp_cpu_problem(True, version) == (
            f"FSDP with a 16-bit param_dtype on the CPU (gloo) needs torch>=2.12, but torch {version} is installed; "
            "on CUDA (nccl), FSDP runs from torch 2.6")
    if not plain:
        assert compat.fsdp_cpu_problem(False, version) == (
            f"FSDP on the CPU (gloo) needs torch>=2.8, but torch {version} is installed (older releases sum the "
            "gradients of the processes where they should average them); on CUDA (nccl), FSDP runs from torch 2.6")


@pytest.mark.parametrize("version,forced", [("2.8.0", True), ("2.9.1", False), ("2.14.1", False)])
def test_fsdp_averages_itself_where_gloo_would_sum(version, forced):
    """2.8's gloo sums what FSDP asks it to average: FSDP is told to sum and divide itself."""
    calls = []

    class Sharded:
        def set_force_sum_reduction_for_comms(self, enable):
            calls.append(enable)
    compat.gloo_sums_average([Sharded(), Sharded()], version)
    assert calls == ([True, True] if forced else [])


def test_sync_bn_with_fsdp_on_gloo_is_refused_before_2_9():
    assert compat.fsdp_cpu_problem(False, "2.9.1", sync_bn=True) is None
    assert compat.fsdp_cpu_problem(False, "2.8.0", sync_bn=False) is None
    assert compat.fsdp_cpu_problem(False, "2.8.0", sync_bn=True) == (
        "FSDP with sync_bn=True on the CPU (gloo) needs torch>=2.9, but torch 2.8.0 is installed; with DDP "
        "(strategy='ddp', sync_bn=True) it trains on this release")


def test_resharding_is_refused_before_2_9_and_the_same_world_size_never():
    assert compat.reshard_problem(2, 2, "2.6.0") is None
    assert compat.reshard_problem(1, 2, "2.9.0") is None
    assert compat.reshard_problem(1, 2, "2.8.0") == (
        "loading a sharded checkpoint saved by 1 process(es) onto 2 needs torch>=2.9, but torch 2.8.0 is installed "
        "(older releases train on from it wrong); resume it on 1, or consolidate it into full weights (treadle "
        "export, or load_from=)")


def test_a_checkpoint_of_another_mesh_is_refused_before_2_9_and_the_same_mesh_never():
    two_by_two, four = {"dp_replicate": 1, "dp_shard": 2, "tp": 2}, {"dp_replicate": 1, "dp_shard": 4, "tp": 1}
    assert compat.mesh_reshard_problem(two_by_two, dict(two_by_two), "2.7.1") is None
    assert compat.mesh_reshard_problem(two_by_two, four, "2.9.1") is None
    assert compat.mesh_reshard_problem(two_by_two, four, "2.8.0") == (
        "loading a sharded checkpoint saved on the mesh dp_replicate=1 x dp_shard=2 x tp=2 onto dp_replicate=1 x "
        "dp_shard=4 x tp=1 needs torch>=2.9, but torch 2.8.0 is installed (older releases train on from it wrong); "
        "resume it on the same mesh, or consolidate it into full weights (treadle export, or load_from=)")


@pytest.mark.parametrize("version,copies", [("2.6.0", True), ("2.7.1", False), ("2.14.1", False)])
def test_async_save_gets_its_own_cpu_tensors_where_torch_would_not_copy_them(monkeypatch, version, copies):
    weight = torch.ones(3)
    monkeypatch.setattr(torch, "__version__", version)
    staged = compat.staged_for_async_save({"model": {"w": weight}, "iter": 3})
    assert staged["iter"] == 3 and torch.equal(staged["model"]["w"], weight)
    assert (staged["model"]["w"] is not weight) is copies
    weight.add_(1)  # training goes on while the write runs
    assert torch.equal(staged["model"]["w"], torch.ones(3)) is copies


def test_ddp_gets_the_buffer_argument_its_release_takes():
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    kwargs = compat.ddp_buffer_kwargs(False)
    assert kwargs in ({"forward_sync_buffers": False}, {"broadcast_buffers": False})
    assert next(iter(kwargs)) in inspect.signature(DistributedDataParallel.__init__).parameters
