"""A CUDA run whose DataLoader does not pin memory is told so (runs without a GPU)."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.strategies.base import SingleDevice

from support import ON_CPU, TinyNet, make_data


class _CudaOnPaper(SingleDevice):
    """Claims CUDA but keeps everything on the CPU: enough to build a Trainer."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.device = torch.device("cuda")

    def setup_model(self, model: nn.Module) -> nn.Module:
        return model


def _trainer(pin: bool) -> treadle.Trainer:
    return treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4, pin_memory=pin),
                           loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=1,
                           strategy=_CudaOnPaper(), progress=False)


def test_unpinned_loader_on_cuda_warns_once(caplog):
    with caplog.at_level(logging.WARNING, logger="treadle"):
        _trainer(pin=False)
    assert [r.getMessage() for r in caplog.records].count(
        "the training DataLoader has pin_memory=False: on CUDA each batch copy then blocks the host; "
        "DataLoader(..., pin_memory=True) lets it overlap with compute") == 1


def test_pinned_loader_or_cpu_run_does_not_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="treadle"):
        _trainer(pin=True)
        treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4),  # a CPU run, on any machine
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=1, progress=False,
                        strategy=ON_CPU)
    assert not any("pin_memory" in r.getMessage() for r in caplog.records)
