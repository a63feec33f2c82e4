"""The schema table: in sync with the Trainer, and one clear message per problem."""

from __future__ import annotations

import inspect

import pytest

from treadle import Trainer
from treadle.config import SCHEMA, ConfigError, resolve_config
from treadle.config.schema import NOT_CONFIG_KEYS, PROJECT_KEYS, trainer_defaults

BASE = {
    "model": {"type": "support.TinyNet"},
    "train_dataloader": {"dataset": {"type": "support.make_data"}, "batch_size": 8},
    "optimizer": {"type": "SGD", "lr": 0.1},
    "max_epochs": 1,
}


def test_schema_lists_every_trainer_argument_and_the_project_keys_and_nothing_else():
    params = [p for p in inspect.signature(Trainer.__init__).parameters if p != "self" and p not in NOT_CONFIG_KEYS]
    params += [k.name for k in PROJECT_KEYS]  # an OpenMMLab project's, read by the config layer
    assert sorted(SCHEMA) == sorted(params), (
        f"missing from treadle/config/schema.py: {sorted(set(params) - set(SCHEMA))}; "
        f"not Trainer arguments: {sorted(set(SCHEMA) - set(params))}")


def test_resolved_config_has_every_key_with_defaults_in_signature_order():
    cfg = resolve_config(BASE, mode="train")
    assert list(cfg) == list(trainer_defaults())
    assert cfg["val_interval"] == 1 and cfg["hooks"] == [] and cfg["precision"] == "32"
    assert cfg["max_epochs"] == 1 and cfg["optimizer"] == {"type": "SGD", "lr": 0.1}


def error(cfg=None, overrides=(), mode="train"):
    with pytest.raises(ConfigError) as e:
        resolve_config({**BASE, **(cfg or {})}, overrides, mode=mode)
    return str(e.value)


def test_unknown_key_with_did_you_mean():
    assert error({"max_epoch": 3}) == ("max_epoch: unknown key (got 3); expected a treadle.Trainer argument. "
                                       "Did you mean 'max_epochs'?")


def test_a_name_far_from_every_key_is_a_config_variable_left_out():
    assert "zzz" not in resolve_config({**BASE, "zzz": 1}, mode="train")
    assert "nothing in the config uses it" in error({"zzz": 1}, ["zzz=2"])


def test_project_keys_are_checked_like_trainer_keys():
    assert "default_scope: wrong type int (got 3); expected a registry scope such as mmpretrain, or null" \
        in error({"default_scope": 3})
    assert "val_evaluator: wrong type str" in error({"val_evaluator": "Accuracy"})


@pytest.mark.parametrize("key, value, message", [
    ("max_epochs", "3", "max_epochs: wrong type str (got '3'); expected an int >= 1, or null"),
    ("max_epochs", True, "max_epochs: wrong type bool (got True); expected an int >= 1, or null"),
    ("max_epochs", 0, "max_epochs: out of range (got 0); expected an int >= 1"),
    ("val_interval", -2, "val_interval: out of range (got -2); expected an int >= 1"),
    ("seed", -1, "seed: out of range (got -1); expected an int >= 0"),
    ("deterministic", "yes", "deterministic: wrong type str (got 'yes'); expected true or false"),
    ("strategy", "dpp", "strategy: not a supported value (got 'dpp'); expected one of 'auto', 'single', 'ddp', "
                        "'fsdp', 'deepspeed'. Did you mean 'ddp'?"),
    ("precision", "fp8", "precision: precision='fp8' is not supported"),
    ("hooks", {"type": "X"}, "hooks: wrong type dict"),
    ("clip_grad", {"max_norm": -1}, "clip_grad: clip_grad bound must be a positive number, got -1"),
    ("ema", {"momentom": 0.9}, "ema.momentom: unknown key for ema (got 0.9); expected one of momentum"),
    ("checkpoint", {"intervall": 2}, "checkpoint.intervall: unknown key for checkpoint (got 2)"),
    ("workflow", [["train", 0]], "workflow[0][1]: not a positive count (got 0); expected an int >= 1"),
    ("workflow", [["tran", 1]], "workflow[0][0]: not a supported value (got 'tran')"),
    ("auto_scale_lr", {"enable": True}, "auto_scale_lr.base_batch_size: missing required key"),
    ("nan_guard", "ignore", "nan_guard: not a supported value (got 'ignore'); expected one of 'raise', 'skip'"),
    ("log_writers", ["jsonl", "wandbb"], "log_writers[1]: not a supported value (got 'wandbb')"),
    ("log_writers", [{"type": "mlflow", "projekt": "x"}], "log_writers[0]: bad options ['projekt'] for the mlflow writer"),
    ("log_writers", [{"project": "x"}], "log_writers[0].type: not a writer name (got None)"),
    ("preemption", {"signal": ["SIGTERM"]}, "preemption.signal: unknown key for preemption"),
])
def test_wrong_type_and_out_of_range(key, value, message):
    assert error({key: value}).startswith(message)


def test_mutually_exclusive_keys():
    assert error({"max_iters": 5}) == ("max_epochs, max_iters: mutually exclusive (got {'max_epochs': 1, "
                                       "'max_iters': 5}); expected exactly one of them (set the other to null)")
    resolve_config({**BASE, "max_epochs": None, "max_iters": 5}, mode="train")  # null switches one off


@pytest.mark.parametrize("missing, mode, message", [
    ("model", "train", "model: missing required key for `treadle train`; expected a component spec"),
    ("optimizer", "train", "optimizer: missing required key for `treadle train`"),
    ("train_dataloader", "train", "train_dataloader: missing required key for `treadle train`"),
    ("max_epochs", "train", "max_epochs, max_iters: missing required key for `treadle train`; expected max_epochs "
                            "(epoch-based) or max_iters (iteration-based)"),
])
def test_missing_required_key(missing, mode, message):
    cfg = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ConfigError) as e:
        resolve_config(cfg, mode=mode)
    assert str(e.value).startswith(message)


def test_required_keys_depend_on_the_command():
    assert error(mode="validate").startswith("val_dataloader: missing required key for `treadle validate`")
    assert error(mode="test").startswith("test_dataloader: missing required key for `treadle test`")
    resolve_config({"model": {"type": "X"}})  # no mode: only the schema


def test_overrides_and_values_are_checked_too():
    assert error(overrides=["max_epochs=0"]).startswith("max_epochs: out of range (got 0)")
    cfg = resolve_config(BASE, ["optimizer.lr=0.5"], mode="train", seed=7, work_dir=None)
    assert cfg["seed"] == 7 and cfg["optimizer"]["lr"] == 0.5 and cfg["work_dir"] is None


def test_training_only_and_required_keys_come_from_the_argument_definitions():
    """Both lists are read off the Trainer's argument definitions (Arg.training_only,
    Arg.required_by), not written a second time: the keys as they were listed by hand."""
    from treadle.config.schema import TRAINING_ONLY, required_keys

    assert set(TRAINING_ONLY) == {"train_dataloader", "optimizer", "schedulers", "ema", "checkpoint", "auto_scale_lr",
                                  "workflow", "resume", "max_epochs", "max_iters", "train_metrics",
                                  "activation_checkpointing"}
    assert [k for k, _ in required_keys("train")] == ["model", "train_dataloader", "optimizer"]
    assert [k for k, _ in required_keys("validate")] == ["model", "val_dataloader"]
    assert [k for k, _ in required_keys("test")] == ["model", "test_dataloader"]
    assert all(expected and not expected.endswith("null") for m in ("train", "test") for _, expected in required_keys(m))


@pytest.mark.parametrize("mode, missing", [("train", "optimizer"), ("validate", "val_dataloader"),
                                           ("test", "test_dataloader")])
def test_each_command_asks_for_its_own_keys(mode, missing):
    from treadle.config.resolve import validate_config

    loader = {"dataset": {"type": "Foo"}, "batch_size": 2}
    cfg = {"model": {"type": "Foo"}, "train_dataloader": loader, "optimizer": {"type": "SGD", "lr": 0.1},
           "val_dataloader": loader, "test_dataloader": loader, "max_iters": 2}
    validate_config(cfg, mode)
    without = {k: v for k, v in cfg.items() if k != missing}
    with pytest.raises(ConfigError, match=rf"{missing}: missing required key for `treadle {mode}`"):
        validate_config(without, mode)
    if mode != "train":  # an evaluation needs no optimizer
        validate_config({k: v for k, v in without.items() if k != "optimizer"} | {missing: loader}, mode)
