"""Choosing a strategy (one process: no process group needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support import DEVICE
from treadle.strategies.base import SingleDevice
from treadle.strategies.build import resolve_strategy
from treadle.strategies.ddp import DDPStrategy


def test_auto_is_single_without_a_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert isinstance(resolve_strategy("auto"), SingleDevice)


def test_auto_is_ddp_under_a_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert isinstance(resolve_strategy("auto"), DDPStrategy)  # built, not set up: no process group yet


def test_options_by_dict_and_errors():
    s = resolve_strategy({"type": "ddp", "find_unused_parameters": True, "static_graph": True})
    assert isinstance(s, DDPStrategy) and s.find_unused_parameters and s.static_graph
    with pytest.raises(ValueError, match=r"strategy 'ddp': bad options \['bucket'\]"):
        resolve_strategy({"type": "ddp", "bucket": 1})
    with pytest.raises(ValueError, match="strategy='dpp' is not supported"):
        resolve_strategy("dpp")
    # Tensor parallelism under DDP: only the options DDP lacks are named (not its own backend), and where they are.
    with pytest.raises(ValueError) as e:
        resolve_strategy({"type": "ddp", "backend": "gloo", "dp_shard": 2, "tp": 2, "tp_plan": {"fc": "colwise"},
                          "wrap": None})
    assert str(e.value).startswith("strategy 'ddp': bad options ['dp_shard', 'tp', 'tp_plan', 'wrap']; dp_shard, tp, "
                                   "tp_plan: tensor parallelism and the device mesh need type: fsdp"), e.value
    assert "'backend'" in str(e.value).split("expected some of")[1]
    with pytest.raises(ValueError, match="backend='mpi'"):
        DDPStrategy(backend="mpi")


def test_ddp_in_one_process_does_not_wrap(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    s = DDPStrategy()
    s.setup()
    model = nn.Linear(2, 2)
    assert s.setup_model(model) is model and not s.distributed and s.device == DEVICE  # local rank 0's GPU, if any


def test_a_strategy_dict_without_type_says_so():
    with pytest.raises(ValueError, match=r"strategy=\{'devices': 2\} has no 'type'; expected dict\(type=<name>"):
        resolve_strategy({"devices": 2})


def _no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_a_cuda_device_on_a_machine_without_cuda_is_a_clear_error(device, monkeypatch):
    _no_cuda(monkeypatch)
    with pytest.raises(ValueError, match=r"strategy 'single': device=.*cuda.*, but CUDA is not available on this "
                                         r"machine \(torch.cuda.is_available\(\) is False\); expected 'cpu' or None"):
        resolve_strategy({"type": "single", "device": device})


def test_a_cuda_device_without_cuda_fails_in_the_trainer_before_anything_is_written(monkeypatch, tmp_path):
    import treadle

    _no_cuda(monkeypatch)
    with pytest.raises(ValueError, match="CUDA is not available"):
        treadle.Trainer(nn.Linear(2, 2), work_dir=tmp_path / "run", strategy=dict(type="single", device="cuda"))
    assert not (tmp_path / "run").exists()


def test_a_cuda_index_beyond_the_devices_and_a_bad_device_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"device='cuda:3', but this machine has 1 CUDA device\(s\); expected an "
                                         r"index in 0..0"):
        SingleDevice("cuda:3")
    with pytest.raises(ValueError, match=r"device='gpu' is not a device name"):
        SingleDevice("gpu")
    with pytest.raises(TypeError, match=r"device=0; expected a device name"):
        SingleDevice(0)  # type: ignore[arg-type]  # the wrong type, on purpose
    assert SingleDevice("cpu").device == torch.device("cpu")


def test_move_model_leaves_a_model_already_on_the_device_or_still_on_meta_alone_and_moves_one_that_is_not():
    from treadle.strategies.base import move_model

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))

    def refuse(*args, **kwargs):
        raise AssertionError("model.to() was called for a model already on the device")
    model.to = refuse  # type: ignore[method-assign]  # a stand-in, removed below
    assert move_model(model, torch.device("cpu")) is model
    del model.to
    moved = move_model(model, torch.device("meta"))  # a buffer left behind would keep .to() too
    assert {t.device.type for t in [*moved.parameters(), *moved.buffers()]} == {"meta"}
    model = nn.Linear(2, 2)
    model.register_buffer("offset", torch.zeros(2, device="meta"))  # still to be materialized (on the device)
    model.to = refuse  # type: ignore[method-assign]  # torch's .to() would refuse meta -> cpu
    assert move_model(model, torch.device("cpu")) is model
