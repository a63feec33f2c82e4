"""The Trainer's arguments: one typed specification, for Python and config files alike.

:data:`TRAINER_KEYS` lists every ``treadle.Trainer`` argument in its signature's order:
the types a config file may give it, the Python objects a caller may pass besides
(checked by their own builders), a range check, and its line of documentation.
``Trainer.__init__`` checks its arguments with :func:`check_args`; the config schema
(treadle/config/schema.py) checks a config file's keys with the same table, and
``docs/config.md`` is generated from it. A test checks that the table and the signature
list the same names.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import fields
from typing import Any, Callable, Mapping

import torch
from torch import nn

from treadle.config.errors import ConfigError, did_you_mean, join_path
from treadle.config.keys import SPEC, Check, Key, NoneType, _min, check_keys, check_value
from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.ema import EMAHook
from treadle.hooks.logger import WRITERS as _WRITERS
from treadle.hooks.logger import check_writers
from treadle.optim.wrapper import check_clip_grad, check_precision
from treadle.engine.preemption import PreemptionConfig
from treadle.strategies.base import Strategy
from treadle.strategies.build import STRATEGY_NAMES, resolve_strategy

LOG_WRITERS = tuple(_WRITERS)  # names LoggerHook knows: "jsonl", "csv", "tensorboard", "mlflow", "wandb"
_ANY = (object,)  # an object (a DataLoader, a callable): its own checks apply, not the config's


# -- checks ------------------------------------------------------------------------------
def _choice(*choices: str) -> Check:
    def check(value: Any, path: str) -> None:
        if value not in choices:
            raise ConfigError(path, "not a supported value", value=value, expected=f"one of {', '.join(map(repr, choices))}",
                              hint=did_you_mean(str(value), choices))
    return check


def _keys(allowed: list[str], what: str) -> Check:
    def check(value: Any, path: str) -> None:
        if isinstance(value, dict):
            check_keys(value, allowed, path, what)
    return check


def _wrap(fn: Callable[[Any], Any]) -> Check:
    """Reuse a checker of the library (e.g. ``check_clip_grad``; its messages give the
    value and what is expected), adding the key path."""
    def check(value: Any, path: str) -> None:
        try:
            fn(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(path, str(e)) from None
    return check


def _strategy(value: Any, path: str) -> None:
    if isinstance(value, str):
        _choice(*STRATEGY_NAMES)(value, path)
    else:
        _choice(*STRATEGY_NAMES)(value.get("type"), f"{path}.type")
        _wrap(resolve_strategy)(value, path)  # the constructor checks the options; nothing starts


def _workflow(value: Any, path: str) -> None:
    for i, phase in enumerate(value or []):
        p = join_path(path, i)
        if not isinstance(phase, (list, tuple)) or len(phase) != 2:
            raise ConfigError(p, "not a [mode, count] pair", value=phase, expected="e.g. [train, 2]")
        mode, count = phase
        _choice("train", "val")(mode, join_path(p, 0))
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(join_path(p, 1), "not a positive count", value=count, expected="an int >= 1")


def _auto_scale_lr(value: Any, path: str) -> None:
    check_keys(value, ["base_batch_size", "enable"], path, "auto_scale_lr")
    if "base_batch_size" not in value:
        raise ConfigError(join_path(path, "base_batch_size"), "missing required key", expected="an int >= 1")
    base = value["base_batch_size"]
    if isinstance(base, bool) or not isinstance(base, int) or base < 1:
        raise ConfigError(join_path(path, "base_batch_size"), "not a positive int", value=base, expected="an int >= 1")


def _nan_guard(value: Any, path: str) -> None:
    if isinstance(value, str):
        _choice("raise", "skip")(value, path)
    elif isinstance(value, dict):
        check_keys(value, ["mode", "check_interval"], path, "nan_guard")
        if "mode" in value:
            _choice("raise", "skip")(value["mode"], join_path(path, "mode"))


def _log_writers(value: Any, path: str) -> None:
    for i, spec in enumerate(value):
        if not isinstance(spec, (str, dict)):
            continue  # a writer object (Python only): check_writers below checks it
        name = spec.get("type") if isinstance(spec, dict) else spec
        where = join_path(join_path(path, i), "type") if isinstance(spec, dict) else join_path(path, i)
        if not isinstance(name, str):
            raise ConfigError(where, "not a writer name", value=name,
                              expected=f"one of {', '.join(LOG_WRITERS)}, or {{type: name, option: value}}")
        _choice(*LOG_WRITERS)(name, where)
    try:  # the writers' options; the message starts with the key path
        check_writers(path, value)
    except (TypeError, ValueError) as e:
        raise ConfigError("", str(e)) from None


def _progress(value: Any, path: str) -> None:
    if isinstance(value, str):
        _choice("auto")(value, path)


def _params(cls: type) -> list[str]:
    return [p for p in inspect.signature(cls).parameters if p != "self"]


# PreemptionConfig's fields, less the signals it records while running.
_PREEMPTION_KEYS = [f.name for f in fields(PreemptionConfig) if f.name != "received"]

# EMAHook's arguments, and start_iter (the design's name for its start).
_EMA_KEYS = [*_params(EMAHook), "start_iter"]

#: The Trainer's arguments, in its signature's order.
TRAINER_KEYS: tuple[Key, ...] = (
    Key("model", (dict, str), SPEC, "The model: `{type: DigitsCNN, width: 32}` (registry name or dotted path).", objects=(nn.Module,)),
    Key("work_dir", (str, NoneType), "a directory path, or null",
        "Run directory (logs, checkpoints, `config.yaml`). The command line defaults it to `runs/<config name>`.", objects=(os.PathLike,)),
    Key("train_dataloader", (dict, NoneType), "a dataloader spec {dataset: {...}, batch_size: N, ...}, or null",
        "Training data: a `torch.utils.data.DataLoader` built from the dataloader keys below.", objects=_ANY),
    Key("val_dataloader", (dict, NoneType), "a dataloader spec, or null", "Validation data (same keys).", objects=_ANY),
    Key("test_dataloader", (dict, NoneType), "a dataloader spec, or null", "Test data (same keys).", objects=_ANY),
    Key("loss_fn", (dict, str, NoneType), SPEC + ", or null",
        "`(outputs, targets) -> loss`, e.g. `{type: CrossEntropyLoss}` or a dotted path to a function; "
        "null: the model returns its loss(es).", objects=_ANY),
    Key("optimizer", (dict, NoneType), "{type: AdamW, lr: ...}, a mapping of such by name, or null",
        "Passed to the Trainer as it is: any `torch.optim` class by name; `paramwise: {...}` for per-parameter "
        "options; `{gen: {...}, disc: {...}}` for one optimizer per submodule.", objects=(torch.optim.Optimizer,)),
    Key("schedulers", (list, dict, NoneType), "a list of scheduler specs, a mapping of lists by optimizer name, or null",
        "Parameter schedulers (`treadle.optim.scheduler_builder.SCHEDULERS`), passed to the Trainer as they are.", objects=_ANY),
    Key("max_epochs", (int, NoneType), "an int >= 1, or null", "Epoch-based training length (not with max_iters).",
        _min(1)),
    Key("max_iters", (int, NoneType), "an int >= 1, or null", "Iteration-based training length (not with max_epochs).",
        _min(1)),
    Key("val_interval", (int,), "an int >= 1", "Validate every this many epochs (or iterations), and at the end.",
        _min(1)),
    Key("workflow", (list, NoneType), "a list of [mode, count] pairs, or null",
        "mmcv-style phases such as `[[train, 2], [val, 1]]`; null: train `val_interval`, then validate.", _workflow),
    Key("metrics", (dict, NoneType), "a mapping {name: component spec}, or null",
        "Validation/test metrics, e.g. `{acc: {type: Accuracy}}`; logged as `val/<name>`.", objects=_ANY),
    Key("train_metrics", (dict, NoneType), "a mapping {name: component spec}, or null",
        "Training metrics (same specs as `metrics`), updated each iteration on the device without a host read "
        "and logged as `train/<name>` at the log interval; the default step needs `loss_fn`.", objects=_ANY),
    Key("train_metrics_reset", (str,), "'interval' or 'epoch'",
        "When `train_metrics` start over: after each log record (`interval`: a record covers its window) or "
        "when an epoch starts (`epoch`: running values over the epoch).", _choice("interval", "epoch")),
    Key("hooks", (list,), "a list of hook specs",
        "Extra hooks, e.g. `[{type: EarlyStoppingHook, patience: 3}]`; `priority:` sets a hook's priority. "
        "A hook of a default hook's class replaces the default.", objects=_ANY),
    Key("precision", (str, int), "'32', 'bf16' or '16'", "Numeric precision: fp32, bf16 autocast, fp16 with GradScaler.",
        _wrap(check_precision)),
    Key("accumulate", (int,), "an int >= 1", "Gradient accumulation: optimizer step every this many batches.", _min(1)),
    Key("clip_grad", (dict, NoneType), "{max_norm: N[, norm_type: 2]} or {value: V}, or null",
        "Gradient clipping by norm or by value.", _wrap(check_clip_grad)),
    Key("ema", (dict, NoneType), f"a mapping with keys among {', '.join(_EMA_KEYS)}, or null",
        "Exponential moving average of the weights (`treadle.hooks.ema.EMAHook` arguments; `start_iter` is "
        "another name for `start`).", _keys(_EMA_KEYS, "ema"), objects=(EMAHook,)),
    Key("strategy", (str, dict), f"one of {', '.join(STRATEGY_NAMES)}, or {{type: ddp|fsdp|deepspeed, option: value}}",
        "Device and distribution strategy; options as in `treadle.strategies.ddp.DDPStrategy` / "
        "`treadle.strategies.fsdp.FSDPStrategy` / `treadle.strategies.deepspeed.DeepSpeedStrategy`.", _strategy, objects=(Strategy,)),
    Key("seed", (int, NoneType), "an int >= 0, or null",
        "Seed of every RNG; the command line seeds before building the model, so initial weights repeat too.", _min(0)),
    Key("seed_per_rank", (bool,), "true or false", "Each process uses seed + rank."),
    Key("seed_per_sample", (bool,), "true or false",
        "Seed each sample's randomness in a map-style dataset from (seed, epoch, index): the same for any "
        "num_workers and on resume."),
    Key("deterministic", (bool,), "true or false", "Deterministic algorithms (slower, repeatable)."),
    Key("resume", (bool, str), "true, false, or a checkpoint path",
        "Continue a run: true takes the latest checkpoint in work_dir.", objects=(os.PathLike,)),
    Key("load_from", (str, NoneType), "a checkpoint or weights path, or null", "Load model weights only (strict).", objects=(os.PathLike,)),
    Key("checkpoint", (dict, bool, NoneType), f"a mapping with keys among {', '.join(_params(CheckpointHook))}, or null",
        "Checkpointing (`treadle.hooks.checkpoint.CheckpointHook` arguments); null: save once at the end.",
        _keys(_params(CheckpointHook), "checkpoint"), objects=(CheckpointHook,)),
    Key("log_interval", (int,), "an int >= 1", "Iterations between log lines.", _min(1)),
    Key("compile", (bool,), "true or false", "`torch.compile` the model."),
    Key("auto_scale_lr", (dict, NoneType), "{base_batch_size: N[, enable: true]}, or null",
        "Scale lr by world_size * batch_size / base_batch_size.", _auto_scale_lr),
    Key("preemption", (bool, dict), "true, false, or {signals: [...], exit_code: N, requeue: bool}",
        "Save and exit on SIGTERM/SIGUSR1 (and requeue on SLURM).",
        _keys(_PREEMPTION_KEYS, "preemption")),
    Key("nan_guard", (str, bool, dict), "'raise', 'skip', false, or {mode: raise|skip, check_interval: N}",
        "Non-finite losses: raise (checked at the log interval) or skip the optimizer step.", _nan_guard),
    Key("log_writers", (list,), f"a list of names among {', '.join(LOG_WRITERS)}, or {{type: name, option: value}}",
        "Where logged records go besides the console and `log.txt`; a mapping gives the writer's options after "
        "the run directory, e.g. `{type: wandb, project: exp}` (`treadle.logging.trackers`).", _log_writers),
    Key("progress", (str, bool), "'auto', true or false",
        "Live progress bar (rich): auto shows it when stdout is a terminal; main process only.", _progress),
    Key("timer_breakdown", (bool,), "true or false",
        "Log `time/forward`, `time/loss`, `time/backward`, `time/optimizer`, `time/hooks` of the default step."),
    Key("move_batch", (bool,), "true or false",
        "Every step, the default one and a model's own `train_step`/`val_step`, gets the batch on the strategy's "
        "device; false: steps get batches as the loader yields them and move what they need."),
    Key("verbose", (bool,), "true or false",
        "Print the environment and hook-order tables on the console too (they always go to `log.txt`)."),
)



def check_args(values: Mapping[str, Any]) -> None:
    """Check the Trainer's arguments ``values`` against :data:`TRAINER_KEYS`: a value of
    a config type is checked as a config file's would be (a tuple as a list); any other
    value the key also takes (``objects``: a module, a DataLoader, a path) is left to its
    builder. Raises TypeError for a
    value of the wrong type, ValueError (a ConfigError) for one out of range; both name
    the argument."""
    for key in TRAINER_KEYS:
        value = values[key.name]
        if isinstance(value, tuple):
            value = list(value)
        of_config_type = any(isinstance(value, t) for t in key.types)
        if not of_config_type and isinstance(value, key.objects):
            continue
        try:
            check_value(key, value, key.name)
        except ConfigError as e:
            if e.problem.startswith("wrong type"):
                expected = e.expected
                if key.objects and key.objects != _ANY and "path" not in expected:  # what Python may pass too
                    expected += ", or " + " or ".join(_type_name(t) for t in key.objects)
                raise TypeError(str(ConfigError(e.path, e.problem, value=e.value, expected=expected))) from None
            raise


def _type_name(t: type) -> str:
    return {os.PathLike: "a path", nn.Module: "an nn.Module"}.get(t, f"a {t.__module__.split('.')[0]}.{t.__qualname__}"
                                                                      if t.__module__ != "builtins" else t.__name__)


__all__ = ["LOG_WRITERS", "TRAINER_KEYS", "check_args"]
