"""The registries (plain dicts per kind), dotted import paths, and names for saving."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import support
from treadle.config import ConfigError, HOOKS, LOSSES, OPTIMIZERS, SCHEDULERS, resolve_type
from treadle.components.registry import DATASETS, MODELS, name_of
from treadle.config.resolve import to_plain
from treadle.hooks.base import Hook
from treadle.optim import scheduler_builder


def test_registries_are_plain_dicts_of_the_real_classes():
    assert set(HOOKS) == {"LoggerHook", "IterTimerHook", "EMAHook", "ParamSchedulerHook", "CheckpointHook",
                          "NaNGuardHook", "EarlyStoppingHook", "ProfilerHook", "ModelSummaryHook", "RuntimeEnvHook",
                          "SyncBuffersHook", "PreciseBNHook"}
    assert all(issubclass(cls, Hook) for cls in HOOKS.values())
    torch_optimizers = {n for n, c in vars(torch.optim).items()
                        if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    assert set(OPTIMIZERS) == torch_optimizers and OPTIMIZERS["AdamW"] is torch.optim.AdamW
    assert SCHEDULERS is scheduler_builder.SCHEDULERS  # the Trainer's own table, not a copy
    assert LOSSES["CrossEntropyLoss"] is nn.CrossEntropyLoss and LOSSES["MSELoss"] is nn.MSELoss


def test_example_components_load_from_their_files():
    cnn = resolve_type("model", "DigitsCNN", "model.type")
    assert cnn.__name__ == "DigitsCNN" and issubclass(cnn, nn.Module)
    assert resolve_type("model", "RingGAN", "model.type").__name__ == "RingGAN"
    train = resolve_type("dataset", "digits", "dataset.type")(split="train")
    assert train[0][0].shape == (1, 8, 8)
    assert len(resolve_type("dataset", "gaussian_ring", "dataset.type")(n=10)) == 10
    assert set(MODELS) == {"DigitsCNN", "RingGAN"} and set(DATASETS) == {"digits", "gaussian_ring"}


def test_dotted_paths():
    assert resolve_type("model", "support.TinyNet", "model.type") is support.TinyNet
    assert resolve_type("loss", "torch.nn.functional.cross_entropy", "loss_fn") is torch.nn.functional.cross_entropy
    assert resolve_type("model", support.TinyNet, "model.type") is support.TinyNet  # Python configs pass classes


@pytest.mark.parametrize("kind, name, message", [
    ("model", "TinyNett", "model.type: unknown model type (got 'TinyNett'); expected a registered name "
                          "(DigitsCNN, RingGAN) or a dotted import path such as my_pkg.models.Net"),
    ("hook", "EarlyStopingHook", "Did you mean 'EarlyStoppingHook'?"),
    ("loss", "crossentropyloss", "Did you mean 'CrossEntropyLoss'"),
    ("optimizer", "Adamw", "Did you mean 'AdamW'"),
    ("model", "my_pkg.models.Net", "model.type: cannot import 'my_pkg.models.Net': no module named 'my_pkg'"),
    ("model", "support.NoSuchNet", "cannot import 'support.NoSuchNet'"),
    ("model", 3, "model.type: a model type must be a name or a dotted import path (got 3)"),
])
def test_unknown_types(kind, name, message):
    with pytest.raises(ConfigError) as e:
        resolve_type(kind, name, "model.type")
    assert message in str(e.value)


def test_names_for_saving():
    assert name_of(torch.optim.AdamW) == "AdamW"
    assert name_of(nn.CrossEntropyLoss) == "CrossEntropyLoss"
    assert name_of(resolve_type("model", "DigitsCNN", "x")) == "DigitsCNN"
    assert name_of(support.TinyNet) == "support.TinyNet"

    class Local(nn.Module):
        pass

    with pytest.raises(ConfigError, match="has no importable name"):
        name_of(Local)
    InConfig = type("Net", (nn.Module,), {"__module__": "treadle_config_cfg"})  # as a .py config defines it
    with pytest.raises(ConfigError, match=r"^Net, defined in the config file cfg\.py, cannot be written into "
                                          r"config\.yaml .*expected Net defined in an importable module beside"):
        name_of(InConfig)


def test_to_plain_names_types_only():
    cfg = {"model": {"type": support.TinyNet, "dim": 6}, "optimizer": {"type": torch.optim.SGD, "lr": 0.1},
           "workflow": (("train", 1),), "loss_fn": torch.nn.functional.cross_entropy}
    assert to_plain(cfg) == {"model": {"type": "support.TinyNet", "dim": 6}, "optimizer": {"type": "SGD", "lr": 0.1},
                             "workflow": [["train", 1]], "loss_fn": "torch.nn.functional.cross_entropy"}
    with pytest.raises(ConfigError, match=r"model.act: a type cannot be written into config.yaml"):
        to_plain({"model": {"type": "X", "act": nn.ReLU}})
    with pytest.raises(ConfigError, match=r"model: a TinyNet cannot be written into config.yaml"):
        to_plain({"model": support.TinyNet()})
