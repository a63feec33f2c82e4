"""Choosing a strategy (one process: no process group needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from treadle.strategies.base import SingleDevice, build_strategy
from treadle.strategies.ddp import DDPStrategy


def test_auto_is_single_without_a_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert isinstance(build_strategy("auto"), SingleDevice)


def test_auto_is_ddp_under_a_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert isinstance(build_strategy("auto"), DDPStrategy)  # built, not set up: no process group yet


def test_options_by_dict_and_errors():
    s = build_strategy({"type": "ddp", "find_unused_parameters": True, "static_graph": True})
    assert isinstance(s, DDPStrategy) and s.find_unused_parameters and s.static_graph
    with pytest.raises(ValueError, match=r"strategy 'ddp': bad options \['bucket'\]"):
        build_strategy({"type": "ddp", "bucket": 1})
    with pytest.raises(ValueError, match="strategy='dpp' is not supported"):
        build_strategy("dpp")
    with pytest.raises(ValueError, match="backend='mpi'"):
        DDPStrategy(backend="mpi")


def test_ddp_in_one_process_does_not_wrap(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    s = DDPStrategy()
    s.setup()
    model = nn.Linear(2, 2)
    assert s.setup_model(model) is model and not s.distributed and s.device == torch.device("cpu")
