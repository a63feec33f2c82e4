"""Building components and the Trainer from a resolved config."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

import support
from treadle import Trainer
from treadle.config import ConfigError, build_component, build_dataloader, build_hook, build_trainer, resolve_config
from treadle.config.assemble import _explain
from treadle.components.build import build_model
from treadle.components.build import check_optimizer, check_schedulers
from treadle.hooks.early_stopping import EarlyStoppingHook

TINY = {
    "model": {"type": "support.TinyNet"},
    "train_dataloader": {"dataset": {"type": "support.make_data", "n": 16}, "batch_size": 8, "shuffle": True},
    "val_dataloader": {"dataset": {"type": "support.make_data", "n": 8, "seed": 1}, "batch_size": 8},
    "loss_fn": {"type": "CrossEntropyLoss"},
    "optimizer": {"type": "SGD", "lr": 0.1},
    "max_epochs": 1,
    "metrics": {"acc": {"type": "Accuracy"}},
    "hooks": [{"type": "EarlyStoppingHook", "monitor": "val/acc", "patience": 2, "priority": "HIGH"}],
}


def cfg(**changes):
    return resolve_config({**TINY, **changes}, mode="train")


def test_build_trainer_from_config():
    trainer = build_trainer(cfg())
    assert isinstance(trainer, Trainer) and isinstance(trainer.module, support.TinyNet)
    assert isinstance(trainer.loss_fn, nn.CrossEntropyLoss)
    assert isinstance(trainer.train_dataloader.sampler, RandomSampler)
    assert trainer.train_dataloader.batch_size == 8
    assert isinstance(trainer.optimizer, torch.optim.SGD) and trainer.optimizer.param_groups[0]["lr"] == 0.1
    stop = [h for h in trainer.hooks if isinstance(h, EarlyStoppingHook)]
    assert len(stop) == 1 and stop[0].patience == 2 and stop[0].priority == "HIGH"
    assert trainer.fit()["val/acc"] >= 0


def test_seed_makes_initial_weights_repeat():
    a = build_trainer(cfg(seed=3)).module.fc1.weight
    b = build_trainer(cfg(seed=3)).module.fc1.weight
    c = build_trainer(cfg(seed=4)).module.fc1.weight
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_component_arguments_are_checked_before_the_call():
    with pytest.raises(ConfigError) as e:
        build_component({"type": "support.TinyNet", "dimm": 4}, "model", "model")
    assert str(e.value) == ("model.dimm: unknown argument for TinyNet (got 4); expected arguments among dim, classes, "
                            "dropout. Did you mean 'dim'?")
    with pytest.raises(ConfigError, match=r"model: missing required argument\(s\) in_features, out_features for Linear"):
        build_component({"type": "torch.nn.Linear"}, "model", "model")
    with pytest.raises(ConfigError, match=r"model.type: missing required key"):
        build_component({"dim": 4}, "model", "model")


def test_constructor_failures_name_the_key():
    with pytest.raises(ConfigError) as e:
        build_component({"type": "digits", "split": "test"}, "dataset", "val_dataloader.dataset")
    assert str(e.value) == ("val_dataloader.dataset: digits_dataset(split='test') failed: ValueError: split must be "
                            "'train' or 'val', got 'test'")


def test_bare_names_and_loss_functions():
    assert isinstance(build_component("MSELoss", "loss", "loss_fn"), nn.MSELoss)
    fn = build_component("torch.nn.functional.cross_entropy", "loss", "loss_fn")
    assert fn is torch.nn.functional.cross_entropy


def test_dataloader():
    loader = build_dataloader({"dataset": {"type": "support.make_data", "n": 10}, "batch_size": 4, "drop_last": True,
                               "collate_fn": "torch.utils.data.default_collate"}, "val_dataloader")
    assert isinstance(loader, DataLoader) and isinstance(loader.sampler, SequentialSampler) and len(loader) == 2
    with pytest.raises(ConfigError, match=r"val_dataloader.dataset: missing required key"):
        build_dataloader({"batch_size": 4}, "val_dataloader")
    with pytest.raises(ConfigError, match=r"val_dataloader.num_workers: out of range \(got -1\)"):
        build_dataloader({"dataset": "support.make_data", "num_workers": -1}, "val_dataloader")
    with pytest.raises(ConfigError, match=r"val_dataloader.collate_fn: cannot import it"):
        build_dataloader({"dataset": "support.make_data", "collate_fn": "nope.fn"}, "val_dataloader")


def test_hooks():
    hook = build_hook({"type": "NaNGuardHook", "mode": "skip", "priority": 5}, "hooks[0]")
    assert hook.mode == "skip" and hook.priority == 5
    with pytest.raises(ConfigError, match=r"hooks\[0\].priority: unknown hook priority 'URGENT'"):
        build_hook({"type": "NaNGuardHook", "priority": "URGENT"}, "hooks[0]")
    with pytest.raises(ConfigError, match=r"hooks\[1\].type: is added by the Trainer when `schedulers` is set"):
        build_hook({"type": "ParamSchedulerHook"}, "hooks[1]")
    with pytest.raises(ConfigError, match=r"hooks\[0\]: built a TinyNet, not a treadle.Hook"):
        build_hook({"type": "support.TinyNet"}, "hooks[0]")
    with pytest.raises(ConfigError, match=r"hooks\[0\]: EarlyStoppingHook\(patience=0\) failed: ValueError: patience"):
        build_hook({"type": "EarlyStoppingHook", "patience": 0}, "hooks[0]")


@pytest.mark.parametrize("spec, message", [
    ({"type": "SDG", "lr": 0.1}, "optimizer.type: unknown optimizer type (got 'SDG')"),
    ({"lr": 0.1}, "optimizer.type: missing required key"),
    ({"type": "SGD", "lr": -0.1}, "optimizer.lr: out of range (got -0.1); expected a number >= 0"),
    ({"type": "SGD", "lr": "fast"}, "optimizer.lr: wrong type str (got 'fast'); expected a number >= 0"),
    ({"type": "AdamW", "lr": 0.1, "betas": [0.9, 1.5]}, "optimizer.betas: out of range (got [0.9, 1.5])"),
    ({"type": "AdamW", "lr": 0.1, "momentum": 0.9}, "optimizer.momentum: unknown argument for AdamW (got 0.9)"),
    ({"type": "support.TinyNet"}, "optimizer.type: is not a torch.optim.Optimizer subclass"),
    ({"gen": {"type": "Adam", "lr": -1}}, "optimizer.gen.lr: out of range (got -1)"),
])
def test_optimizer_checks(spec, message):
    with pytest.raises(ConfigError) as e:
        check_optimizer(spec)
    assert str(e.value).startswith(message)


def test_optimizer_and_schedulers_pass_through_unchanged():
    c = cfg(optimizer={"type": "AdamW", "lr": 0.01, "paramwise": {"bias_decay_mult": 0.0}, "weight_decay": 0.1},
            schedulers=[{"type": "LinearLR", "start_factor": 0.5, "by_epoch": False, "end": 2}])
    before = {k: v for k, v in c.items()}
    trainer = build_trainer(c)
    assert c == before  # the config is not consumed
    assert len(trainer.optimizer.param_groups) == 2  # paramwise reached the Trainer's builder


@pytest.mark.parametrize("spec, names, message", [
    ([{"type": "CosineAnealingLR"}], None, "schedulers[0].type: unknown scheduler type (got 'CosineAnealingLR'); "
                                           "expected a name of treadle.optim.scheduler_builder.SCHEDULERS"),
    ([{"type": "LinearLR", "start_factr": 0.1}], None, "schedulers[0].start_factr: unknown argument for LinearLR"),
    ([{"begin": 0}], None, "schedulers[0]: not a scheduler spec"),
    ({"gen": [{"type": "StepLR", "step_size": 1}], "dis": []}, ["gen", "disc"],
     "schedulers.dis: is not an optimizer name (got []); expected a mapping by optimizer name (gen, disc) or a list. "
     "Did you mean 'disc'?"),
    ({"gen": [{"type": "StepLR", "stepsize": 1}]}, ["gen"], "schedulers.gen[0].stepsize: unknown argument for StepLR"),
])
def test_scheduler_checks(spec, names, message):
    with pytest.raises(ConfigError) as e:
        check_schedulers(spec, names)
    assert str(e.value).startswith(message)


def test_mmengine_scope_prefix_and_torch_schedulers_are_accepted():
    check_schedulers([{"type": "mmengine.LinearLR"}, {"type": "torch.optim.lr_scheduler.ExponentialLR", "gamma": 0.9}],
                     None)


def test_trainer_errors_become_config_errors():
    with pytest.raises(ConfigError, match=r"^strategy: strategy 'ddp': bad options \['bucket'\]"):
        build_trainer(cfg(strategy={"type": "ddp", "bucket": 3}))
    with pytest.raises(ConfigError, match=r"^resume='/no/such/ckpt': no such checkpoint"):
        build_trainer(cfg(resume="/no/such/ckpt"))
    with pytest.raises(ConfigError, match=r"^schedulers\[0\] \(LinearLR\): `begin` must be smaller than `end`"):
        build_trainer(cfg(schedulers=[{"type": "LinearLR", "begin": 5, "end": 2}]))
    with pytest.raises(ConfigError, match=r"^ema: give momentum or alpha, not both"):
        build_trainer(cfg(ema={"momentum": 0.9, "alpha": 1e-5}))


def test_trainer_error_messages_keep_their_quotes():
    # Only a KeyError's quoting (its str() is the repr of the message) is taken off.
    with pytest.raises(ConfigError) as info:
        build_trainer(cfg(ema={"momentum": "0.9"}))
    assert str(info.value) == "ema momentum='0.9' is not a number; expected a float in [0, 1] such as 0.9998"
    with pytest.raises(ConfigError) as info:
        build_trainer(cfg(schedulers=[{"type": "StepLR", "step_size": "2"}]))
    assert str(info.value) == "schedulers[0] (StepLR): `step_size`='2' has the wrong type (str); expected a number"
    assert str(_explain(KeyError("checkpoint best='x' is missing"), {})) == "checkpoint best='x' is missing"
    assert str(_explain(TypeError("'<=' not supported between 'str' and 'int'"), {})) == \
        "TypeError: '<=' not supported between 'str' and 'int'"


def test_validate_mode_builds_only_what_evaluation_needs():
    c = resolve_config({**TINY, "train_dataloader": {"dataset": {"type": "no.such.Dataset"}}}, mode="validate")
    trainer = build_trainer(c, "validate")  # the broken training loader is not built
    assert trainer.train_dataloader is None and trainer.optim_wrappers == {}
    assert set(trainer.validate()) == {"val/loss", "val/acc"}


class WithInit(torch.nn.Module):
    """An mmcv-style model: its weights are set by init_weights(), not by the constructor."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.fail = fail

    def init_weights(self):
        if self.fail:
            raise OSError("no pretrained weights offline")
        torch.nn.init.constant_(self.fc.weight, 0.5)


def test_init_weights_is_called_only_when_asked_and_the_log_says_so(caplog):
    """A built model keeps the weights its constructor made (a model zoo's pretrained
    ones); init_weights=True (an MMEngine config sets it) calls init_weights(), as
    MMEngine's runner does, for a config dict or an object alike."""
    model = build_model({"type": WithInit})
    assert not torch.equal(model.fc.weight, torch.full((2, 2), 0.5))  # the constructor's weights
    kept = Trainer(model={"type": WithInit}, progress=False)
    assert not torch.equal(kept.module.fc.weight.cpu(), torch.full((2, 2), 0.5))
    with caplog.at_level("INFO", logger="treadle"):
        trainer = Trainer(model={"type": WithInit}, init_weights=True, progress=False)
    assert torch.equal(trainer.module.fc.weight, torch.full((2, 2), 0.5, device=support.DEVICE))  # and placed
    assert "init_weights: called WithInit.init_weights()" in caplog.text
    assert torch.equal(Trainer(WithInit(), init_weights=True, progress=False).module.fc.weight.cpu(),
                       torch.full((2, 2), 0.5))
    with pytest.raises(ConfigError, match=r"model: WithInit.init_weights\(\) failed: OSError: no pretrained weights"):
        Trainer(model={"type": WithInit, "fail": True}, init_weights=True, progress=False)
    caplog.clear()
    with caplog.at_level("INFO", logger="treadle"):
        Trainer(torch.nn.Linear(2, 2), init_weights=True, progress=False)
    # Said, not warned: an MMEngine config sets it for every model, and MMEngine does nothing either.
    assert [(r.levelname, r.getMessage()) for r in caplog.records if "init_weights" in r.getMessage()] == [
        ("INFO", "init_weights: Linear has no init_weights(): its constructor's weights stand, as under MMEngine's "
                 "runner")]
