"""The run of the format-1 checkpoint fixture (tests/checkpoint/make_format1_fixture.py):
the same construction for the old code that saved it and the new code that resumes it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAVE_AT = 7  # mid-epoch (5 batches an epoch), inside an accumulation window of 2
TOTAL = 15


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_trainer(work_dir: Path, max_iters: int = TOTAL, **kw):
    import treadle

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))
    torch.manual_seed(0)
    return treadle.Trainer(
        DropNet(), work_dir=work_dir, train_dataloader=DataLoader(data, batch_size=8, shuffle=True),
        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="AdamW", lr=1e-2), max_iters=max_iters,
        accumulate=2, clip_grad=dict(max_norm=1.0), seed=0, log_writers=("jsonl",), progress=False,
        schedulers=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10)],
        checkpoint=dict(interval=SAVE_AT, by_epoch=False), log_interval=2, **kw)
