"""EMA: the pycls momentum formula, averaging against a hand-written reference,
copying before start, the update interval, and validation with the averaged weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.ema import EMAHook
from treadle.optim.ema import ExponentialMovingAverage, momentum_from_alpha
from treadle.seeding import seed_everything

from support import FUSED, TinyNet, make_data, to_device


def test_momentum_from_alpha_worked_example():
    # basecls: alpha 1e-5, total batch 1024, 100 epochs, update every 32 iterations -> 0.996723175,
    # which is the float32 value of the exact 1 - 1e-5 * 1024 / 100 * 32 = 0.9967232.
    m = momentum_from_alpha(1e-5, 1024, 100, 32)
    assert m == pytest.approx(1 - 1e-5 * 1024 / 100 * 32, abs=1e-15)
    assert torch.tensor(m, dtype=torch.float32).item() == pytest.approx(0.996723175, abs=1e-9)
    assert momentum_from_alpha(1.0, 1024, 1, 32) == 0.0  # clamped at 0
    with pytest.raises(ValueError, match="momentum_from_alpha"):
        momentum_from_alpha(1e-5, 0, 100, 32)


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x))))


def reference_run(model, data, *, momentum, interval, start, epochs, lr=0.1):
    """The hand-written loop with basecls' EMA rule: copy before start, then average.
    On DEVICE, as the Trainer runs, with the SGD kernel treadle's config gives there
    (fused on CUDA, treadle/optim/builder.py)."""
    seed_everything(0)
    model = to_device(model)
    ema = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, **FUSED)
    it = 0
    for _ in range(epochs):
        for x, y in DataLoader(data, batch_size=4, generator=torch.Generator()):
            x, y = to_device((x, y))
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if (it + 1) % interval == 0:
                with torch.no_grad():
                    for e, p in zip([*ema.parameters(), *ema.buffers()], [*model.parameters(), *model.buffers()]):
                        if not e.is_floating_point():
                            e.copy_(p)
                        elif it < start:
                            e.copy_(p)
                        else:
                            e.mul_(momentum).add_(p, alpha=1 - momentum)
            it += 1
    return ema


@pytest.mark.parametrize("interval,start", [(1, 0), (3, 5)])
def test_ema_equals_hand_written_reference_bitwise(interval, start):
    data = make_data(24)
    torch.manual_seed(1)
    model = BNNet()
    ref_model = copy.deepcopy(model)
    t = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=2, seed=0,
                        ema=dict(momentum=0.9, interval=interval, start=start))
    t.fit()
    ref = reference_run(ref_model, data, momentum=0.9, interval=interval, start=start, epochs=2)
    for (name, a), b in zip(t.ema.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name  # BatchNorm running stats included
    assert not torch.equal(t.ema.fc.weight, model.fc.weight)


def test_validation_uses_ema_weights_and_restores_the_model():
    data = make_data(16)
    val = DataLoader(make_data(8, seed=4), batch_size=8)
    torch.manual_seed(0)
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(data, batch_size=4), val_dataloader=val,
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.5), max_epochs=2,
                        ema=dict(momentum=0.5))
    t.fit()
    live = copy.deepcopy(t.module.state_dict())
    res = t.validate()
    x, y = to_device(val.dataset.tensors)  # where the model trained
    with torch.no_grad():
        ema_loss = nn.functional.cross_entropy(t.ema(x), y).item()
        live_loss = nn.functional.cross_entropy(t.module(x), y).item()
    assert res["val/loss"] == pytest.approx(ema_loss, rel=1e-6)
    assert res["val/loss"] != pytest.approx(live_loss, rel=1e-6)
    assert all(torch.equal(live[k], v) for k, v in t.module.state_dict().items())  # swapped back


def test_use_for_val_false_validates_the_live_model():
    val = DataLoader(make_data(8, seed=4), batch_size=8)
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(16), batch_size=4), val_dataloader=val,
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.5), max_epochs=1,
                        ema=dict(momentum=0.5, use_for_val=False))
    t.fit()
    x, y = to_device(val.dataset.tensors)  # where the model trained
    with torch.no_grad():
        live_loss = nn.functional.cross_entropy(t.module(x), y).item()
    assert t.validate()["val/loss"] == pytest.approx(live_loss, rel=1e-6)


def test_ema_updates_only_on_optimizer_steps_with_accumulation():
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(32), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, accumulate=4, ema=dict(momentum=0.9))
    t.fit()
    hook = next(h for h in t.hooks if isinstance(h, EMAHook))
    assert hook.ema.num_updates == 2  # 8 iterations, a step every 4


def test_ema_state_round_trips_through_hook_state():
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(16), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, ema=dict(momentum=0.8))
    t.fit()
    hook = next(h for h in t.hooks if isinstance(h, EMAHook))
    state = hook.state_dict()
    fresh = EMAHook(momentum=0.8)
    fresh.load_state_dict(state)  # before the model is known: kept until the first run
    fresh._ensure(t)
    for a, b in zip(fresh.ema.module.state_dict().values(), t.ema.state_dict().values()):
        assert torch.equal(a, b)


def test_alpha_sets_momentum_from_the_run():
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(16), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=2, ema=dict(alpha=1e-3, interval=2))
    t.fit()
    hook = next(h for h in t.hooks if isinstance(h, EMAHook))
    assert hook.momentum == pytest.approx(momentum_from_alpha(1e-3, 4, 2, 2))


@pytest.mark.parametrize("cfg,match", [
    (dict(momentum=1.5), r"momentum must be in \[0, 1\]"),
    (dict(interval=0), r"interval must be an int >= 1"),
    (dict(decay=0.9),
     r'ema\.decay: unknown key for ema \(got 0\.9\); expected one of momentum, interval, start, alpha, use_for_val, '
     r'convention, gamma, start_iter'),
    (dict(momentum=0.9, alpha=1e-5), r"momentum or alpha, not both"),
    (dict(momentum="0.9"), r"ema momentum='0.9' is not a number; expected a float in \[0, 1\]"),
    (dict(momentum=None), r"ema momentum=None is not a number"),
    (dict(momentum=float("nan")), r"momentum must be in \[0, 1\]"),
    (dict(alpha=-1.0), r"ema alpha=-1.0 is out of range; expected a finite float >= 0"),
    (dict(alpha=float("inf")), r"ema alpha=inf is out of range"),
    (dict(alpha="x"), r"ema alpha='x' is not a number; expected a float >= 0"),
    (dict(use_for_val="no"), r"ema use_for_val='no'; expected True .* or False"),
])
def test_bad_ema_config(cfg, match, tmp_path):
    """Every bad value fails at construction, before training (alpha= used to fail at fit())."""
    with pytest.raises((ValueError, TypeError), match=match):
        treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, ema=cfg, work_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_average_object_directly():
    m = nn.Linear(2, 2)
    avg = ExponentialMovingAverage(m, momentum=0.5)
    with torch.no_grad():
        m.weight.add_(2.0)
    before = avg.module.weight.clone()
    avg.update(m)
    assert torch.equal(avg.module.weight, before * 0.5 + m.weight * 0.5)
    assert not avg.module.weight.requires_grad
