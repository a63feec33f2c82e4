"""The Trainer: holds the components, checks them, runs the loops, dispatches hooks.

The flow itself lives in ``treadle/engine/loops.py``; the default step in ``treadle/engine/step.py``.
Its arguments are defined once, in ``treadle/engine/spec.py``; everything is checked in
``__init__`` (by those definitions, then by the builders of ``treadle/engine/args.py``), so a
bad argument fails before anything runs or is written.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch
from torch import nn

from treadle.checkpoint.checkpointer import Checkpointer
from treadle.checkpoint.io import CheckpointError, CheckpointWriteError
from treadle.components.errors import ConfigError
from treadle.data.feed import DataFeed, detached_copy
from treadle.distributed import comm, voice
from treadle.env import collect_env, format_env
from treadle.fsutil import settle
from treadle.hints import strict_loss_shapes
from treadle.hooks.base import HOOK_POINTS, Hook, HookDispatcher, check_hook_points, describe_order, get_priority, sort_hooks
from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.summary import model_summary
from treadle.hooks.ema import EMAHook
from treadle.logging.store import MetricStore
from treadle.logging.writers import CONSOLE_ONLY, FILE_ONLY, get_logger, log_details, log_failure
from treadle.engine.eval_loop import EvalComm, EvalLoop
from treadle.engine.loops import EpochLoop, IterLoop, TrainLoop, default_workflow
from treadle.metrics import place_metrics, update_metrics
from treadle.optim.scheduler_builder import SchedulerError
from treadle.optim.wrapper import OptimWrapper, make_autocast
from treadle.engine.preemption import INTERRUPTED_EXIT_CODE, PreemptionHandlers, agree_on_stop, requeue_slurm_job
from treadle.engine.resume import note_other_runs, resume_latest, weights_to_read
from treadle.engine.run_dir import RunDir, WorkDirError
from treadle.hooks.state import TrainState
from treadle.engine.mmengine_model import is_mmengine_model, model_eval_step, model_train_step
from treadle.engine.monitored import check_monitored, eval_values, result_names
from treadle.engine.step import make_eval_step, make_train_step, tell_if_outside_autocast
from treadle.strategies.build import resolve_strategy
from treadle.components.empty_init import EmptyModel
from treadle.hooks.phase_timer import PhaseTimer
from treadle.engine.args import (build_args, build_model_and_data, default_hooks, warn_if_unpinned,
                                  warn_without_validation)
from treadle.engine.argspec import document, takes
from treadle.engine.spec import TrainerArgs
from treadle.engine import resume_changes, snapshot
from treadle.engine.resume_changes import ResumeChange


_F = TypeVar("_F", bound=Callable[..., Any])

#: What building a Trainer raises for a mistake in its arguments (the errors ``treadle train``
#: says as config errors, treadle/config/assemble.py): every process of a job meets it alike.
_ARGUMENT_ERRORS = (ValueError, TypeError, KeyError, FileNotFoundError, NotImplementedError, CheckpointError)
#: What fit, validate and test raise for a run that cannot go as asked (a resume that does not
#: fit, a work_dir another run holds): the command line's status-2 errors.
_REFUSALS = (ConfigError, CheckpointError, WorkDirError)


def _said_once(where: str, kinds: tuple[type[BaseException], ...]) -> Callable[[_F], _F]:
    """Decorate an entry point of the Trainer (``where`` names it): in a process of a job
    of several, an error of ``kinds`` it raises is a mistake every process meets alike,
    which, uncaught, is said in one line that names it, once for the job, as ``treadle
    train`` says a config error (treadle/distributed/voice.py: the exception hook,
    installed here before anything is read; ``TREADLE_FULL_TRACEBACK=1``: the traceback,
    once). In one process, Python prints it as usual."""
    def decorate(f: _F) -> _F:
        @functools.wraps(f)
        def said_once(*args: Any, **kwargs: Any) -> Any:
            if voice.job_size() < 2:
                return f(*args, **kwargs)
            voice.install_excepthook()
            try:
                return f(*args, **kwargs)
            except kinds as e:
                if not isinstance(e, CheckpointWriteError):  # a full disk: a failure of the run, its traceback
                    voice.mark_config_error(e, f"treadle: config error in {where}: {_described(e)} "
                                               f"({voice.FULL_TRACEBACK_ENV}=1 prints its traceback)")
                raise
        return said_once  # type: ignore[return-value]  # f's signature, wrapped
    return decorate


def _described(error: BaseException) -> str:
    """``error`` in a line: a ConfigError's own text (it names the key), else its type and message."""
    if isinstance(error, ConfigError):
        return str(error)
    text = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else error
    return f"{type(error).__name__}: {text}"


@document(TrainerArgs)  # the docstring's Args section: each argument's doc (treadle/engine/spec.py)
class Trainer:
    """Train, validate and test a model.

    The arguments (the public contract: docs/trainer.md) are defined once, with their
    types, defaults, meanings and checks, as the fields of
    `treadle.engine.spec.TrainerArgs`; the Args section below is written from them.

    Config dicts: ``model``, the three dataloaders, ``loss_fn``, each metric and each
    hook may also be given as the dict a config file would hold, e.g.
    ``model=dict(type="DigitsCNN", width=32)`` or ``train_dataloader=dict(dataset=dict(type="digits"),
    batch_size=64, shuffle=True)``; they are built as ``treadle train`` builds them
    (treadle/components/build.py), model and data after seeding.

    The run directory (treadle/engine/run_dir.py): ``fit()``, ``validate()`` and ``test()`` lock
    ``work_dir`` (a second run there is refused); ``fit()`` writes ``env.txt`` and the
    files in ``run_files`` (``treadle train`` puts ``config.yaml`` there) once the resume
    checks have passed, moving an earlier different one aside; ``checkpoint_path(name)``
    is where a checkpoint name lands without replacing what another run saved.
    """

    @_said_once("Trainer(...)", _ARGUMENT_ERRORS)  # a mistake in the arguments: one line for the job
    @takes(TrainerArgs)  # Trainer(model, work_dir=None, ...): TrainerArgs's fields, received as one object
    def __init__(self, args: TrainerArgs) -> None:
        a = build_args(args)  # every argument checked (engine/spec.py), config dicts of components built
        self._keep_settings(a)
        self.strategy = resolve_strategy(a.args.strategy)  # built once, by the argument's check
        self._start_processes(a)  # process group, run id and seeds: before anything is built
        model = self._build_model_and_data(a)  # after seeding: initial weights repeat
        load_from = weights_to_read(a.args.load_from, self.module, isinstance(model, EmptyModel), self.is_main)
        self._prepare(a, model, load_from)  # placed, wrapped, optimized: the public Strategy API
        self._set_steps(a)
        self._build_hooks_and_loops(a)

    # -- construction steps --------------------------------------------------------
    def _keep_settings(self, a: Any) -> None:
        """The checked arguments that the loops and steps read later."""
        args = a.args
        self.precision, self.clip_grad, self.metrics, self.workflow = a.precision, a.clip_grad, a.metrics, a.workflow
        self.test_metrics = a.test_metrics if a.test_metrics is not None else a.metrics  # test passes
        self.preemption, self.verbose, self.resume = a.preemption, args.verbose, args.resume
        self.seed_per_sample = args.seed_per_sample  # the loaders' DataFeeds (treadle/data/worker_seed.py)
        self.move_batch = args.move_batch
        self.accumulate_across_epochs = args.accumulate_across_epochs  # the train loop's (treadle/engine/loops.py)
        self._limits = {"train": args.limit_train_batches, "val": args.limit_val_batches,
                        "test": args.limit_test_batches}  # batches per epoch or pass (None: all)
        self.train_metrics = a.train_metrics  # None unless given (treadle/hooks/train_metrics.py)
        self.loss_fn, self.val_interval, self.log_interval = a.loss_fn, args.val_interval, args.log_interval
        self.work_dir = Path(args.work_dir) if args.work_dir is not None else None
        # Written into work_dir once fit's resume checks pass (run_dir.py); a callable's text is
        # made then, so that it may say what the resume kept (resume_changes).
        self.run_files: dict[str, str | Callable[[], str]] = {}
        self.resume_changes: list[ResumeChange] = []  # settings a resume found changed (resume_changes.py)
        self.store = MetricStore()
        self._resume_loaded = False  # validate/test load `resume` too, unless fit already did
        self._summarized = False  # the model's summary is logged at the first run
        self._seed_drawn = args.seed is None  # said with the model's summary, at the first run

    def _start_processes(self, a: Any) -> None:
        """The process group, the run's id and the seeds (seed=None: rank 0 draws one and
        every rank seeds with it, MMEngine's rule; it is logged, and passing it as seed=
        repeats the run); the strategy refuses what it cannot honour."""
        args = a.args
        self.strategy.setup_env(seed=args.seed, seed_per_rank=args.seed_per_rank, deterministic=args.deterministic)
        self.strategy.check_trainer_options({"ema": a.ema, "compile": args.compile, "checkpoint": args.checkpoint})
        self.run_timestamp = self.strategy.timestamp
        self.seed = args.seed if args.seed is not None else self.strategy.seed
        self.run_dir = RunDir(self.work_dir, self.is_main) if self.work_dir is not None else None

    def _build_model_and_data(self, a: Any) -> Any:
        """The model (an :class:`EmptyModel` when the strategy builds it on the meta
        device) and the loaders, then the training state that counts their batches."""
        args = a.args
        model, loaders = build_model_and_data(a, self.strategy, safe=args.safe)
        self.train_dataloader, self.val_dataloader, self.test_dataloader = loaders
        self.module = model.module if isinstance(model, EmptyModel) else model  # the user's module, unwrapped
        self.state = TrainState(max_epochs=args.max_epochs, max_iters=args.max_iters, by_epoch=args.max_iters is None)
        if self.train_dataloader is not None:
            self.state.set_epoch_length(DataFeed(self.train_dataloader, limit=args.limit_train_batches).length)
        return model

    def _prepare(self, a: Any, model: Any, load_from: Any) -> None:
        """``strategy.prepare``, as a hand-written loop calls it: the model placed, wrapped
        (and compiled; a model built on the meta device materialized, ``load_from`` read
        into its shards), the optimizer wrappers and schedulers built over it."""
        s, strategy, args = self.state, self.strategy, a.args
        try:
            strategy.prepare(
                model, optim_wrapper=a.optim_wrapper, load_from=load_from,
                param_scheduler=(args.schedulers or None) if a.optim_wrapper else None, compile=args.compile,
                auto_scale_lr=args.auto_scale_lr if a.optim_wrapper else None,
                activation_checkpointing=a.activation_checkpointing,
                dispatch_kwargs=dict(epoch_length=s.iters_per_epoch, max_epochs=s.max_epochs, max_iters=s.max_iters,
                                     train_micro_batch_size_per_gpu=getattr(self.train_dataloader, "batch_size", None)))
        except SchedulerError as e:  # named by the Strategy's argument (param_scheduler): by this one's
            raise e.renamed("schedulers") from None
        self.model = strategy.model
        self.optim_wrappers: dict[str, OptimWrapper] = strategy.optim_wrappers
        # Several processes: after each iteration the ranks agree on stopping (None: one process).
        self._agree_stop = functools.partial(agree_on_stop, self.state) if strategy.distributed else None
        self._move = strategy.batch_mover() if self.move_batch else None
        train = self.train_metrics.metrics if self.train_metrics is not None else {}
        evaluation = {id(m): m for m in [*(self.metrics or {}).values(), *(self.test_metrics or {}).values()]}
        place_metrics([*evaluation.values(), *train.values()], strategy.device, strategy.layout)
        if strategy.device.type == "cuda" and self.is_main:
            warn_if_unpinned(self.train_dataloader)
        watch = comm.stall_watch()  # the stall watch judges this trainer's runs (see _run)
        if watch is not None:
            watch.set_active(False)

    def _build_hooks_and_loops(self, a: Any) -> None:
        """The default hooks and the user's, sorted; then the evaluation loops (a best or
        monitored key validation never produces is refused now) and the train loop, whose
        place goes to the checkpoint's data entry (snapshot.py)."""
        args = a.args
        self.hooks: list[Hook] = []
        self._dispatch = HookDispatcher()  # the loops get it when they are built
        self.train_loop: TrainLoop | None = None
        self._phase_timer = PhaseTimer(self.strategy.device) if args.timer_breakdown else None  # before the train step
        scheds = self.strategy.param_schedulers
        scheds = scheds if isinstance(scheds, dict) else {"default": scheds}  # by optimizer name
        self._set_hooks(default_hooks(a, scheds if args.schedulers else None, self._phase_timer,
                                      has_work_dir=args.work_dir is not None, is_main=self.is_main), a.hooks)
        if self.train_dataloader is not None and self.val_dataloader is None and self.is_main:
            warn_without_validation(self.hooks)
        self.val_loop = self._eval_loop(self.val_dataloader, "val") if self.val_dataloader is not None else None
        if self.val_loop is not None:
            custom = self.val_loop.custom_step
            check_monitored(self.hooks, result_names(self.metrics or {}), *eval_values(
                self.module, self.loss_fn, custom, custom is not None and is_mmengine_model(self.module)
                and type(self).val_step is Trainer.val_step), sets=self.val_loop.set_names)
        self.test_loop = self._eval_loop(self.test_dataloader, "test") if self.test_dataloader is not None else None
        self.train_loop = self._train_loop() if self.train_dataloader is not None else None
        if self.train_loop is not None:
            self.strategy.track_loader(snapshot.LoopPlace(self.train_loop))

    def _set_steps(self, a: Any) -> None:
        """The model's own ``train_step``/``val_step`` when it has them, and the default
        evaluation step (the training step is chosen once, with the train loop: _select_train_step)."""
        self._custom_train_step = model_train_step(self.module)  # treadle's or MMEngine's signature
        if is_mmengine_model(self.module) and self.model is not self.module and len(self.optim_wrappers) > 1:
            raise ValueError(f"{type(self.module).__name__} is an MMEngine model with several optimizers "
                             f"({sorted(self.optim_wrappers)}) under a strategy that wraps it ({type(self.model).__name__}"
                             "): MMEngine steps those with a wrapper per submodule, which treadle does not have; train "
                             "it with strategy fsdp, in one process, or write model.train_step(batch, trainer)")
        self._default_step = (type(self).train_step is Trainer.train_step and self._custom_train_step is None
                              and bool(self.optim_wrappers))
        if len(self.optim_wrappers) > 1 and self._custom_train_step is None and type(self).train_step is Trainer.train_step:
            raise ValueError(f"several optimizers {sorted(self.optim_wrappers)} need a custom step: define "
                             "model.train_step(batch, trainer) that uses trainer.optim_wrappers[name]")
        autocast = make_autocast(self.precision, self.strategy.device.type)
        self._eval_step = make_eval_step(self.strategy.eval_module, a.loss_fn, autocast, self._move, module=self.module,
                                         loss_parallel=self.strategy.loss_parallel)

    def _set_hooks(self, defaults: list[Hook], extra: Iterable[Hook]) -> None:
        """Defaults plus the user's hooks (a hook of a default's class replaces it)."""
        extra = list(extra)
        replaced = {type(h) for h in extra}
        self.hooks = sort_hooks([h for h in defaults if type(h) not in replaced] + extra)
        self._rebuild_dispatch()

    @property
    def ema(self) -> nn.Module | None:
        """The averaged model when ``ema=`` is on (built at the first run)."""
        for h in self.hooks:
            if isinstance(h, EMAHook):
                return h.ema.module if h.ema is not None else None
        return None

    def register_hook(self, hook: Hook) -> None:
        """Add one hook after construction."""
        if not isinstance(hook, Hook):
            raise TypeError(f"register_hook(hook={hook!r}); expected a treadle.Hook instance")
        get_priority(hook.priority)
        check_hook_points(hook, "register_hook(hook)")
        self.hooks = sort_hooks([*self.hooks, hook])
        self._rebuild_dispatch()

    def _train_loop(self) -> TrainLoop:
        s = self.state
        feed = DataFeed(self.train_dataloader, seed=self.strategy.data_seed, rank=self.strategy.dp_rank,
                        limit=self._limits["train"],
                        seed_per_sample=self.seed_per_sample)
        total = s.max_epochs if s.by_epoch else s.max_iters
        workflow = self.workflow or default_workflow(s.by_epoch, self.val_interval, self.val_loop is not None, total)  # type: ignore[arg-type]  # max_epochs or max_iters: args.py requires one
        loop_cls = EpochLoop if s.by_epoch else IterLoop
        return loop_cls(self, feed, workflow, hooks=self._dispatch, state=s, optim_wrappers=self.optim_wrappers,
                        step=self._select_train_step(), store=self.store, val_loop=self.val_loop,
                        agree=self._agree_stop,
                        world_size=self.strategy.world_size, data_world=self.strategy.dp_size,
                        tp=self.strategy.tp_size, accumulate_across_epochs=self.accumulate_across_epochs)

    def _eval_loop(self, loader: Any, mode: str) -> EvalLoop:
        strategy = self.strategy
        comm = (EvalComm(strategy.rank, strategy.eval_in_lockstep, strategy.layout.data_object_group)
                if strategy.distributed else None)
        return EvalLoop(self, loader, mode, hooks=self._dispatch, state=self.state, model=self.model,
                        metrics=self.test_metrics if mode == "test" else self.metrics, step=self._eval_step, seed=self.seed,
                        custom_step=self._custom_eval_step(mode),
                        seed_per_sample=self.seed_per_sample, comm=comm, limit=self._limits[mode])

    def _custom_eval_step(self, mode: str) -> Callable[[Any], dict[str, Any]] | None:
        """The user's evaluation step, or None for the default one: a subclass's
        ``test_step``/``val_step`` (``step(batch)``) before the model's
        (``model.test_step(batch, trainer)``); a test pass takes a ``test_step`` first and
        falls back to the ``val_step``. Each gets the batch moved (``move_batch``) and
        returns values to average over the pass (or None)."""
        move = self._move or (lambda batch: batch)
        for name in (("test_step", "val_step") if mode == "test" else ("val_step",)):
            if getattr(type(self), name) is not getattr(Trainer, name):  # overridden in a subclass
                own = getattr(self, name)
                return lambda batch: own(move(batch)) or {}
            model_step = model_eval_step(self.module, name)  # treadle's or MMEngine's signature
            if model_step is not None:
                return lambda batch: model_step(move(batch), self) or {}
        return None

    def _rebuild_dispatch(self) -> None:
        """The hooks' dispatch table, and from it the optimizer wrappers' callbacks
        (``after_backward``, ``before_optimizer_step``); the default step's timer marks the
        end of backward first. The train step itself never changes."""
        self._dispatch.rebuild(self.hooks)
        table = self._dispatch.table
        timer = self._phase_timer if self._default_step else None
        marks = (timer.mark,) if timer is not None else ()
        after_backward = marks + tuple(functools.partial(fn, self) for fn in table["after_backward"])
        before_step = tuple(functools.partial(fn, self) for fn in table["before_optimizer_step"])
        for ow in self.optim_wrappers.values():
            ow.after_backward_callbacks = after_backward
            ow.before_step_callbacks = before_step

    def _select_train_step(self) -> Callable[[Any], dict[str, Any]]:
        """The train step, chosen once: a subclass's ``train_step``, the model's
        ``train_step(batch, trainer)``, or the default step (treadle/engine/step.py); each
        gets the batch moved to the device (``move_batch``)."""
        move = self._move
        if not self._default_step and self.optim_wrappers:  # the user's step: it must autocast itself
            tell_if_outside_autocast(self.module, self.precision, self.strategy.device.type,
                                     lambda: self.state.mode == "train")
        if type(self).train_step is not Trainer.train_step:  # overridden in a subclass
            own = self.train_step
            return own if move is None else (lambda batch: own(move(batch)))
        if self._custom_train_step is not None:
            step = self._custom_train_step
            if move is None:
                return lambda batch: step(batch, self) or {}
            return lambda batch: step(move(batch), self) or {}
        if not self.optim_wrappers:
            return self.train_step
        feed = self.train_metrics.update if self.train_metrics is not None else None
        if feed is not None and self.loss_fn is None:
            raise ValueError("train_metrics need the model's outputs, which the default step has only with a loss_fn "
                             "(without one the model returns its losses): give loss_fn=, or define "
                             "model.train_step(batch, trainer) and call trainer.update_train_metrics(outputs, targets)")
        return make_train_step(self.model, self.loss_fn, self.optim_wrapper, self._move, timer=self._phase_timer,
                               feed=feed, module=self.module, loss_parallel=self.strategy.loss_parallel)

    def call_hook(self, point: str, *args: Any) -> None:
        """Call every hook's ``point`` method (e.g. "before_save_checkpoint"), in priority order."""
        self._dispatch.call(point, self, *args)

    # -- accessors -----------------------------------------------------------------
    @property
    def optim_wrapper(self) -> OptimWrapper:
        """The optimizer wrapper when there is exactly one."""
        if len(self.optim_wrappers) != 1:
            raise AttributeError(f"there are {len(self.optim_wrappers)} optimizers ({sorted(self.optim_wrappers)}); "
                                 "use trainer.optim_wrappers[name]")
        return next(iter(self.optim_wrappers.values()))

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.optim_wrapper.optimizer

    @property
    def is_main(self) -> bool:
        return self.strategy.is_main

    @property
    def run_id(self) -> str:
        """This run's id, recorded in its checkpoints; a resume carries the saved one on
        (held by the strategy, see treadle/strategies/states.py RunState)."""
        return self.strategy.run_id

    @property
    def learning_rates(self) -> dict[str, float]:
        """``lr`` of every optimizer and param group now, keyed as logged (``lr``, ``lr/pg1``;
        ``lr/<optimizer>`` with several): a property like ``optimizer``."""
        out: dict[str, float] = {}
        single = len(self.optim_wrappers) == 1
        for name, ow in self.optim_wrappers.items():
            prefix = "lr" if single else f"lr/{name}"
            for i, lr in enumerate(ow.get_lr()):
                out[prefix if i == 0 else f"{prefix}/pg{i}"] = lr
        return out

    def train_step(self, batch: Any) -> dict[str, Any]:
        """Override in a subclass to replace the default step (return values to log)."""
        raise RuntimeError("no optimizer was given, so there is no training step")

    def log(self, name: str, value: torch.Tensor | float) -> None:
        """Log a scalar from a step or a hook: kept as it is (a device tensor stays on the
        device, no host read) and averaged into the next train record with the losses,
        over the iterations of its log interval (and over ranks)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"trainer.log(name={name!r}, ...): the name must be a non-empty str")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"trainer.log({name!r}, ...): a tensor of shape {tuple(value.shape)}; expected one "
                                 "value (e.g. .mean() it first)")
            value = value.detach()
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"trainer.log({name!r}, value={value!r}): expected a number or a one-element tensor")
        self.store.put(name, value)

    def val_step(self, batch: Any) -> dict[str, Any] | None:
        """Override in a subclass to replace the default validation step (and the test
        step, unless ``test_step`` is overridden too): feed the metrics with
        :meth:`update_metrics`; return values to average over the pass, or None."""
        raise NotImplementedError  # never called unless overridden (_custom_eval_step)

    def test_step(self, batch: Any) -> dict[str, Any] | None:
        """Override in a subclass to replace the default test step (as :meth:`val_step`)."""
        raise NotImplementedError  # never called unless overridden (_custom_eval_step)

    def forward_eval(self, batch: Any) -> Any:
        """The validation step on one batch, as a validation pass runs it (the default step,
        or the model's or a subclass's ``val_step``), without gradients and in the model's
        current mode (PreciseBNHook runs it in training mode); returns what the step returns.
        Metrics are not updated by the default step."""
        custom = self._custom_eval_step("val")
        with torch.no_grad():
            return custom(batch) if custom is not None else self._eval_step(batch)

    def training_batches(self, epoch: int) -> Iterator[Any]:
        """This process's training batches of epoch ``epoch`` (from 0), in that epoch's
        order, read through a copy of the loader: the training loop's place does not move."""
        if self.train_loop is None:
            raise ValueError("training_batches() needs a train_dataloader")
        feed = DataFeed(detached_copy(self.train_dataloader), seed=self.train_loop.feed.seed,
                        rank=self.strategy.dp_rank, seed_per_sample=self.seed_per_sample)
        feed.start_epoch(epoch)
        try:
            yield from feed
        finally:
            feed.close()

    def update_metrics(self, outputs: Any, targets: Any) -> None:
        """For custom val steps: feed every metric of this pass (``test_metrics`` in a test
        pass; 16-bit float outputs as float32)."""
        metrics = self.test_metrics if self.state.mode == "test" else self.metrics
        update_metrics(metrics, outputs, targets, self.state.mode, "test_metrics" if metrics is not self.metrics
                       else "metrics")

    def update_train_metrics(self, outputs: Any, targets: Any) -> None:
        """For custom train steps: feed every train metric one batch (on the device, no host
        read; 16-bit float outputs as float32). Nothing happens without ``train_metrics``."""
        if self.train_metrics is not None:
            self.train_metrics.update(outputs, targets)

    # -- entry points ------------------------------------------------------------------
    @_said_once("fit()", _REFUSALS)
    def fit(self) -> dict[str, Any]:
        """Train per the workflow (validating as configured); returns the last metrics.

        With ``resume``, first restores the latest (or the given) checkpoint and
        continues exactly where it stopped. On a preemption signal, saves at the next
        iteration boundary and exits with the preemption exit code (SystemExit).
        """
        if self.train_dataloader is None:
            raise ValueError("fit() needs a train_dataloader")
        with self._locked():
            try:
                result = self._fit()
            except BaseException:
                settle(raise_errors=False)  # the run's own error is the one to raise
                raise
            settle()  # env.txt and the run files are durable and in place (written later: run_dir.py)
            return result

    def _fit(self) -> dict[str, Any]:
        # Nothing in work_dir changes before the resume checks pass (a misfit is refused first).
        loop = self.train_loop
        assert loop is not None  # fit() checked train_dataloader
        loop.reset()  # a resume below sets where it goes on
        resumed = self._resume() if self.resume else None
        pos = loop.resume_pos
        self._resume_loaded = True
        s = self.state
        trained = s.iter >= s.max_iters if s.max_iters else s.epoch >= s.max_epochs  # type: ignore[operator]  # no max_iters: max_epochs is set
        finished = pos is not None and trained and not (pos["open"] or pos.get("val_due"))  # else: finish the last cycle
        if resumed is not None:  # one line: where training goes on, or that there is nothing left (1-based, as the log lines)
            get_logger().info(f"resumed from {resumed}: " + (
                f"the run already finished (epoch {s.epoch}, iter {s.iter}); nothing to do" if finished else
                f"{s.iter} iterations done, training goes on in epoch {s.epoch + 1}"))
            for change in self.resume_changes:  # one line per setting that differs from the checkpoint's run
                (get_logger().warning if change.kept_from_checkpoint else get_logger().info)(change.line())
        env = None  # the environment table: env.txt, and log.txt once the run starts
        if self.run_dir is not None:
            if self.is_main:
                env = format_env(collect_env(seed=self.seed, world_size=self.strategy.world_size))
                files = {name: text() if callable(text) else text for name, text in self.run_files.items()}
                self.run_dir.write_files({"env.txt": env + "\n", **files})
                if not resumed:
                    note_other_runs(self.work_dir / "checkpoints")  # type: ignore[operator]  # a run_dir means a work_dir
            self._check_checkpoint_dirs()
        if finished:
            return dict(s.metrics)
        self.model.train()
        handlers = (PreemptionHandlers(self.preemption, s, deferred=self.strategy.distributed, verbose=self.is_main)
                    if self.preemption else contextlib.nullcontext())
        with handlers:
            self._run(self._train_and_save_on_preemption, env=env)
        self.strategy.finish_saves()  # FSDP: an asynchronous save still in flight
        if s.preempted and self.preemption is not None:
            if s.interrupted:  # Ctrl-C: the user stopped it; nothing to requeue
                raise SystemExit(INTERRUPTED_EXIT_CODE)
            if self.preemption.requeue and self.is_main:
                requeue_slurm_job()
            raise SystemExit(self.preemption.exit_code)
        return dict(s.metrics)

    def _train_and_save_on_preemption(self) -> None:
        self.train_loop.run()  # type: ignore[union-attr]  # fit() checked train_dataloader
        s = self.state
        if s.preempted and self.work_dir is not None:
            path = self.save_checkpoint(self.checkpoint_path(f"iter_{s.iter:08d}"))
            comm.barrier()  # the other ranks exit only once rank 0's save is complete
            if self.is_main:
                how = (f"treadle train {self.work_dir / 'config.yaml'} --resume" if "config.yaml" in self.run_files
                       else f"resume=True with work_dir={str(self.work_dir)!r}")
                get_logger().warning(f"{s.stop_reason}: saved {path} at iteration {s.iter}; continue with {how}")
        elif s.preempted and self.is_main:
            get_logger().warning(f"{s.stop_reason}: stopped at iteration {s.iter}; nothing saved (no work_dir)")

    # -- the run directory (treadle/engine/run_dir.py) -----------------------------------------
    def _locked(self) -> Any:
        """fit/validate/test hold work_dir's lock: a second run there is refused at once."""
        return self.run_dir.locked(self.run_id) if self.run_dir is not None else contextlib.nullcontext()

    def _check_checkpoint_dirs(self) -> None:
        """Before training: every directory a checkpoint will be written to can take one."""
        checkpoint_hooks = [h for h in self.hooks if isinstance(h, CheckpointHook)]
        names = [""] if checkpoint_hooks or self.preemption is not None else []
        if any(h.best is not None for h in checkpoint_hooks):
            names.append("best")
        # Made now where a CheckpointHook will save; probed where only a preemption might.
        self.run_dir.check_checkpoint_dirs(names, create=bool(checkpoint_hooks))  # type: ignore[union-attr]  # _fit calls it only with a run_dir

    def checkpoint_path(self, name: str) -> Path:
        """Where this run saves the checkpoint it calls ``name`` (e.g. "epoch_0003", or
        "best/best_val_acc_00000120"): ``work_dir/checkpoints/<name>``, or ``<name>-v1``,
        ``<name>-v2``, ... when that name holds something this run did not save: another
        run's checkpoint is never replaced. Every rank gets rank 0's answer."""
        if self.run_dir is None:
            raise ValueError("checkpoint_path() needs a work_dir")
        return self.run_dir.checkpoint_path(name, self.run_id)

    # -- checkpoints -------------------------------------------------------------------
    @property
    def checkpointer(self) -> Checkpointer:
        """Saves and loads through the strategy (the same one your own loop uses)."""
        return self.strategy.checkpointer

    def checkpoint_states(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(states, rank_states)``: the owners of this trainer's training state by name,
        as the checkpointer takes them (the layout: treadle/engine/snapshot.py)."""
        return snapshot.trainer_states(self)

    def save_checkpoint(self, path: str | Path, writer: Callable[..., Path] | None = None) -> Path:
        """Save the complete state (atomic; treadle/engine/snapshot.py lists what is in it).

        ``writer``: replaces ``treadle.checkpoint.io.save_checkpoint`` on rank 0, e.g. an
        ``AsyncCheckpointer`` (which returns once the state is copied to CPU memory).
        """
        return snapshot.save(self, path, writer)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the complete state from ``path``. Every owner checks its part first: a
        checkpoint that does not fit this trainer changes nothing."""
        snapshot.load(self, path)

    def _load_resume(self) -> None:
        """validate()/test() before any fit start from what ``resume`` names, as fit does
        (MMEngine's val/test resume too); after a fit they use the trained weights."""
        if self.resume and not self._resume_loaded:
            path = self._resume()
            self._resume_loaded = True
            if path is not None:
                get_logger().info(f"resumed from {path}: {self.state.iter} iterations done")

    def _resume(self) -> Path | None:
        """Load the checkpoint ``resume`` names and return its path; None when
        ``resume=True`` finds none."""
        loop = self.train_loop
        before = resume_changes.settings(self.optim_wrappers, self.state, loop.batch_size if loop else None,
                                         None if self._seed_drawn else self.seed)
        if self.resume is True:  # an unloadable latest falls back to the previous verified one (resume.py)
            path = resume_latest(self.work_dir / "checkpoints", self.is_main, self.load_checkpoint)  # type: ignore[operator]  # resume=True needs a work_dir (args.py)
            if path is None:
                return None
        else:
            path = Path(self.resume)
            self.load_checkpoint(path)
        self.resume_changes = resume_changes.compare(before, self.optim_wrappers, loop.resume_pos if loop else None)
        return path

    @_said_once("validate()", _REFUSALS)
    def validate(self) -> dict[str, Any]:
        """One pass over ``val_dataloader``; returns ``{"val/<name>": value}``. Before any
        ``fit()``, the checkpoint ``resume`` names is loaded first."""
        if self.val_loop is None:
            raise ValueError("validate() needs a val_dataloader")
        with self._locked():
            self._load_resume()
            return self._run(self.val_loop.run)

    @_said_once("test()", _REFUSALS)
    def test(self) -> dict[str, Any]:
        """One pass over ``test_dataloader``; returns ``{"test/<name>": value}`` (from the
        ``resume`` checkpoint, as :meth:`validate`)."""
        if self.test_loop is None:
            raise ValueError("test() needs a test_dataloader")
        with self._locked():
            self._load_resume()
            return self._run(self.test_loop.run)

    def saved_note(self) -> str:
        """What a failure now leaves saved, in the words of a failure's last line."""
        return self.run_dir.saved_note() if self.run_dir is not None else "nothing is saved (no work_dir)"

    def _run(self, body: Callable[[], Any], env: str | None = None) -> Any:
        # work_dir exists: every caller holds its lock (_locked), which made it.
        self.state.should_stop = False
        watch = comm.stall_watch()
        if watch is not None:  # the watch judges progress while this run goes on (the loops tell it where they are)
            watch.follow(None, work_dir=self.work_dir)
            watch.set_active(True)
        try:
            return self._run_hooked(body, env)
        finally:
            if watch is not None:
                watch.set_active(False)

    def _run_hooked(self, body: Callable[[], Any], env: str | None) -> Any:
        self.call_hook("before_run")
        try:
            if self.is_main:  # to log.txt, one console line (treadle/logging/writers.py)
                log_details({**({"environment": f"environment:\n{env}"} if env else {}),
                             "hook order": describe_order(self.hooks)}, verbose=self.verbose)
                self._summarize_model()
            with strict_loss_shapes():  # torch's loss broadcasting warning is an error (treadle/hints.py)
                result = body()
        except BaseException as error:
            if isinstance(error, Exception):
                log_failure(error, self.state.position())  # the full traceback, to log.txt only
            self._dispatch.call_all("after_run", self, error)
            raise  # the body's error, not a later one of an after_run hook (logged and noted on it)
        finally:
            self._close_feeds()
        self._dispatch.call_all("after_run", self, None)
        return result

    def _summarize_model(self) -> None:
        """At the first run: the model's parameters (all, trainable, frozen) and size on
        the console; its table by module to log.txt (on the console too with ``verbose``)."""
        if self._summarized:
            return
        self._summarized = True
        table = model_summary(self.module, max_depth=2)
        totals = table.splitlines()[-1]
        logger = get_logger()
        if self._seed_drawn:
            logger.info(f"seed: {self.seed} (drawn, as seed=None asks; seed={self.seed} repeats this run)")
        if self.verbose or "\n" not in table:
            logger.info(f"model:\n{table}" if "\n" in table else f"model: {totals}")
            return
        logger.info(f"model:\n{table}", extra=FILE_ONLY)
        logger.info(f"model: {totals}", extra=CONSOLE_ONLY)

    def _close_feeds(self) -> None:
        """Stop the loaders' worker processes when a run ends (see DataFeed.close)."""
        if self.train_loop is not None:
            self.train_loop.feed.close()
        for loop in (self.val_loop, self.test_loop):
            if loop is not None:
                loop.close()




__all__ = ["Trainer", "HOOK_POINTS"]
