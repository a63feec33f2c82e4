"""Turn the Trainer's arguments into checked components.

The arguments are defined, each once, in treadle/engine/spec.py (``TrainerArgs``);
:func:`build_args` checks them by those definitions, then checks what needs several of
them together and builds what they describe. Everything here runs inside
``Trainer.__init__``, before anything is trained or written, so a bad argument fails
with a message that names it. Internal to treadle: the public face is the Trainer's
signature (treadle/engine/trainer.py).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from treadle.hints import check_metric_update
from treadle.hooks.base import Hook, check_hook_points, get_priority
from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.hooks.ema import EMAHook
from treadle.hooks.logger import LoggerHook
from treadle.hooks.nan_guard import NaNGuardHook
from treadle.hooks.scheduler import ParamSchedulerHook
from treadle.hooks.timer import IterTimerHook
from treadle.engine.eval_loop import check_set_names, loader_sets
from treadle.engine.loops import Workflow, check_workflow
from treadle.logging.writers import get_logger
from treadle.precision import AUTOCAST_DTYPES
from treadle.optim.wrapper_builder import by_name
from treadle.engine.preemption import PreemptionConfig
from treadle.checkpoint.directory import check_resume_dir
from treadle.engine.spec import TrainerArgs, check_args
from treadle.seeding import seed_everything
from treadle.components.empty_init import EmptyModel, record
from treadle.hooks.phase_timer import PhaseTimerHook
from treadle.hooks.train_metrics import TrainMetrics, TrainMetricsHook


def progress_on(progress: Any, is_main: bool) -> bool:
    """Whether to add the progress bar: "auto" on a terminal, True always; main process only."""
    if not (isinstance(progress, bool) or progress == "auto"):
        raise ValueError(f"progress={progress!r}; expected 'auto' (a bar when stdout is a terminal), True or False")
    if not is_main or progress is False:
        return False
    isatty = getattr(sys.stdout, "isatty", None)
    return progress is True or bool(isatty and isatty())


def warn_if_unpinned(loader: Any) -> None:
    """Batches go to the GPU with non_blocking copies, which overlap with compute only
    from pinned host memory: say so when a CUDA run's DataLoader does not pin."""
    from torch.utils.data import DataLoader

    if isinstance(loader, DataLoader) and not loader.pin_memory:
        get_logger().warning("the training DataLoader has pin_memory=False: on CUDA each batch copy then blocks "
                             "the host; DataLoader(..., pin_memory=True) lets it overlap with compute")


def nan_guard_hook(cfg: Any, log_interval: int) -> NaNGuardHook | None:
    """The default checks at the log interval, when the logger syncs anyway: no sync per step.

    None for ``nan_guard=False``; values are told apart by type, so ``0`` or ``None`` is an
    error, not a quiet "off"."""
    if cfg is False:
        return None
    if cfg is True or cfg == "raise":
        return NaNGuardHook(mode="raise", check_interval=log_interval)
    if cfg == "skip":
        return NaNGuardHook(mode="skip")
    if isinstance(cfg, dict):
        unknown = set(cfg) - {"mode", "check_interval"}
        if unknown:
            raise ValueError(f"nan_guard has unknown keys {sorted(unknown)}; expected mode, check_interval")
        try:
            return NaNGuardHook(**{"check_interval": log_interval, **cfg})
        except (TypeError, ValueError) as e:
            raise ValueError(f"nan_guard={cfg!r}: {e}") from None
    raise ValueError(f"nan_guard={cfg!r}; expected 'raise', 'skip', False, True or dict(mode=..., check_interval=...)")


def checkpoint_hook(cfg: Any) -> CheckpointHook:
    """``checkpoint=``: a CheckpointHook, True, or its arguments as a dict (type and keys
    checked by the spec, treadle/engine/spec.py)."""
    if isinstance(cfg, CheckpointHook):
        return cfg
    return CheckpointHook() if cfg is True else CheckpointHook(**cfg)


def ema_hook(cfg: Any) -> EMAHook:
    """``ema=``: an EMAHook, or its arguments as a dict (``start_iter`` is another name for
    ``start``; type and keys checked by the spec, treadle/engine/spec.py)."""
    if isinstance(cfg, EMAHook):
        return cfg
    if "momentum" in cfg and "alpha" in cfg:
        raise ValueError("ema: give momentum or alpha, not both")
    if "start" in cfg and "start_iter" in cfg:
        raise ValueError("ema: give start or start_iter (the same thing), not both")
    cfg = {("start" if k == "start_iter" else k): v for k, v in cfg.items()}
    return EMAHook(**cfg)


#: What each kind of config dict builds into, and the builder in treadle/components/build.py.
SPEC_KINDS = ("model", "dataloader", "loss", "metric", "hook")


def from_spec(value: Any, kind: str, path: str, *, safe: bool = False) -> Any:
    """``value`` itself, or, when it is a config dict, the object that dict describes.

    The dict is built exactly as the same key of a config file is (treadle/components/build.py:
    ``{type: Name, **kwargs}``, a registered name or dotted path; a dataloader is
    ``{dataset: {...}, batch_size: N, ...}``), so a Python script and a config file
    accept the same values. Errors are ConfigErrors naming ``path``. ``safe``: names
    only registered names and torch classes (treadle/components/safe.py).
    """
    if not isinstance(value, Mapping):
        return value
    # The config layer's component builders, imported only when a dict is given; that
    # module never imports the Trainer (treadle.config.assemble, which builds it, does).
    from treadle.components.build import build_component, build_dataloader, build_hook, build_model

    spec = dict(value)
    if kind == "model":
        return build_model(spec, safe=safe)
    if kind == "dataloader":
        return build_dataloader(spec, path, safe=safe)
    if kind == "hook":
        return build_hook(spec, path, safe=safe)
    if kind in ("loss", "metric"):
        return build_component(spec, kind, path, safe=safe)
    raise ValueError(f"from_spec: kind={kind!r}; expected one of {SPEC_KINDS}")


def check_metrics(metrics: Mapping[str, Any] | None, arg: str = "metrics") -> dict[str, Any]:
    """``metrics`` (or ``train_metrics``, as ``arg`` names it): metric objects with
    ``update(outputs, targets)``, ``compute()`` and ``reset()`` by name; ``{}`` for None."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{arg} must be a dict {{name: metric}}, got {type(metrics).__name__}")
    for name, m in metrics.items():
        if isinstance(m, type):
            raise TypeError(f"{arg}[{name!r}]={m.__name__} is a class, not a metric object; expected an instance "
                            f"such as {m.__name__}()")
        missing = [a for a in ("update", "compute", "reset") if not callable(getattr(m, a, None))]
        if missing:
            raise TypeError(f"{arg}[{name!r}] ({type(m).__name__}) lacks {missing}; "
                            "a metric needs update(outputs, targets), compute() and reset()")
        check_metric_update(name, m, arg)
    return dict(metrics)


def warn_without_validation(hooks: list[Hook]) -> None:
    """Say so when something waits for validation results that no validation will produce."""
    waiting = []
    for h in hooks:
        if isinstance(h, CheckpointHook) and h.best is not None:
            waiting.append(f"checkpoint best={h.best!r}")
        elif isinstance(h, EarlyStoppingHook):
            waiting.append(f"EarlyStoppingHook monitor={h.monitor!r}")
        elif isinstance(h, ParamSchedulerHook):
            waiting += [f"{type(sch).__name__} monitor={getattr(sch, 'monitor', None)!r}"
                        for scheds in h.schedulers.values() for sch in scheds
                        if getattr(sch, "need_val_args", False)]
    if waiting:
        needs, it, them = ("needs", "it", "it") if len(waiting) == 1 else ("need", "they", "them")
        get_logger().warning(f"{', '.join(waiting)} {needs} validation results, but there is no val_dataloader, "
                             f"so {it} will never act; give a val_dataloader (or leave {them} out)")


@dataclass
class Args:
    """The Trainer's arguments once checked (:attr:`args`), with what they build: config
    dicts of components built (model and data are built later, after seeding:
    :func:`build_model_and_data`), hooks and the optimizer wrapper's options."""

    args: TrainerArgs  # every argument, checked (treadle/engine/spec.py): hooks as a list
    loss_fn: Any
    metrics: dict[str, Any]
    test_metrics: dict[str, Any] | None  # None: test passes use ``metrics``
    train_metrics: TrainMetrics | None  # None when none are given: the step then has no metric code
    hooks: list[Hook]
    workflow: Workflow | None
    preemption: PreemptionConfig | None
    precision: str
    clip_grad: dict[str, Any] | None
    optim_wrapper: Any  # what Strategy.prepare takes, or None
    activation_checkpointing: Any  # what Strategy.prepare takes: a check_fn a config names is imported
    guard: NaNGuardHook | None
    ema: EMAHook | None
    checkpoint_hook: CheckpointHook | None


def quick_check(v: TrainerArgs) -> TrainerArgs:
    """``fast_dev_run``: the arguments of a quick check of the whole run (one epoch of N
    batches, N of validation and of test, nothing written), said in the log."""
    if v.fast_dev_run is False:
        return v
    n = 1 if v.fast_dev_run is True else int(v.fast_dev_run)
    get_logger().info(f"fast_dev_run: 1 epoch of {n} batch(es), {n} of validation and of test; nothing is written "
                      "(no work_dir, checkpoints or resume)")
    return dataclasses.replace(v, max_epochs=1, max_iters=None, val_interval=1, workflow=None,
                               limit_train_batches=n, limit_val_batches=n, limit_test_batches=n, work_dir=None,
                               checkpoint=False, resume=False, log_writers=())


def build_args(given: TrainerArgs) -> Args:
    """Every argument checked by its definition (treadle/engine/spec.py), then the checks
    that need more than one argument or a file, and the components given as config dicts
    (loss, metrics, hooks) built as a config file builds them."""
    v = quick_check(check_args(given))
    safe = v.safe
    loss_fn = from_spec(v.loss_fn, "loss", "loss_fn", safe=safe)
    metrics = v.metrics
    if isinstance(metrics, Mapping):
        metrics = {name: from_spec(m, "metric", f"metrics.{name}", safe=safe) for name, m in metrics.items()}
    test_metrics = v.test_metrics
    if isinstance(test_metrics, Mapping):
        test_metrics = {name: from_spec(m, "metric", f"test_metrics.{name}", safe=safe)
                        for name, m in test_metrics.items()}
    if metrics and v.val_dataloader is None and v.test_dataloader is None:
        # Refusing would break a Trainer built for training whose loaders come in a later run;
        # one line says that nothing will compute them, where before the table came out empty.
        get_logger().warning(f"metrics= {sorted(metrics)} will not be computed: there is no val_dataloader or "
                             "test_dataloader (metrics are computed on those; train_metrics= on the training "
                             "batches)")
    train_metrics = v.train_metrics
    if isinstance(train_metrics, Mapping):
        train_metrics = {name: from_spec(m, "metric", f"train_metrics.{name}", safe=safe)
                         for name, m in train_metrics.items()}
    train_metrics = check_metrics(train_metrics, "train_metrics")
    hooks = [from_spec(h, "hook", f"hooks[{i}]", safe=safe) for i, h in enumerate(v.hooks)]
    for i, h in enumerate(hooks):
        if not isinstance(h, Hook):
            raise TypeError(f"hooks[{i}] must be a treadle.Hook instance or a config dict, got {type(h).__name__}")
        get_priority(h.priority)
        check_hook_points(h, f"hooks[{i}]")
    max_epochs, max_iters = v.max_epochs, v.max_iters
    if max_epochs is not None and max_iters is not None:
        raise ValueError(f"give either max_epochs or max_iters, not both (got max_epochs={max_epochs!r}, "
                         f"max_iters={max_iters!r})")
    if v.train_dataloader is not None:
        if max_epochs is None and max_iters is None:
            raise ValueError("training needs max_epochs (epoch-based) or max_iters (iteration-based); neither was given")
        if v.optimizer is None:
            raise ValueError("training needs an optimizer: an Optimizer object or e.g. dict(type='AdamW', lr=1e-3)")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable (outputs, targets) -> loss, got {type(loss_fn).__name__}")
    workflow = check_workflow(v.workflow, v.val_dataloader is not None) if v.workflow is not None else None
    if isinstance(v.work_dir, str) and not v.work_dir.strip():
        raise ValueError(f"work_dir={v.work_dir!r}; expected a directory path for the run's logs and checkpoints "
                         "(None: log to the console only)")
    if v.work_dir is not None and Path(v.work_dir).exists() and not Path(v.work_dir).is_dir():
        raise ValueError(f"work_dir={str(v.work_dir)!r} is a file; expected a directory for the run's logs and "
                         "checkpoints, or a path where one can be made")
    resume = v.resume
    if resume is True and v.work_dir is None:
        raise ValueError("resume=True looks for the latest checkpoint in work_dir, but work_dir is None")
    if resume is not True and resume is not False:
        if not Path(resume).exists():
            raise FileNotFoundError(f"resume={str(resume)!r}: no such checkpoint")
        check_resume_dir(Path(resume))
    if v.load_from is not None and not Path(v.load_from).exists():
        if "://" in str(v.load_from):  # MMEngine configs name released weights by URL
            raise FileNotFoundError(f"load_from={str(v.load_from)!r}: a URL; treadle reads local files only (nothing "
                                    "is downloaded during a run): download it first, e.g. with "
                                    "torch.hub.download_url_to_file(url, path), and give the path")
        raise FileNotFoundError(f"load_from={str(v.load_from)!r}: no such file or checkpoint")
    checkpoint = v.checkpoint
    precision, clip_grad = v.precision, v.clip_grad  # checked by their definitions (check_args)
    if v.loss_scale != "dynamic" and precision != "16":
        raise ValueError(f"loss_scale={v.loss_scale!r} needs precision='16' (fp16 with a GradScaler); "
                         f"precision={precision!r} scales no loss")
    return Args(
        args=v, loss_fn=loss_fn, metrics=check_metrics(metrics), hooks=hooks, workflow=workflow,
        test_metrics=check_metrics(test_metrics, "test_metrics") if test_metrics is not None else None,
        train_metrics=TrainMetrics(train_metrics, v.train_metrics_reset) if train_metrics else None,
        preemption=PreemptionConfig.build(v.preemption), precision=precision, clip_grad=clip_grad,
        optim_wrapper=trainer_optim_wrapper(v.optimizer, precision, v.accumulate, clip_grad, safe, v.loss_scale),
        activation_checkpointing=activation_checkpointing(v.activation_checkpointing, safe),
        guard=nan_guard_hook(v.nan_guard, v.log_interval),
        ema=ema_hook(v.ema) if v.ema is not None else None,
        checkpoint_hook=checkpoint_hook(checkpoint) if checkpoint is not None and checkpoint is not False else None)


def activation_checkpointing(value: Any, safe: bool = False) -> Any:
    """``activation_checkpointing`` as ``Strategy.prepare`` takes it: a ``check_fn`` that a
    config names (a dotted path, or ``{type: path, **kwargs}``) imported by the config
    layer (``safe``: refused there)."""
    if isinstance(value, Mapping) and isinstance(value.get("check_fn"), (str, Mapping)):
        from treadle.components.build import build_check_fn  # the config layer: only for a named function

        return {**value, "check_fn": build_check_fn(dict(value["check_fn"]) if isinstance(value["check_fn"], Mapping)
                                                    else value["check_fn"], "activation_checkpointing.check_fn",
                                                    safe=safe)}
    return value


def trainer_optim_wrapper(optimizer: Any, precision: str, accumulate: int, clip_grad: dict[str, Any] | None,
                          safe: bool = False, loss_scale: Any = "dynamic") -> Any:
    """The Trainer's ``optimizer`` (an Optimizer, a config dict, or a dict of those by
    name) with its ``precision``, ``accumulate``, ``clip_grad`` and ``loss_scale``, as the
    ``optim_wrapper`` that ``Strategy.prepare`` takes (each optimizer checked first:
    :func:`~treadle.components.build.check_optimizer_spec`)."""
    if optimizer is None:
        return None
    from treadle.components.build import check_optimizer_spec  # the builders' layer: imported when asked

    extra: dict[str, Any] = {"accumulative_counts": accumulate, "clip_grad": clip_grad}
    if precision != "32":
        extra["dtype"] = AUTOCAST_DTYPES[precision]
    if loss_scale != "dynamic":
        extra["loss_scale"] = loss_scale
    if isinstance(optimizer, Mapping) and by_name(optimizer):
        for name, cfg in optimizer.items():
            check_optimizer_spec(cfg, f"optimizer.{name}", safe=safe)
        return {str(name): {"optimizer": cfg, **extra} for name, cfg in optimizer.items()}
    check_optimizer_spec(optimizer, "optimizer", safe=safe)
    return {"optimizer": optimizer, **extra}


def build_model_and_data(a: Args, strategy: Any, *, safe: bool = False) -> tuple[nn.Module, tuple[Any, Any, Any]]:
    """The model and the three loaders, config dicts built after the strategy seeded (and
    the RNGs seeded again after, so that training's random streams do not depend on what
    building drew, as in a config run); loaders sharded across ranks."""
    v = a.args
    model: Any = v.model
    train, val, test = v.train_dataloader, v.val_dataloader, v.test_dataloader
    sets = {"val_dataloader": loader_sets(val), "test_dataloader": loader_sets(test)}  # several sets by name
    for arg, named in sets.items():
        if named is not None:
            check_set_names(named, arg)
    specs = any(isinstance(x, Mapping) for x in (model, train)) or any(
        isinstance(x, Mapping) for x, named in ((val, sets["val_dataloader"]), (test, sets["test_dataloader"]))
        if named is None) or any(isinstance(x, Mapping) for named in sets.values() for x in (named or {}).values())
    if specs:
        model = _model(model, v.init_weights, strategy, safe)
        train = from_spec(train, "dataloader", "train_dataloader", safe=safe)
        val = _loaders(val, sets["val_dataloader"], "val_dataloader", safe)
        test = _loaders(test, sets["test_dataloader"], "test_dataloader", safe)
    if v.init_weights and not isinstance(model, EmptyModel):  # before the RNGs are seeded again (not moving training's streams)
        _init_weights(model)
    if specs:
        if strategy.seed is not None:
            seed_everything(strategy.seed, rank=strategy.rank, per_rank=strategy.seed_per_rank)
    for arg, x, named in (("val_dataloader", val, sets["val_dataloader"]), ("test_dataloader", test,
                                                                           sets["test_dataloader"])):
        for name, one in (named.items() if named is not None else [(None, x)]):
            check_not_empty(one, arg if name is None else f"{arg}[{name!r}]")
    # Each rank reads its share: sharded where a hand-written loop's loaders are (the strategy).
    train = strategy.shard_dataloader(train)
    val, test = (({name: strategy.shard_dataloader(one, train=False) for name, one in x.items()}
                  if named is not None else strategy.shard_dataloader(x, train=False))
                 for x, named in ((val, sets["val_dataloader"]), (test, sets["test_dataloader"])))
    return model, (train, val, test)


def _init_weights(model: nn.Module) -> None:
    from treadle.components.build import call_init_weights

    if call_init_weights(model):
        get_logger().info(f"init_weights: called {type(model).__name__}.init_weights()")
    else:
        # As MMEngine's runner, whose configs set it (a translated config's default): no method, nothing to do.
        get_logger().info(f"init_weights: {type(model).__name__} has no init_weights(): its constructor's "
                          "weights stand, as under MMEngine's runner")


def _model(value: Any, init_weights: bool, strategy: Any, safe: bool) -> Any:
    """The model a spec describes; under a strategy that builds on the meta device
    (``strategy.builds_empty``), an :class:`EmptyModel` (its constructor and ``init_weights``
    recorded, not run: the strategy materializes each process's share)."""
    if not isinstance(value, Mapping) or not strategy.builds_empty:
        return from_spec(value, "model", "model", safe=safe)

    def build() -> Any:
        model = from_spec(value, "model", "model", safe=safe)
        if init_weights and isinstance(model, nn.Module):
            _init_weights(model)
        return model
    return record(build, what=str(value.get("type", "the model")))


def check_not_empty(loader: Any, arg: str) -> None:
    """An evaluation loader with a length must have a batch: one with none would log its
    metrics as nan, silently (a loader without a length is said once, after a pass that
    found no batch: treadle/engine/eval_loop.py)."""
    if loader is None:
        return
    try:
        batches = len(loader)
    except TypeError:  # no length (an IterableDataset's loader)
        return
    if batches == 0:
        dataset = getattr(loader, "dataset", None)
        try:
            samples = f" over {len(dataset)} sample(s)" if dataset is not None else ""
        except TypeError:
            samples = ""
        raise ValueError(f"{arg} has no batches (len 0{samples}: an empty dataset, or drop_last=True with fewer "
                         "samples than batch_size), so its metrics would be nan; expected a loader with at least "
                         "one batch, or no loader")


def _loaders(value: Any, sets: dict[str, Any] | None, arg: str, safe: bool) -> Any:
    """One loader, or several sets by name, each built from its spec when it is one."""
    if sets is None:
        return from_spec(value, "dataloader", arg, safe=safe)
    return {name: from_spec(one, "dataloader", f"{arg}.{name}", safe=safe) for name, one in sets.items()}


def default_hooks(a: Args, schedulers: dict[str, list[Any]] | None, phase_timer: Any, *, has_work_dir: bool,
                  is_main: bool) -> list[Hook]:
    """The Trainer's default hooks for its arguments (a user's hook of the same class
    replaces one of these): timer, logger, schedulers, EMA, checkpoints, NaN guard,
    train metrics, progress bar, phase timer."""
    v = a.args
    hooks: list[Hook] = [IterTimerHook(), LoggerHook(interval=v.log_interval, writers=tuple(v.log_writers))]
    if schedulers:
        hooks.append(ParamSchedulerHook(schedulers))
    if a.ema is not None:  # strategies that cannot keep an average refused it (check_trainer_options)
        hooks.append(a.ema)
    if v.checkpoint is None and has_work_dir and v.train_dataloader is not None:
        hooks.append(CheckpointHook(interval=None))  # the default: save when training ends
    elif a.checkpoint_hook is not None:
        hooks.append(a.checkpoint_hook)
    if a.guard is not None:
        hooks.append(a.guard)
    if a.train_metrics is not None:
        hooks.append(TrainMetricsHook(a.train_metrics))
    if progress_on(v.progress, is_main):
        from treadle.hooks.progress import ProgressBarHook  # imports rich: only when a bar is wanted

        hooks.append(ProgressBarHook(force_terminal=True if v.progress is True else None))
    if phase_timer is not None:
        hooks.append(PhaseTimerHook(phase_timer))
    return hooks
