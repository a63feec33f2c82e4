"""The Trainer's arguments, each defined once: :class:`TrainerArgs`.

One field per ``treadle.Trainer`` argument, in its signature's order: its name, type and
default, and an :class:`~treadle.engine.argspec.Arg` with its documentation, the types a
config file may give it, the Python objects a caller may pass besides (checked by their
own builders), and its checks. Everything else is derived from these fields
(treadle/engine/argspec.py): the Trainer's signature and docstring, the checks
``Trainer.__init__`` runs first (:func:`check_args`), the config keys
(:data:`TRAINER_KEYS`, which treadle/config/schema.py checks config files with, and the
CLI's ``--set`` with them) and ``docs/config.md``. A new argument is one more field here.
"""

import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import torch
from torch import nn

from treadle.components.errors import ConfigError, did_you_mean, join_path
from treadle.components.keys import SPEC, Check, Key, NoneType, _min, check_keys
from treadle.data.worker_seed import WATCHED
from treadle.engine.argspec import ANY_OBJECT, Arg, check_args as _check_args, config_keys, flag
from treadle.engine.preemption import PreemptionConfig
from treadle.hooks.base import Hook
from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.ema import EMAHook
from treadle.logging.specs import WRITERS as _WRITERS
from treadle.hooks.logger import check_writers
from treadle.optim.loss_scale import check_loss_scale
from treadle.optim.wrapper import check_clip_grad
from treadle.precision import check_precision
from treadle.strategies.activation_checkpointing import EXPECTED as AC_EXPECTED, plan_activation_checkpointing
from treadle.strategies.base import Strategy
from treadle.strategies.build import STRATEGY_NAMES, check_strategy, resolve_strategy

LOG_WRITERS = tuple(_WRITERS)  # names LoggerHook knows: "jsonl", "csv", "tensorboard", "mlflow", "wandb"
_ANY = ANY_OBJECT  # an object (a DataLoader, a callable): its own checks apply, not the config's


# -- checks of a config-typed value (Arg.check: (value, path), raising a ConfigError) ----
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
        _wrap(check_strategy)(value, path)  # the options' names; their values: by the one object built


def _build_strategy(name: str, value: Any) -> Strategy:
    """The one strategy object of a Trainer (a name or a dict built here; its constructor
    checks the options' values, and nothing starts)."""
    try:
        return resolve_strategy(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(name, str(e)) from None


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


def _seed_per_sample(value: Any, path: str) -> None:
    if isinstance(value, str):
        _choice("always")(value, path)


def _progress(value: Any, path: str) -> None:
    if isinstance(value, str):
        _choice("auto")(value, path)


def _check_fn_named(value: Any) -> Any:
    """``value`` with a ``check_fn`` that a config names (a dotted path, or ``{type: path,
    **kwargs}``) stood in for by a function: its form is all that can be checked before the
    config layer imports it (treadle/components/build.py's ``build_check_fn``, from
    treadle/engine/args.py)."""
    if isinstance(value, Mapping) and isinstance(value.get("check_fn"), (str, Mapping)):
        return {**value, "check_fn": _named}
    return value


def _named(module: nn.Module) -> bool:
    """Stands in for a ``check_fn`` a config names, while its form is checked."""
    return False


def _activation_checkpointing(value: Any, path: str) -> None:
    try:
        plan_activation_checkpointing(_check_fn_named(value), path)
    except (TypeError, ValueError) as e:  # the message starts with the key path
        raise ConfigError("", str(e)) from None


def _params(cls: type) -> list[str]:
    return [p for p in inspect.signature(cls).parameters if p != "self"]


# PreemptionConfig's fields, less the signals it records while running.
_PREEMPTION_KEYS = [f.name for f in fields(PreemptionConfig) if f.name != "received"]

# EMAHook's arguments, and start_iter (the design's name for its start).
_EMA_KEYS = [*_params(EMAHook), "start_iter"]

# -- checks of a value as given in Python (Arg.convert: (name, value) -> value) ----------
def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_activation_checkpointing(name: str, value: Any) -> Any:
    """``activation_checkpointing`` as given, once checked (its modules are matched when
    the model is prepared)."""
    plan_activation_checkpointing(_check_fn_named(value), name)
    return value


def check_model(name: str, model: Any) -> Any:
    """An ``nn.Module`` or a config dict (a registered name is a config file's only)."""
    if not isinstance(model, (nn.Module, Mapping)):
        raise TypeError(f"{name} must be a torch.nn.Module or a config dict such as dict(type='DigitsCNN'), "
                        f"got {type(model).__name__}")
    return model


def check_hook_list(hooks: Any) -> list[Any]:
    """``hooks``: a list (or tuple) of Hook objects or config dicts, not one hook on its own."""
    if isinstance(hooks, Hook):
        name = type(hooks).__name__
        raise TypeError(f"hooks={name}(...) is a single hook; expected a list of hooks, e.g. hooks=[{name}(...)]")
    if isinstance(hooks, Mapping):
        raise TypeError(f"hooks={dict(hooks)!r} is a single hook config; expected a list, e.g. hooks=[{dict(hooks)!r}]")
    if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Iterable):
        raise TypeError(f"hooks={hooks!r}; expected a list of treadle.Hook objects or hook config dicts "
                        "(an empty list for none)")
    return list(hooks)


def check_loader(name: str, loader: Any) -> Any:
    """A DataLoader or any iterable of batches (a config dict is built later, and checked there)."""
    if loader is None or isinstance(loader, Mapping):
        return loader
    iterable = isinstance(loader, Iterable) or callable(getattr(type(loader), "__getitem__", None))
    if isinstance(loader, (str, bytes)) or not iterable:
        raise TypeError(f"{name}={loader!r} ({type(loader).__name__}) is not iterable; expected a DataLoader, "
                        "another iterable of batches, or a dataloader config dict such as "
                        "dict(dataset=dict(type=...), batch_size=32)")
    return loader


def check_resume(resume: Any) -> bool | str | os.PathLike[str]:
    """``resume``: False, True or a checkpoint path (told apart by type: 0, None or '' are errors)."""
    if isinstance(resume, bool):
        return resume
    if not isinstance(resume, (str, os.PathLike)) or not os.fspath(resume):
        raise TypeError(f"resume={resume!r}; expected False, True (the newest checkpoint in work_dir) or a "
                        "checkpoint path")
    return resume


def _loader(doc: str, command: str) -> Arg:
    """An evaluation loader: a config must give it for ``command``."""
    return Arg(doc, (dict, NoneType), "a dataloader spec, or null", objects=_ANY, convert=check_loader,
               required_by=(command,))


def _fast_dev_run(value: Any, path: str) -> None:
    if not isinstance(value, bool) and value < 1:
        raise ConfigError(path, "out of range", value=value, expected="true, false or an int >= 1")


# -- the arguments -----------------------------------------------------------------------
@dataclass(frozen=True)
class TrainerArgs:
    """``treadle.Trainer``'s arguments (see the module's docstring); ``Trainer.__init__``
    receives them as one instance, which :func:`check_args` checks."""

    model: Annotated[nn.Module | Mapping[str, Any], Arg(
        "The model: an `nn.Module`, or a spec such as `{type: DigitsCNN, width: 32}` (a registered name or a dotted "
        "path), built after seeding. Without `loss_fn` it is called with the whole batch in training and returns a "
        "loss tensor or a dict of losses; it may define `train_step(batch, trainer)` / `val_step(batch, trainer)`.",
        (dict, str), SPEC, objects=(nn.Module,), convert=check_model,
        required_by=("train", "validate", "test"))]
    work_dir: Annotated[str | Path | None, Arg(
        "Run directory: `log.txt`, `log.jsonl`, checkpoints, `config.yaml` (None: log to the console only). The "
        "command line defaults it to `runs/<config name>`.",
        (str, NoneType), "a directory path, or null", objects=(os.PathLike,))] = None
    train_dataloader: Annotated[Iterable[Any] | Mapping[str, Any] | None, Arg(
        "Training data: a `DataLoader` or another iterable of batches, or a dataloader spec "
        "`{dataset: {type: ...}, batch_size: N, ...}` (the dataloader keys of docs/config.md), built after seeding.",
        (dict, NoneType), "a dataloader spec {dataset: {...}, batch_size: N, ...}, or null", objects=_ANY,
        convert=check_loader, required_by=("train",), training_only=True)] = None
    val_dataloader: Annotated[Iterable[Any] | Mapping[str, Any] | None, _loader(
        "Validation data (as `train_dataloader`), or several sets by name, `{clean: loader or spec, noisy: ...}`: "
        "each is validated in turn with the same metrics and logged under `val/<name>/` (`val/clean/acc`; "
        "docs/trainer.md).", "validate")] = None
    test_dataloader: Annotated[Iterable[Any] | Mapping[str, Any] | None, _loader(
        "Test data (as `val_dataloader`: one loader, or several sets by name logged under `test/<name>/`).",
        "test")] = None
    loss_fn: Annotated[Callable[..., Any] | Mapping[str, Any] | None, Arg(
        "`(outputs, targets) -> loss` (a tensor or a dict of them), e.g. `nn.CrossEntropyLoss()`, "
        "`{type: CrossEntropyLoss}` or a dotted path to a function; batches are then `(inputs, targets)` or dicts "
        "with `inputs`/`targets`. None: the model returns its loss(es).",
        (dict, str, NoneType), SPEC + ", or null", objects=_ANY)] = None
    optimizer: Annotated[torch.optim.Optimizer | Mapping[str, Any] | None, Arg(
        "An `Optimizer`, or `{type: AdamW, lr: ...}` (any `torch.optim` class by name; `paramwise: {...}` for "
        "per-parameter options), or a mapping of such by name, e.g. `{gen: {...}, disc: {...}}`, each for the "
        "model's submodule of that name. Built over the model once it is placed.",
        (dict, NoneType), "{type: AdamW, lr: ...}, a mapping of such by name, or null",
        objects=(torch.optim.Optimizer,), required_by=("train",), training_only=True)] = None
    schedulers: Annotated[Sequence[Any] | Mapping[str, Sequence[Any]] | None, Arg(
        "Parameter schedulers: MMEngine-style specs (`treadle.optim.scheduler_builder.SCHEDULERS`) or scheduler "
        "objects; a mapping of lists by optimizer name for several optimizers.",
        (list, dict, NoneType), "a list of scheduler specs, a mapping of lists by optimizer name, or null",
        objects=_ANY, training_only=True)] = None
    max_epochs: Annotated[int | None, Arg(
        "Train this many epochs (epoch-based); give this or `max_iters`, not both.",
        (int, NoneType), "an int >= 1, or null", _min(1), training_only=True)] = None
    max_iters: Annotated[int | None, Arg(
        "Train this many iterations (iteration-based); give this or `max_epochs`, not both.",
        (int, NoneType), "an int >= 1, or null", _min(1), training_only=True)] = None
    val_interval: Annotated[int, Arg(
        "Validate every this many epochs (or iterations), and at the end.",
        (int,), "an int >= 1", _min(1))] = 1
    workflow: Annotated[list[tuple[str, int]] | None, Arg(
        "mmcv-style phases such as `[(\"train\", 2), (\"val\", 1)]` (`[[train, 2], [val, 1]]` in YAML); None: "
        "train `val_interval`, then validate.",
        (list, NoneType), "a list of [mode, count] pairs, or null", _workflow, training_only=True)] = None
    metrics: Annotated[Mapping[str, Any] | None, Arg(
        "Validation and test metrics by name: objects with `update(outputs, targets)`, `compute()` and `reset()` "
        "(torchmetrics objects work as they are; metrics that are modules are moved to the run's device) or specs, "
        "e.g. `{acc: {type: Accuracy}}`; logged as `val/<name>` (`test/<name>`).",
        (dict, NoneType), "a mapping {name: component spec}, or null", objects=_ANY)] = None
    train_metrics: Annotated[Mapping[str, Any] | None, Arg(
        "Training metrics (as `metrics`), updated each iteration on the device without a host read, reduced over "
        "ranks, checkpointed per rank and logged as `train/<name>` at the log interval "
        "(treadle/hooks/train_metrics.py). The default step needs `loss_fn`; a custom step calls "
        "`trainer.update_train_metrics(outputs, targets)`.",
        (dict, NoneType), "a mapping {name: component spec}, or null", objects=_ANY, training_only=True)] = None
    train_metrics_reset: Annotated[str, Arg(
        "When `train_metrics` start over: after each log record (`interval`: a record covers its window) or when an "
        "epoch starts (`epoch`: running values over the epoch).",
        (str,), "'interval' or 'epoch'", _choice("interval", "epoch"))] = "interval"
    hooks: Annotated[Iterable[Hook | Mapping[str, Any]], Arg(
        "Hooks on top of the default ones: `Hook` objects or specs such as `{type: EarlyStoppingHook, patience: 3}` "
        "(`priority:` sets a hook's priority). A hook of a default hook's class replaces that default.",
        (list,), "a list of hook specs", objects=_ANY, convert=lambda _, hooks: check_hook_list(hooks))] = ()
    precision: Annotated[str | int, Arg(
        "Numeric precision: `\"32\"` (fp32), `\"bf16\"` (bf16 autocast) or `\"16\"` (fp16 autocast with a "
        "GradScaler).",
        (str, int), "'32', 'bf16' or '16'", _wrap(check_precision),
        convert=lambda _, p: check_precision(p))] = "32"  # 16 and 32 written as ints: "16", "32"
    accumulate: Annotated[int, Arg(
        "Gradient accumulation: an optimizer step every this many batches (treadle/optim/wrapper.py).",
        (int,), "an int >= 1", _min(1))] = 1
    clip_grad: Annotated[dict[str, Any] | None, Arg(
        "Gradient clipping by norm, `{max_norm: 1.0, norm_type: 2}`, or by value, `{value: 0.5}`.",
        (dict, NoneType), "{max_norm: N[, norm_type: 2]} or {value: V}, or null", _wrap(check_clip_grad))] = None
    ema: Annotated[dict[str, Any] | EMAHook | None, Arg(
        "Exponential moving average of the weights: `{momentum: 0.9998, interval: 1, start: 0}` or `{alpha: ...}` "
        "(`treadle.hooks.ema.EMAHook`'s arguments; `start_iter` is another name for `start`), or an `EMAHook`.",
        (dict, NoneType), f"a mapping with keys among {', '.join(_EMA_KEYS)}, or null", _keys(_EMA_KEYS, "ema"),
        objects=(EMAHook,), training_only=True)] = None
    strategy: Annotated[str | dict[str, Any] | Strategy, Arg(
        "Device and distribution: `auto` (DDP under a multi-process launcher, else one device), `single`, `ddp`, "
        "`fsdp`, `deepspeed`, a mapping with options, e.g. `{type: ddp, find_unused_parameters: true}` (as in "
        "`treadle.strategies.ddp.DDPStrategy` / `treadle.strategies.fsdp.FSDPStrategy` / "
        "`treadle.strategies.deepspeed.DeepSpeedStrategy`), or a `Strategy`.",
        (str, dict), f"one of {', '.join(STRATEGY_NAMES)}, or {{type: ddp|fsdp|deepspeed, option: value}}", _strategy,
        objects=(Strategy,), convert=_build_strategy)] = "auto"
    seed: Annotated[int | None, Arg(
        "Seed of every RNG. A model and data given as specs (and the command line's) are built after seeding, so "
        "initial weights repeat too. None: one is drawn (on rank 0, for every rank), used the same way and logged "
        "(`seed: N` in the log and env.txt): passing it repeats the run.",
        (int, NoneType), "an int >= 0, or null", _min(0))] = None
    seed_per_rank: Annotated[bool, flag("Each process uses seed + rank.")] = False
    seed_per_sample: Annotated[bool | str, Arg(
        "Seed the randomness a map-style dataset draws for each sample from `(seed, epoch, index)`: the same for "
        f"any `num_workers` and on resume. True: each process stops seeding once the first {WATCHED} samples it "
        "loads drew nothing; `always`: every sample (a dataset that draws only for some samples or epochs); False: never.",
        (bool, str), "true, false or 'always'", _seed_per_sample)] = True
    deterministic: Annotated[bool, flag("Deterministic algorithms (slower, repeatable).")] = False
    resume: Annotated[bool | str | Path, Arg(
        "Continue a run: False, True (the newest verified checkpoint in `work_dir`) or a checkpoint path.",
        (bool, str), "true, false, or a checkpoint path", objects=(os.PathLike,),
        convert=lambda _, resume: check_resume(resume), training_only=True)] = False
    load_from: Annotated[str | Path | None, Arg(
        "Model weights only (strict), from a checkpoint, a run directory (its newest verified checkpoint), a `.pt` "
        "file or a `.safetensors` file.",
        (str, NoneType), "a checkpoint or weights path, or null", objects=(os.PathLike,))] = None
    checkpoint: Annotated[dict[str, Any] | bool | CheckpointHook | None, Arg(
        "Checkpointing: `{interval: 1, by_epoch: true, keep: 3, best: val/acc, rule: max}` "
        "(`treadle.hooks.checkpoint.CheckpointHook`'s arguments), True (its defaults) or a `CheckpointHook`; "
        "None: save once at the end (with a `work_dir`); False: never.",
        (dict, bool, NoneType), f"a mapping with keys among {', '.join(_params(CheckpointHook))}, or null",
        _keys(_params(CheckpointHook), "checkpoint"), objects=(CheckpointHook,), training_only=True)] = None
    log_interval: Annotated[int, Arg(
        "Iterations between log lines.", (int,), "an int >= 1", _min(1))] = 50
    compile: Annotated[bool, flag("`torch.compile` the model.")] = False
    auto_scale_lr: Annotated[dict[str, Any] | None, Arg(
        "`{base_batch_size: N}`: scale lr by world_size * batch_size / base_batch_size (`enable: false` turns it "
        "off).",
        (dict, NoneType), "{base_batch_size: N[, enable: true]}, or null", _auto_scale_lr, training_only=True)] = None
    preemption: Annotated[bool | dict[str, Any], Arg(
        "Save and exit on SIGTERM/SIGUSR1 (exit code 143; and requeue on SLURM): True, False, or "
        "`{signals: [...], exit_code: N, requeue: bool}`.",
        (bool, dict), "true, false, or {signals: [...], exit_code: N, requeue: bool}",
        _keys(_PREEMPTION_KEYS, "preemption"))] = True
    nan_guard: Annotated[str | bool | dict[str, Any], Arg(
        "Non-finite losses: `raise` (checked at the log interval), `skip` the optimizer step, False (no check), or "
        "`{mode: raise|skip, check_interval: N}`.",
        (str, bool, dict), "'raise', 'skip', false, or {mode: raise|skip, check_interval: N}", _nan_guard)] = "raise"
    log_writers: Annotated[Sequence[Any], Arg(
        "Where logged records go besides the console and `log.txt`: names among "
        f"{', '.join(f'`{w}`' for w in LOG_WRITERS)}, or a mapping with the writer's options after the run "
        "directory, e.g. `{type: wandb, project: exp}` (`treadle.logging.trackers`).",
        (list,), f"a list of names among {', '.join(LOG_WRITERS)}, or {{type: name, option: value}}",
        _log_writers)] = ("jsonl", "csv", "tensorboard")
    progress: Annotated[bool | str, Arg(
        "Live progress bar (rich): `auto` shows it when stdout is a terminal, True always, False never; main "
        "process only.",
        (str, bool), "'auto', true or false", _progress)] = "auto"
    timer_breakdown: Annotated[bool, flag(
        "Log `time/forward`, `time/loss`, `time/backward`, `time/optimizer`, `time/hooks` of the default step "
        "(treadle/hooks/phase_timer.py).")] = False
    move_batch: Annotated[bool, flag(
        "Every step (the default ones, a model's own `train_step`/`val_step`, a subclass's `train_step`) gets the "
        "batch on the strategy's device, its tensors moved inside tuples, lists and dicts; False: steps get "
        "batches as the loader yields them and move what they need.")] = True
    safe: Annotated[bool, Arg(
        "Config dicts name only registered names and torch.nn / torch.optim classes; other dotted `type` paths and "
        "`collate_fn` strings are refused before anything is imported (treadle/components/safe.py). Objects are not "
        "affected. Not a config key: how far the caller trusts a config is not the config's to say.",
        convert=check_bool)] = False
    verbose: Annotated[bool, flag(
        "Print the environment and hook-order tables on the console too (they always go to `log.txt`).")] = False
    init_weights: Annotated[bool, flag(
        "Call the model's `init_weights()` once it is built, as MMEngine's runner does (mmcv/MMEngine models set "
        "their initial or pretrained weights there); the log says so. Off by default: a model that loaded weights "
        "in its constructor (a model zoo's `pretrained=True`) keeps them. A translated MMEngine config turns it "
        "on.")] = False
    fast_dev_run: Annotated[bool | int, Arg(
        "A quick check of the whole run: true (1) or N trains one epoch of N batches, validates and tests N "
        "batches, and writes nothing (no work_dir files, no checkpoints, no resume); the log says so.",
        (bool, int), "true, false or an int >= 1", _fast_dev_run)] = False
    limit_train_batches: Annotated[int | None, Arg(
        "Train at most this many batches per epoch (the epoch then ends early; the order is the full one's).",
        (int, NoneType), "an int >= 1, or null", _min(1))] = None
    limit_val_batches: Annotated[int | None, Arg(
        "Validate on at most this many batches per pass.", (int, NoneType), "an int >= 1, or null", _min(1))] = None
    limit_test_batches: Annotated[int | None, Arg(
        "Test on at most this many batches.", (int, NoneType), "an int >= 1, or null", _min(1))] = None
    accumulate_across_epochs: Annotated[bool, flag(
        "Epoch-based training with `accumulate`: windows run on across epoch ends, so the optimizer steps at every "
        "`accumulate`-th iteration of the run and only the last window, at the end of training, may be short "
        "(MMEngine's rule; a translated MMEngine config turns it on). Off: each epoch's last window closes with "
        "the epoch (treadle/optim/wrapper.py).")] = False
    loss_scale: Annotated[str | float | dict[str, Any], Arg(
        "`precision: '16'`'s loss scale: `dynamic` (torch's GradScaler with its defaults), a fixed scale such as "
        "`512.0` (MMEngine's AmpOptimWrapper: steps with inf/NaN gradients are still skipped, the scale never "
        "changes) or GradScaler options `{init_scale: 512, growth_interval: 100}` (treadle/optim/loss_scale.py).",
        (str, int, float, dict), "'dynamic', a number > 0, or a mapping of GradScaler options",
        _wrap(check_loss_scale))] = "dynamic"
    activation_checkpointing: Annotated[str | Sequence[Any] | Mapping[str, Any] | Callable[..., Any] | bool | None, Arg(
        "Recompute activations in backward instead of keeping them (less memory, more time), for any strategy: "
        "`full` (every block of the model's main stack: the children of its largest `nn.ModuleList`/`Sequential` "
        "of one class, e.g. GPT-2's `GPT2Block`), `selective` (those blocks, matmul and attention outputs kept, the "
        "rest recomputed), the module class names or submodule paths to checkpoint (`[Block]`, `[backbone.layer1]`), "
        "`{modules: [...], mode: full|selective}`, or a predicate `{check_fn: pkg.mod.fn}` (`fn(module) -> bool`; "
        "`{type: pkg.mod.fn, **kwargs}` binds arguments); from Python also classes or the function itself. "
        "Applied before the model is wrapped (DDP, FSDP); state dict keys do not change; no cost in evaluation "
        "(treadle/strategies/activation_checkpointing.py, docs/optimization.md).",
        (str, list, dict, bool, NoneType), AC_EXPECTED, _activation_checkpointing, objects=_ANY,
        convert=check_activation_checkpointing, training_only=True)] = None
    test_metrics: Annotated[Mapping[str, Any] | None, Arg(
        "Metrics of test passes only (as `metrics`); None: test passes use `metrics` (an OpenMMLab project's "
        "`test_evaluator` lands here).",
        (dict, NoneType), "a mapping {name: component spec}, or null", objects=_ANY)] = None


def check_args(args: TrainerArgs) -> TrainerArgs:
    """``args`` with every argument checked, in order (argspec.check_args): a value of a
    config type as a config file's would be (a tuple as a list), any other value the
    argument also takes (``objects``: a module, a DataLoader, a path) left to its
    builder, then each ``convert`` (``hooks`` becomes a list). Raises TypeError for a
    value of the wrong type, ValueError (a ConfigError) for one out of range; both name
    the argument."""
    return _check_args(args)


#: The config keys: every Trainer argument but ``safe``, in the signature's order.
TRAINER_KEYS: tuple[Key, ...] = config_keys(TrainerArgs)


__all__ = ["LOG_WRITERS", "TRAINER_KEYS", "TrainerArgs", "check_activation_checkpointing", "check_args", "check_bool",
           "check_hook_list", "check_loader", "check_model", "check_resume"]
