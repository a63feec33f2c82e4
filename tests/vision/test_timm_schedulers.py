"""timm's schedulers in ``schedulers=``: stepped as timm's training script steps them, resumed exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import treadle

from faults import StopAt

timm_scheduler = pytest.importorskip("timm.scheduler")

EPOCHS, BATCHES = 3, 6
HERE = Path(__file__).resolve().parent


def make_scheduler(optimizer, kind: str):
    """A timm scheduler: by updates (``t_in_epochs=False``, warmup and noise) or by epochs."""
    if kind == "updates":
        return timm_scheduler.CosineLRScheduler(optimizer, t_initial=EPOCHS * BATCHES, warmup_t=3, warmup_lr_init=1e-4,
                                                lr_min=1e-3, t_in_epochs=False, noise_range_t=(5, 12), noise_seed=7)
    return timm_scheduler.StepLRScheduler(optimizer, decay_t=1, decay_rate=0.5, warmup_t=1, warmup_lr_init=0.01)


def timm_reference(kind: str, accumulate: int, epochs: int = EPOCHS) -> list[float]:
    """The lr of each iteration under timm's own training loop (timm's train.py): after each
    optimizer update ``num_updates += 1; step_update(num_updates)``, after each epoch
    ``step(epoch + 1)``."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = make_scheduler(opt, kind)
    lrs, num_updates = [], 0
    for epoch in range(epochs):
        for batch_idx in range(BATCHES):
            lrs.append(opt.param_groups[0]["lr"])
            if (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == BATCHES:
                num_updates += 1
                sched.step_update(num_updates=num_updates)
        sched.step(epoch + 1)
    return lrs


class RecordLR(treadle.Hook):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def before_train_iter(self, trainer, batch) -> None:
        self.lrs.append(trainer.optim_wrappers["default"].get_lr()[0])


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 5, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(BATCHES)]


def trainer(tmp_path, kind: str, accumulate: int = 1, hooks=(), **kw) -> tuple[treadle.Trainer, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=data(), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=opt, schedulers=[make_scheduler(opt, kind)], max_epochs=EPOCHS, accumulate=accumulate,
                        hooks=list(hooks), progress=False, seed=0, log_interval=2, **kw)
    return t, model


@pytest.mark.parametrize("kind, accumulate", [("updates", 1), ("updates", 2), ("epochs", 1)])
def test_a_timm_scheduler_is_stepped_as_timms_training_script_steps_it(tmp_path, kind, accumulate):
    record = RecordLR()
    t, _ = trainer(tmp_path, kind, accumulate, hooks=[record])
    t.fit()
    assert record.lrs == pytest.approx(timm_reference(kind, accumulate), rel=1e-12)
    assert len(set(record.lrs)) >= 3  # the schedule moved (warmup, decay, noise)


@pytest.mark.parametrize("kind, accumulate", [("updates", 2), ("epochs", 1)])
def test_a_run_resumed_inside_an_epoch_has_the_uninterrupted_runs_rates_and_weights(tmp_path, kind, accumulate):
    ref_record = RecordLR()
    ref, ref_model = trainer(tmp_path / "ref", kind, accumulate, hooks=[ref_record])
    ref.fit()
    stopped, _ = trainer(tmp_path / "run", kind, accumulate, hooks=[StopAt(9)])  # inside epoch 2, a window open
    stopped.fit()
    record = RecordLR()
    resumed, model = trainer(tmp_path / "run", kind, accumulate, hooks=[record], resume=True)
    resumed.fit()
    assert record.lrs == ref_record.lrs[9:]
    for (name, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    (sched,) = resumed.strategy.param_schedulers
    (ref_sched,) = ref.strategy.param_schedulers
    assert sched.state_dict() == ref_sched.state_dict()


def test_timms_plateau_scheduler_is_refused_in_one_line(tmp_path):
    model = nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(Warning):  # timm deprecates it
        plateau = timm_scheduler.PlateauLRScheduler(opt)
    with pytest.raises(TypeError, match=r"^schedulers\[0\] \(PlateauLRScheduler\): timm's PlateauLRScheduler steps "
                                        r"on a metric .*ReduceOnPlateauLR"):
        treadle.Trainer(model, train_dataloader=data(), loss_fn=nn.CrossEntropyLoss(), optimizer=opt,
                        schedulers=[plateau], max_epochs=1, progress=False)


@pytest.mark.slow
def test_sigkill_inside_an_epoch_then_resume_gives_the_uninterrupted_weights(tmp_path):
    """The run of timm_run.py killed with SIGKILL after a checkpoint inside its second epoch, then
    resumed with resume=True, ends with the weights and the rates of the run never killed."""
    def run(work, *args):
        return subprocess.run([sys.executable, str(HERE / "timm_run.py"), str(work), *args], capture_output=True,
                              text=True, timeout=300)

    ref = run(tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    killed = run(tmp_path / "run", "--kill-at", "9")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run(tmp_path / "run", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = torch.load(tmp_path / "ref" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "final.pt", weights_only=True)
    assert a["lrs"][8:] == b["lrs"]  # the resumed run starts after the checkpoint of iteration 8
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert os.path.isdir(tmp_path / "run" / "checkpoints" / "iter_00000008")
