"""The runs of the old-format checkpoint fixtures (tests/checkpoint/make_format1_fixture.py,
make_format2_fixture.py): the same construction for the old code that saved them and the
new code that resumes them."""

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


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))


def make_trainer(work_dir: Path, max_iters: int = TOTAL, **kw):
    import treadle

    data = _data()
    torch.manual_seed(0)
    return treadle.Trainer(
        DropNet(), work_dir=work_dir, train_dataloader=DataLoader(data, batch_size=8, shuffle=True),
        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="AdamW", lr=1e-2), max_iters=max_iters,
        accumulate=2, clip_grad=dict(max_norm=1.0), seed=0, log_writers=("jsonl",), progress=False,
        schedulers=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10)],
        checkpoint=dict(interval=SAVE_AT, by_epoch=False), log_interval=2, **kw)


def strategy_loop(work_dir: Path, *, save_at: int | None = None, resume: Path | None = None,
                  total: int = TOTAL, strategy: str = "single"):
    """A hand-written loop through the Strategy API with the Trainer run's parts (dropout,
    AdamW, accumulation of 2, clipping, a warmup per iteration, a shuffled loader); saves
    at ``save_at`` with ``extra_ckpt={"iter": ...}``, or resumes ``resume`` first.
    Returns ``(strategy, model, optim_wrapper)`` after ``total`` iterations."""
    import treadle

    s = treadle.build_strategy(strategy, work_dir=work_dir, seed=0)
    torch.manual_seed(0)
    model, ow, scheds = s.prepare(
        DropNet(), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2), accumulative_counts=2,
                                      clip_grad=dict(max_norm=1.0)),
        param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10)])
    loader = s.prepare_dataloader(DataLoader(_data(), batch_size=8, shuffle=True))
    it = s.resume(resume)["iter"] if resume is not None else 0
    while it < total:
        for x, y in loader:
            x, y = x.to(s.device), y.to(s.device)
            with ow.optim_context(model):
                ow.update_params(nn.functional.cross_entropy(model(x), y))
            for sch in scheds:
                sch.step()
            it += 1
            if it == save_at:
                s.save_checkpoint(Path(work_dir) / f"iter_{it}", extra_ckpt={"iter": it})
            if it == total:
                break
    return s, model, ow


def computes_as_the_fixture(fixture: Path, here: Path) -> bool:
    """True when the checkpoint ``here``, saved at ``SAVE_AT`` by the same run on this
    machine, holds the fixture's weights bit for bit. CPU kernels give other last bits on
    another processor (an H100 host's, with torch 2.11, which computes the fixture's bits on
    this machine) or another torch release (2.6), and there a run resumed from the fixture
    cannot end at the bits of an uninterrupted run computed here, whatever the migration does."""
    saved = torch.load(fixture / "state.pt", weights_only=True)["model"]  # format 1 and 2: read as they are
    from treadle.checkpoint.weights import read_weights

    ours = read_weights(here)
    return set(ours) == set(saved) and all(torch.equal(v, saved[k]) for k, v in ours.items())


SKIP_REASON = ("this machine computes the fixture's first steps to other bits than the machine that saved it "
               "(another processor or torch release): a bit-exact continuation cannot be compared here")
