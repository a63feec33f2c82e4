"""Schedulers through the Trainer: the LR at every iteration against torch's own
schedulers and closed forms; per-epoch stepping; per-optimizer schedulers; ReduceOnPlateau
on validation metrics; LR scaling by batch size."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle

from support import TinyNet, make_data


class LrLog(treadle.Hook):
    priority = "LOWEST"  # after the scheduler hook: the lr the next iteration will use

    def __init__(self):
        self.lrs = []

    def before_train_iter(self, trainer, batch):
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def run(schedulers, *, epochs=None, iters=None, n=16, bs=4, **kw):
    log = LrLog()
    limit = {"max_epochs": epochs} if epochs else {"max_iters": iters}
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(n), batch_size=bs), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1, momentum=0.9), schedulers=schedulers, hooks=[log], **limit, **kw)
    t.fit()
    return log.lrs, t


def torch_sequence(make, steps_per_epoch, epochs, by_epoch):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = make(opt)
    out = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            if not by_epoch:
                sched.step()
        if by_epoch:
            sched.step()
    return out


def test_by_epoch_multistep_matches_torch():
    lrs, _ = run([dict(type="MultiStepLR", milestones=[1, 3], gamma=0.5)], epochs=4)
    ref = torch_sequence(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [1, 3], 0.5), 4, 4, by_epoch=True)
    assert lrs == pytest.approx(ref, rel=1e-12)


def test_iteration_cosine_matches_torch():
    lrs, _ = run([dict(type="CosineAnnealingLR", by_epoch=False, T_max=12, eta_min=0.001)], iters=12)
    ref = torch_sequence(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 12, 0.001), 12, 1, by_epoch=False)
    assert lrs == pytest.approx(ref, rel=1e-9)


def test_warmup_then_cosine_converted_to_iterations_closed_form():
    # 4 iterations per epoch, 5 epochs: linear warmup over epoch 0, cosine over epochs 1..5, per iteration.
    # MMEngine's LinearLR reaches end_factor on the window's last step: (end - begin - 1) increments.
    lrs, _ = run([dict(type="LinearLR", start_factor=0.1, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
                  dict(type="CosineAnnealingLR", by_epoch=True, begin=1, end=5, eta_min=0.0, convert_to_iter_based=True)],
                 epochs=5)
    expected = []
    for i in range(20):
        if i < 4:
            expected.append(0.1 * (0.1 + 0.9 * i / 3))
        else:
            expected.append(0.1 * 0.5 * (1 + math.cos(math.pi * (i - 4) / 16)))
    assert lrs == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_torch_scheduler_object_is_accepted_as_is():
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    log = LrLog()
    t = treadle.Trainer(model, train_dataloader=DataLoader(make_data(16), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=opt, schedulers=[sched], max_iters=6, hooks=[log])
    t.fit()
    assert log.lrs == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])  # stepped per iteration


def test_schedulers_per_optimizer_by_name():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.gen, self.disc = nn.Linear(6, 3), nn.Linear(6, 3)

        def train_step(self, batch, trainer):
            x, y = batch
            for name in ("gen", "disc"):
                trainer.optim_wrappers[name].update(nn.functional.cross_entropy(getattr(self, name)(x), y))
            return {}

    t = treadle.Trainer(Two(), train_dataloader=DataLoader(make_data(16), batch_size=4), max_epochs=2,
                        optimizer={"gen": dict(type="SGD", lr=1.0), "disc": dict(type="SGD", lr=1.0)},
                        schedulers={"gen": [dict(type="StepLR", step_size=1, gamma=0.5)]})
    t.fit()
    # stepped after epoch 0 only: with end=max_epochs the step after the last epoch is outside the window
    assert t.optim_wrappers["gen"].get_lr() == [0.5] and t.optim_wrappers["disc"].get_lr() == [1.0]


def test_reduce_on_plateau_steps_on_validation_metrics():
    class Const:  # a metric that never improves
        def reset(self): pass
        def update(self, o, t): pass
        def compute(self): return 1.0

    _, t = run([dict(type="ReduceOnPlateauLR", monitor="score", rule="greater", patience=0, factor=0.5, by_epoch=True)],
               epochs=4, val_dataloader=DataLoader(make_data(4), batch_size=4), metrics={"score": Const()})
    # MMEngine's rule: the epoch step runs before validation; the window ends at max_epochs.
    assert t.optimizer.param_groups[0]["lr"] < 0.1


def test_plateau_monitor_not_among_the_validation_results_names_those_there_are():
    with pytest.raises(ValueError, match=r"^ReduceOnPlateauLR monitor='accc': validation never produces 'val/accc'"):
        run([dict(type="ReduceOnPlateauLR", monitor="accc")], epochs=2,
            val_dataloader=DataLoader(make_data(4), batch_size=4), metrics={"acc": treadle.Accuracy()})
    with pytest.raises(KeyError, match=r"ReduceOnPlateauLR monitor='val/loss_x' is not among the validation results "
                                       r"\['acc', 'loss', 'val/acc', 'val/loss'\]"):
        run([dict(type="ReduceOnPlateauLR", monitor="val/loss_x")], epochs=2,
            val_dataloader=DataLoader(make_data(4), batch_size=4), metrics={"acc": treadle.Accuracy()})


def test_plateau_monitor_without_a_val_dataloader_is_warned_about(caplog):
    with caplog.at_level("WARNING", logger="treadle"):
        run([dict(type="ReduceOnPlateauLR", monitor="val/loss")], epochs=1)
    assert "ReduceOnPlateauLR monitor='val/loss' needs validation results, but there is no val_dataloader" in caplog.text


def test_unknown_scheduler_name_fails_at_construction(tmp_path):
    with pytest.raises(ValueError,
                       match=r"CosineAnealingLR.*Did you mean.*CosineAnnealingLR|CosineAnnealingLR.*CosineAnealingLR"):
        run([dict(type="CosineAnealingLR", T_max=3)], epochs=1, work_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_bad_scheduler_argument_names_it():
    with pytest.raises((ValueError, TypeError), match="gama"):
        run([dict(type="StepLR", step_size=1, gama=0.5)], epochs=1)


def test_auto_scale_lr_scales_by_total_batch(caplog):
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(16), batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, auto_scale_lr=dict(base_batch_size=32))
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 8 / 32)
    with pytest.raises(ValueError, match="auto_scale_lr"):
        treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(16), batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, auto_scale_lr=dict(base=32))


def test_auto_scale_happens_before_schedulers_record_initial_lr():
    lrs, _ = run([dict(type="StepLR", step_size=1, gamma=0.5, by_epoch=True)], epochs=2, bs=8,
                 auto_scale_lr=dict(base_batch_size=4))
    assert lrs == pytest.approx([0.2, 0.2, 0.1, 0.1])


@pytest.mark.parametrize("begin,expected", [(0, [0.1, 0.05, 0.025, 0.0125, 0.00625, 0.00625]),
                                            (2, [0.1, 0.1, 0.05, 0.025, 0.0125, 0.0125])])
def test_plateau_window_counts_training_epochs(begin, expected):
    """A metric that never improves, patience 0: the lr halves at every validation inside
    [begin, end), end being max_epochs. The window counts training epochs, as MMEngine's
    (the first validation in it only sets the best)."""
    class Const:
        def reset(self): pass
        def update(self, o, t): pass
        def compute(self): return 1.0

    lrs = []

    class AfterVal(treadle.Hook):
        priority = "LOWEST"

        def after_val(self, trainer, metrics):
            lrs.append(trainer.optimizer.param_groups[0]["lr"])

    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        val_dataloader=DataLoader(make_data(4), batch_size=4), metrics={"const": Const()},
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=6, hooks=[AfterVal()], progress=False,
                        schedulers=[dict(type="ReduceOnPlateauLR", monitor="val/const", rule="less", factor=0.5,
                                         patience=0, begin=begin)])
    t.fit()
    assert lrs == pytest.approx(expected, rel=1e-12)


class UpdateProtocol:
    """A scheduler of timm's protocol (tests/vision checks timm's own classes): it records how
    it is stepped, and its state is its calls."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def step_update(self, num_updates, metric=None):
        self.calls.append(["update", num_updates])

    def step(self, epoch, metric=None):
        self.calls.append(["epoch", epoch])

    def state_dict(self):
        return {"calls": [list(c) for c in self.calls]}

    def load_state_dict(self, state):
        self.calls = [list(c) for c in state["calls"]]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_scheduler_of_timms_protocol_gets_each_update_count_and_each_epoch_end(accumulate, tmp_path):
    sched = UpdateProtocol()
    _, t = run([sched], epochs=2, n=24, bs=4, accumulate=accumulate, work_dir=tmp_path)  # 6 batches an epoch
    per_epoch = 6 // accumulate
    expected = [c for e in range(2) for c in [["update", e * per_epoch + u] for u in range(1, per_epoch + 1)]
                + [["epoch", e + 1]]]
    assert sched.calls == expected
    state = torch.load(tmp_path / "checkpoints" / "epoch_0002" / "state.pt", weights_only=True)
    assert state["param_schedulers"] == [{"calls": expected}]  # its state is in the checkpoint


def test_a_scheduler_with_step_but_no_step_update_is_refused_naming_the_protocol():
    class StepOnly:
        def step(self): ...
        def state_dict(self): return {}
        def load_state_dict(self, state): ...

    with pytest.raises(TypeError, match=r"^schedulers\[0\]: expected a config dict, a treadle ParamScheduler, a torch "
                                        r"LRScheduler or a scheduler of timm's protocol \(step_update, step"):
        run([StepOnly()], iters=1)
