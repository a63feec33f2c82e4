"""Strategy.prepare beyond one optimizer: several wrappers by name with their schedulers,
auto_scale_lr, and the evaluation module (treadle/strategies/api.py). The Trainer builds
its model and optimizers through the same call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import treadle
from support import DEVICE
from treadle.optim.schedulers import LinearLR


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = nn.Linear(4, 4)
        self.disc = nn.Linear(4, 1)


def _prepare(work_dir=None):
    s = treadle.build_strategy("single", work_dir=work_dir, seed=0)
    torch.manual_seed(0)
    model, ows, scheds = s.prepare(
        GAN(), optim_wrapper={"gen": dict(optimizer=dict(type="Adam", lr=1e-3)),
                              "disc": dict(optimizer=dict(type="SGD", lr=0.1), accumulative_counts=2)},
        param_scheduler={"gen": [dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=4)],
                         "disc": []})
    return s, model, ows, scheds


def _steps(model, ows, scheds, n):
    for _ in range(n):
        x = torch.randn(8, 4, device=DEVICE)  # where "single" placed the model
        ows["gen"].update_params(model.disc(model.gen(x)).mean())
        ows["disc"].update_params(model.disc(x).pow(2).mean())
        for s in scheds["gen"]:
            s.step()


def test_several_wrappers_by_name_optimize_their_submodules():
    s, model, ows, scheds = _prepare()
    assert set(ows) == {"gen", "disc"} and s.optim_wrappers is ows
    assert {id(p) for g in ows["gen"].param_groups for p in g["params"]} == {id(p) for p in model.gen.parameters()}
    assert isinstance(ows["disc"].optimizer, torch.optim.SGD) and ows["disc"].accumulate == 2
    assert isinstance(scheds["gen"][0], LinearLR) and scheds["disc"] == []
    assert ows["gen"].get_lr() == [pytest.approx(5e-4)]  # the warmup's start factor


def test_several_wrappers_save_and_resume_exactly(tmp_path):
    s, model, ows, scheds = _prepare(tmp_path)
    torch.manual_seed(1)
    _steps(model, ows, scheds, 3)  # disc's window of 2 is open after 3 steps
    s.save_checkpoint(tmp_path / "ckpt")
    _steps(model, ows, scheds, 3)
    want = {k: v.clone() for k, v in model.state_dict().items()}

    s2, model2, ows2, scheds2 = _prepare(tmp_path)
    s2.resume(tmp_path / "ckpt")
    _steps(model2, ows2, scheds2, 3)
    assert all(torch.equal(model2.state_dict()[k], v) for k, v in want.items())
    assert ows2["gen"].get_lr() == ows["gen"].get_lr()


def test_named_schedulers_must_name_the_wrappers():
    s = treadle.build_strategy("single", seed=0)
    with pytest.raises(ValueError, match=r"schedulers keys \['generator'\] must name optimizers \['disc', 'gen'\]"):
        s.prepare(GAN(), optim_wrapper={"gen": dict(optimizer=dict(type="SGD", lr=0.1)),
                                        "disc": dict(optimizer=dict(type="SGD", lr=0.1))},
                  param_scheduler={"generator": []})


def test_a_named_config_needs_a_submodule_of_that_name():
    with pytest.raises(ValueError, match=r"optimizer\['critic'\] is a config, so the model needs a submodule"):
        treadle.build_strategy("single").prepare(GAN(), optim_wrapper={"critic": dict(optimizer=dict(type="SGD", lr=0.1))})


def test_auto_scale_lr_scales_before_the_schedulers_record_it():
    s = treadle.build_strategy("single", seed=0)
    _, ow, scheds = s.prepare(nn.Linear(2, 2), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
                              param_scheduler=[dict(type="ConstantLR", factor=0.5, by_epoch=False, end=2)],
                              auto_scale_lr=dict(base_batch_size=64), dispatch_kwargs=dict(train_micro_batch_size_per_gpu=16))
    assert ow.get_lr() == [pytest.approx(0.1 * 16 / 64 * 0.5)]
    assert scheds[0].base_values == [pytest.approx(0.1 * 16 / 64)]  # the scaled lr is the schedule's base


def test_auto_scale_lr_needs_the_batch():
    with pytest.raises(ValueError, match="auto_scale_lr needs a positive int base_batch_size"):
        treadle.build_strategy("single").prepare(nn.Linear(2, 2), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
                                                 auto_scale_lr=dict(base_batch_size=64))


def test_the_eval_module_is_the_prepared_model_on_one_process():
    s = treadle.build_strategy("single")
    model = s.prepare(nn.Linear(2, 2))
    assert s.eval_module is model and s.module is model


def test_the_trainer_builds_through_prepare(monkeypatch):
    """The Trainer's optimizer, precision, accumulate and clip_grad reach prepare as one
    optim_wrapper dict, and its schedulers as param_scheduler."""
    from treadle.strategies.api import StrategyAPI

    seen = {}
    original = StrategyAPI.prepare

    def spy(self, model, **kw):
        seen.update(kw)
        return original(self, model, **kw)

    monkeypatch.setattr(StrategyAPI, "prepare", spy)
    data = [(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))]
    t = treadle.Trainer(nn.Linear(2, 2), train_dataloader=data, loss_fn=nn.CrossEntropyLoss(), max_iters=1,
                        optimizer=dict(type="SGD", lr=0.1), accumulate=2, clip_grad=dict(max_norm=1.0),
                        precision="bf16", schedulers=[dict(type="ConstantLR", factor=0.5, by_epoch=False)],
                        log_writers=(), progress=False)
    assert seen["optim_wrapper"] == {"optimizer": dict(type="SGD", lr=0.1), "accumulative_counts": 2,
                                     "clip_grad": {"max_norm": 1.0}, "dtype": "bfloat16"}
    assert seen["param_scheduler"] == [dict(type="ConstantLR", factor=0.5, by_epoch=False)]
    assert t.optim_wrappers is t.strategy.optim_wrappers and t.model is t.strategy.model
    assert t.optim_wrapper.precision == "bf16" and t.optim_wrapper.accumulate == 2


def test_dispatch_kwargs_epoch_length_and_max_epochs_give_schedulers_their_length():
    """MMEngine's runner passes epoch_length and max_epochs; an iteration-based scheduler
    without `end` then runs over epoch_length x max_epochs iterations (as given max_iters)."""
    lrs = {}
    for how, dispatch in (("derived", dict(epoch_length=16, max_epochs=3)), ("given", dict(max_iters=48))):
        s = treadle.build_strategy("single", seed=0)
        _, ow, (sched,) = s.prepare(torch.nn.Linear(8, 8), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
                                    param_scheduler=[dict(type="CosineAnnealingLR", by_epoch=False)],
                                    dispatch_kwargs=dispatch)
        assert sched.end == 48
        seen = []
        for _ in range(48):
            seen.append(ow.get_lr()[0])
            ow.optimizer.step()
            sched.step()
        lrs[how] = seen
    assert lrs["derived"] == lrs["given"] and lrs["derived"][0] == 0.1 and lrs["derived"][-1] < 1e-3
