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


def _count_built(monkeypatch) -> list[object]:
    """Every DDPStrategy object built from now on."""
    built: list[object] = []
    post_init = DDPStrategy.__post_init__

    def counted(self):
        built.append(self)
        post_init(self)

    monkeypatch.setattr(DDPStrategy, "__post_init__", counted)
    return built


def _clear_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)


def test_a_trainer_builds_one_strategy_object_from_a_dict(monkeypatch, tmp_path):
    import treadle
    from torch.utils.data import DataLoader

    from support import TinyNet, make_data

    _clear_launcher(monkeypatch)
    built = _count_built(monkeypatch)
    trainer = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                              optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                              strategy=dict(type="ddp", find_unused_parameters=True), progress=False)
    assert built == [trainer.strategy] and trainer.strategy.find_unused_parameters is True


def test_a_config_files_strategy_is_built_once_by_the_trainer(monkeypatch, tmp_path):
    from treadle.config import build_trainer, load_config

    _clear_launcher(monkeypatch)
    (tmp_path / "job.yaml").write_text(
        "model: {type: support.TinyNet}\nloss_fn: {type: CrossEntropyLoss}\n"
        "train_dataloader: {batch_size: 4, dataset: {type: support.make_data, n: 8}}\n"
        "optim_wrapper: {optimizer: {type: SGD, lr: 0.1}}\nmax_epochs: 1\nprogress: false\n"
        "strategy: {type: ddp, static_graph: true}\n")
    built = _count_built(monkeypatch)
    cfg = load_config(tmp_path / "job.yaml", mode="train", work_dir=str(tmp_path / "run"))
    assert built == []  # the file's check names the options, builds nothing
    trainer = build_trainer(cfg)
    assert built == [trainer.strategy] and trainer.strategy.static_graph is True


def test_checking_a_strategy_spec_builds_nothing_and_names_what_is_wrong(monkeypatch):
    from treadle.strategies.build import check_strategy

    built = _count_built(monkeypatch)
    check_strategy({"type": "ddp", "static_graph": True})
    with pytest.raises(ValueError, match=r"strategy 'ddp': bad options \['tp'\]; tp: tensor parallelism"):
        check_strategy({"type": "ddp", "tp": 2})
    with pytest.raises(ValueError, match="strategy='dpp' is not supported"):
        check_strategy("dpp")
    assert built == []


def test_an_option_value_is_refused_once_by_the_trainer_naming_the_strategy(monkeypatch):
    import treadle

    with pytest.raises(ValueError, match=r"strategy: strategy .fsdp.: tp=2 needs tp_plan="):
        treadle.Trainer(nn.Linear(2, 2), strategy=dict(type="fsdp", tp=2))
    with pytest.raises(ValueError, match=r"strategy 'ddp': stall_warn_s=-1"):
        treadle.Trainer(nn.Linear(2, 2), strategy=dict(type="ddp", stall_warn_s=-1))


def test_the_common_options_are_defined_once_and_taken_by_every_multi_process_strategy():
    import dataclasses

    from treadle.strategies.base import ProcessGroupStrategy
    from treadle.strategies.fsdp import FSDPStrategy

    common = [f.name for f in dataclasses.fields(ProcessGroupStrategy)]
    assert common == ["backend", "timeout_s", "shard_data", "sync_bn", "stall_warn_s", "stall_timeout_s", "empty_init"]
    for cls in (DDPStrategy, FSDPStrategy):
        s = cls(timeout_s=12.0, stall_timeout_s=30, empty_init=True, sync_bn=True)
        assert (s.timeout_s, s.stall_timeout_s, s.empty_init, s.sync_bn, s.builds_empty) == (12.0, 30.0, True, True, True)
    assert DDPStrategy(True).find_unused_parameters is True  # a strategy's own options stay positional
    with pytest.raises(TypeError):
        DDPStrategy(False, False, True, True, "gloo")  # the common ones are keywords
