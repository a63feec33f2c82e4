"""The public Strategy API (MMEngine's ``BaseStrategy`` contract), for your own loop.

Every Strategy (single device, DDP, FSDP) has these methods; the flow of a loop::

    strategy = treadle.build_strategy("ddp", work_dir="runs/x", seed=0)   # process group, seeds
    model, optim_wrapper, schedulers = strategy.prepare(model, optim_wrapper=..., param_scheduler=...)
    loader = strategy.prepare_dataloader(loader)     # sharded, seeded, its place checkpointed
    extra = strategy.load_or_resume(resume=True)     # None, or the extra_ckpt of the checkpoint
    for batch in loader: ...
        optim_wrapper.update_params(loss)
        strategy.save_checkpoint(path, extra_ckpt={...})

This is the one checkpoint layout (format 3): the Trainer saves and resumes through
these same calls, handing its own parts by name. A checkpoint is a treadle checkpoint
directory (atomic, verified, ``weights_only``), written by
:class:`treadle.checkpoint.checkpointer.Checkpointer`. ``state.pt`` holds (each entry's
owner: treadle/strategies/states.py)::

    model             the module's state (FSDP: sharded, in DCP files): a flat state dict
                      of every parameter and persistent buffer, less the parameters that
                      do not train unless saved with ``save_frozen=True``
    frozen            the digests of the parameters that do not train, and whether
                      ``model`` holds them (treadle/checkpoint/frozen.py)
    optim             {"default": OptimWrapper state}  (optimizer, scaler, accumulation;
                      by name for several wrappers)
    param_schedulers  [scheduler.state_dict(), ...]    (a dict of lists by name for several)
    data              [ResumableLoader.state_dict(), ...]  one per tracked training loader
    extra             the ``extra_ckpt`` dict ({} for the Trainer)
    strategy          {"run", "world_size", "treadle"}
    <part>            each named part handed to ``save_checkpoint(parts=...)``: the
                      Trainer's ``loop``, ``hooks``, ``results`` (treadle/engine/snapshot.py)

and each ``rng_rank<r>.pt`` that rank's RNGs and, under ``rank_state``, its own share:
``optim`` (an open accumulation window's gradients, its own under DDP's ``no_sync``) and
each part of ``rank_parts``. ``resume`` restores all of it, RNG last, so the next batch
and the next random draw are those an uninterrupted run would have had; the parts it was
not handed (a Trainer checkpoint's, in a hand-written loop) come back with ``extra``.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from treadle.checkpoint.checkpointer import Checkpointer
from treadle.checkpoint.io import CheckpointError
from treadle.checkpoint.model_info import describe_model
from treadle.checkpoint.rng import set_rng_state
from treadle.data.distributed import shard_eval_loader, shard_train_loader
from treadle.data.resumable import ResumableLoader
from treadle.distributed import comm
from treadle.distributed.voice import job_warning
from treadle.logging.writers import get_logger
from treadle.optim.scheduler_builder import build_scheduler_map
from treadle.optim.wrapper import OptimWrapper
from treadle.optim.wrapper_builder import build_optim_wrappers, by_name, scale_lr
from treadle.seeding import derive_seed, seed_everything, set_deterministic
from treadle.strategies.search import find_latest_saved
from treadle.checkpoint.frozen import FrozenDigests
from treadle.strategies.states import (FrozenWeights, LoaderPlaces, ModelState, OptimStates, RunState, SchedulerStates,
                                       plain_state)

DEFAULT_REVISE_KEYS = [(r"^module\.", "")]
#: The entries of ``state.pt`` the strategy owns; a caller's parts take other names.
STRATEGY_ENTRIES = ("model", "frozen", "optim", "param_schedulers", "data", "extra", "strategy")
#: What ``prepare(dispatch_kwargs=...)`` takes (MMEngine's names).
DISPATCH_KEYS = ("epoch_length", "max_epochs", "max_iters", "train_micro_batch_size_per_gpu")


class StrategyAPI:
    """The public methods of every Strategy (mixed into ``treadle.strategies.base.Strategy``).

    Needs of the concrete strategy: ``setup``, ``setup_model``, ``unwrap``,
    ``setup_optim_wrappers``, ``get/set_model_state``, ``get/set_optim_state``,
    ``get_full_model_state``, ``load_full_model_state``, ``write/read_checkpoint``.
    """

    name: str
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    device: torch.device
    shard_data: bool
    #: Set by :meth:`setup_env` (``treadle.build_strategy`` calls it).
    work_dir: Path | None = None
    seed: int | None = None
    data_seed: int = 0
    seed_per_rank: bool = False
    timestamp: str = ""
    run_id: str = ""
    launcher: str = "none"
    deterministic: bool = False
    _env_ready: bool = False
    _prepared: bool = False
    #: What ``treadle export`` needs of the model (treadle/checkpoint/model_info.py): described
    #: once by :meth:`prepare`, recorded as ``"model"`` in every checkpoint's manifest meta.
    model_info: dict[str, Any] | None = None
    _frozen_digests: FrozenDigests | None = None  # the frozen weights' digests, kept across saves

    # -- environment ---------------------------------------------------------------------
    def setup_env(self, *, work_dir: str | Path | None = None, seed: int | None = None,
                  deterministic: bool = False, seed_per_rank: bool = False, draw_seed: bool = True) -> None:
        """Once: the process group, the run's time stamp and id (rank 0's, on every rank),
        and the seeds. ``seed=None`` with ``draw_seed`` draws one on rank 0 (as MMEngine
        does) and seeds python, numpy and torch with it on every rank (``seed_per_rank``:
        plus the rank); without ``draw_seed`` the global RNGs are left as
        they are. ``data_seed`` (the data order's) is the seed, or the drawn one."""
        if self._env_ready:
            return
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        self.setup()  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
        from treadle.distributed.env import detect_launcher

        self.launcher = detect_launcher().launcher if self.distributed else "none"  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
        if self.rank != 0:  # one copy of the console: rank 0's
            get_logger().setLevel(logging.WARNING)
        # Ranks must agree on the data order and the run's start time: rank 0 decides.
        stamp, drawn, token = comm.broadcast_object(
            (time.strftime("%Y%m%d_%H%M%S"), secrets.randbits(63), secrets.token_hex(4)))
        self.timestamp, self.run_id = stamp, f"{stamp}-{token}"
        self.data_seed = seed if seed is not None else drawn
        self.seed = seed if seed is not None or not draw_seed else drawn
        if self.seed is not None:
            # Per rank: per data shard, as the ranks of one tensor-parallel group must draw alike.
            seed_everything(self.seed, rank=self.dp_rank, per_rank=seed_per_rank)
        self.seed_per_rank = seed_per_rank
        self.deterministic = bool(deterministic)
        if deterministic:
            set_deterministic(True)
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self._places = LoaderPlaces([])  # tracked training loaders, in order, and places resumed before them
        self._env_ready = True

    def collect_env(self) -> tuple[dict[str, str], dict[str, Any]]:
        """``(system, runtime)``: versions and hardware (treadle/env.py), and this run's
        launcher, processes, seed and determinism."""
        from treadle.env import collect_env

        runtime = {"launcher": self.launcher, "distributed": self.distributed, "world_size": self.world_size,  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
                   "seed": self.seed, "deterministic": self.deterministic, "strategy": self.name}
        return collect_env(seed=self.seed, world_size=self.world_size), runtime

    # -- prepare -------------------------------------------------------------------------
    def prepare(self, model: nn.Module | Mapping[str, Any], *, optim_wrapper: Any = None,
                param_scheduler: Any = None, compile: bool | dict[str, Any] = False,
                dispatch_kwargs: dict[str, Any] | None = None, auto_scale_lr: dict[str, Any] | None = None,
                activation_checkpointing: Any = None, load_from: str | Path | Mapping[str, Any] | None = None) -> Any:
        """Place and wrap ``model`` (a module or a config dict), build the optimizer over
        the wrapped parameters and the schedulers over that optimizer.

        A config dict (``dict(type=MyModel, width=1024)``, or a Hugging Face model's
        ``dict(type=LlamaForCausalLM, pretrained=DIR)``) is built by the strategy: when it
        shards the model over several processes (:attr:`empty_init`), on the meta device,
        each process then materializing only its shards, from the pretrained weights read
        box by box or by the model's own initialization (treadle/components/empty_init.py).
        ``load_from``: weights to start from (a checkpoint, ``.pt``, ``.safetensors`` file or
        Hugging Face folder), every key and shape checked; read shard by shard into a model
        built on the meta device.

        ``activation_checkpointing``: ``"full"``, ``"selective"``, module classes, class
        names or submodule paths to checkpoint, a predicate (or ``{"check_fn": fn}``), or
        ``{"modules": ..., "mode": ...}``
        (treadle/strategies/activation_checkpointing.py); applied to the model before it is
        placed and wrapped (DDP, FSDP2's ``fully_shard``), its state dict keys unchanged.

        ``optim_wrapper``: MMEngine's ``optim_wrapper`` dict, an Optimizer or an
        OptimWrapper; or several by name, ``{"gen": {...}, "disc": {...}}`` (a config
        optimizes the model's submodule of that name), which ``param_scheduler`` then
        gives by name too. ``dispatch_kwargs``: ``epoch_length``, ``max_epochs``,
        ``max_iters`` (``epoch_length x max_epochs`` when not given) for schedulers
        configured by epoch or without ``end``, and
        ``train_micro_batch_size_per_gpu`` for ``auto_scale_lr`` (``dict(base_batch_size=N)``:
        lr x processes x batch / N, before the schedulers record it).

        Returns the model alone, ``(model, optim_wrapper)``, or ``(model, optim_wrapper,
        schedulers)``, as much as was asked for (a dict by name for several wrappers).
        ``self.eval_module`` is the model to evaluate with (DDP: the module inside, no
        collectives; compiled too with ``compile``).
        """
        self.setup_env()
        if self._prepared:
            raise RuntimeError(f"{type(self).__name__}.prepare() was called already; a strategy prepares one model")
        if param_scheduler is not None and optim_wrapper is None:
            raise ValueError("prepare(param_scheduler=...) needs optim_wrapper= too: schedulers act on an optimizer")
        kwargs = dict(dispatch_kwargs or {})
        unknown = sorted(set(kwargs) - set(DISPATCH_KEYS))
        if unknown:
            raise ValueError(f"dispatch_kwargs has unknown keys {unknown}; expected some of {', '.join(DISPATCH_KEYS)}")
        length, epochs = kwargs.get("epoch_length"), kwargs.get("max_epochs")
        if kwargs.get("max_iters") is None and length and epochs:  # an epoch-based loop's length in iterations
            kwargs["max_iters"] = length * epochs
        model = self._build_model(model, load_from)
        if not isinstance(model, nn.Module):
            raise TypeError(f"prepare(model=...) needs a torch.nn.Module or a config dict, got {type(model).__name__}")
        if activation_checkpointing is not None and activation_checkpointing is not False:
            from treadle.strategies.activation_checkpointing import apply_activation_checkpointing

            apply_activation_checkpointing(model, activation_checkpointing)  # before wrapping: fully_shard sees the blocks
        self.module = model
        self.model_info = describe_model(model)
        wrapped = self.setup_model(model)  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
        wrappers = build_optim_wrappers(optim_wrapper, model, device_type=self.device.type) if optim_wrapper is not None else {}
        # DeepSpeed: the engine (made from the model and the optimizer) is what the loop calls.
        self.optim_wrappers: dict[str, OptimWrapper]
        wrapped, self.optim_wrappers = self.setup_optim_wrappers(  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
            wrapped, wrappers, micro_batch=kwargs.get("train_micro_batch_size_per_gpu"))
        self.model, self.eval_module = wrapped, self.eval_model(wrapped)  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
        if compile:
            options = compile if isinstance(compile, dict) else {}
            self.model = torch.compile(wrapped, **options)
            self.eval_module = self.model if self.eval_module is wrapped else torch.compile(self.eval_module, **options)
        items: list[Any] = [self.model]
        self.optim_wrapper: Any = None
        self.param_schedulers: Any = []
        if optim_wrapper is not None:
            self.optim_wrapper = self.optim_wrappers if by_name(optim_wrapper) else self.optim_wrappers["default"]
            items.append(self.optim_wrapper)
        if auto_scale_lr is not None:
            scale_lr(auto_scale_lr, self.optim_wrappers, kwargs.get("train_micro_batch_size_per_gpu"), self.world_size)
        if param_scheduler is not None:
            per_name = build_scheduler_map(param_scheduler, {n: ow.optimizer for n, ow in self.optim_wrappers.items()},
                                           epoch_length=kwargs.get("epoch_length"), max_epochs=kwargs.get("max_epochs"),
                                           max_iters=kwargs.get("max_iters"))
            for name, group in per_name.items():  # windows and fp16's skipped steps are not misorderings
                ow = self.optim_wrappers[name]
                if ow.accumulate > 1 or ow.scaler is not None:
                    for sch in group:
                        if hasattr(sch, "check_order"):
                            sch.check_order = False
            self.param_schedulers = per_name if isinstance(self.optim_wrapper, dict) else per_name["default"]
            items.append(self.param_schedulers)
        self._prepared = True
        self._watch_steps()
        return items[0] if len(items) == 1 else tuple(items)

    def _build_model(self, model: Any, load_from: Any) -> Any:
        """The module to prepare: a config dict built (on the meta device when
        :attr:`empty_init`), a recorded :class:`EmptyModel` unwrapped; what the meta tensors
        will be filled from noted for ``materialize_model``; ``load_from`` loaded into a
        module built whole."""
        from treadle.components.empty_init import EmptyModel, record

        empty = None
        if isinstance(model, Mapping):
            from treadle.components.build import build_model  # the config layer: only for a config dict

            spec = dict(model)
            if self.builds_empty:  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
                empty = record(lambda: build_model(spec), what=str(spec.get("type", "the model")))
                model = empty.module if isinstance(empty, EmptyModel) else empty
            else:
                model = build_model(spec)
        elif isinstance(model, EmptyModel):  # recorded before (the Trainer's build)
            empty, model = model, model.module
        if not isinstance(model, nn.Module):
            return model
        from treadle.strategies.materialize import has_meta

        if has_meta(model):
            self._pending_init = (empty if isinstance(empty, EmptyModel) else None, load_from)
        elif load_from is not None:  # the module itself, before it is placed and wrapped
            from treadle.checkpoint.weights import load_weights

            get_logger().info(f"load_from: {load_weights(model, load_from, strict=True)}")
        return model

    def _watch_steps(self) -> None:
        """A hand-written loop's progress, for the stall watch (treadle/distributed/sentinel.py):
        its optimizer steps, read by the watch's helper thread (the Trainer's loops write
        where they are themselves)."""
        watch = comm.stall_watch()
        if watch is None:
            return
        wrappers = list(self.optim_wrappers.values())
        watch.follow(lambda: tuple(ow.step_count for ow in wrappers), work_dir=self.work_dir)
        watch.set_active(True)

    def prepare_dataloader(self, loader: Any, *, train: bool = True, seed_per_sample: bool | str = True) -> Any:
        """``loader`` (a DataLoader or a config dict) for this process: sharded across
        ranks and, for training, a :class:`ResumableLoader` whose place each checkpoint
        holds. ``train=False``: sharded for evaluation (every sample once), not tracked.
        ``seed_per_sample``: seed each sample's randomness in a map-style dataset from
        ``(seed, epoch, index)``, the same for any ``num_workers`` and on resume (training only);
        ``"always"`` also for a dataset that drew nothing in the first samples a process loaded
        (treadle/data/worker_seed.py)."""
        self.setup_env()
        if isinstance(loader, Mapping):
            from treadle.components.build import build_dataloader  # the config layer: only for a config dict

            loader = build_dataloader(dict(loader), "prepare_dataloader(loader)")
        loader = self.shard_dataloader(loader, train=train)
        if not train:
            return loader
        prepared = ResumableLoader(loader, seed=derive_seed(self.data_seed, len(self._places.loaders)),
                                   rank=self.dp_rank, seed_per_sample=seed_per_sample)
        self.track_loader(prepared)
        return prepared

    def shard_dataloader(self, loader: Any, *, train: bool = True) -> Any:
        """``loader`` over this process's share of the data (the one place loaders are
        sharded: :meth:`prepare_dataloader` and the Trainer call it): shard ``dp_rank`` of
        ``dp_size`` (under tensor parallelism, the ranks of one group read the same). Training: a
        DistributedSampler, padded so every rank takes as many steps; ``train=False``:
        every sample once across data shards. Unchanged on one process, or with
        ``shard_data=False`` (treadle/data/distributed.py)."""
        if loader is None or not (self.distributed and self.shard_data):  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
            return loader
        shard = shard_train_loader if train else shard_eval_loader
        return shard(loader, self.dp_rank, self.dp_size)

    def track_loader(self, loader: Any) -> None:
        """Record ``loader``'s place (its ``state_dict()``) in every checkpoint's ``data``
        entry, after those tracked before it; :meth:`resume` puts it back with its
        ``load_state_dict`` (a place resumed before the loader was tracked: now).
        ``prepare_dataloader`` calls it; the Trainer hands its training loop's place."""
        self.setup_env()
        self._places.loaders.append(loader)
        if self._places.pending:  # resumed before this loader was tracked
            loader.load_state_dict(self._places.pending.pop(0))
            stream = self._places.pending_streams.pop(0) if self._places.pending_streams else None
            load_stream = getattr(loader, "load_stream_state_dict", None)
            if stream is not None and callable(load_stream):  # this rank's own position of the stream
                load_stream(stream)

    def _need(self, what: str) -> None:
        if not self._prepared:
            raise RuntimeError(f"{what} needs strategy.prepare(model, ...) first")

    # -- state dicts ---------------------------------------------------------------------
    def model_state_dict(self) -> dict[str, Any]:
        """The model's full weights (CPU tensors under FSDP, gathered on rank 0)."""
        self._need("model_state_dict()")
        return self.get_full_model_state(self.module)  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)

    def optim_state_dict(self) -> dict[str, Any]:
        """The optimizer wrapper's state (optimizer, scaler, accumulation); by name for
        several wrappers."""
        self._need("optim_state_dict()")
        if not self.optim_wrappers:
            raise RuntimeError("optim_state_dict(): prepare() was given no optim_wrapper")
        states = {name: ow.state_dict(self.get_optim_state(self.module, ow.optimizer))  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
                  for name, ow in self.optim_wrappers.items()}
        return states if isinstance(self.optim_wrapper, dict) else states["default"]

    def scheduler_state_dict(self) -> Any:
        """Each prepared scheduler's state, in order (a dict of lists by optimizer name
        for several wrappers)."""
        self._need("scheduler_state_dict()")
        if isinstance(self.param_schedulers, dict):
            return {name: [s.state_dict() for s in group] for name, group in self.param_schedulers.items()}
        return [s.state_dict() for s in self.param_schedulers]

    def load_model_state_dict(self, state_dict: Mapping[str, Any], *, strict: bool = False,
                              revise_keys: list[tuple[str, str]] | None = None, frozen: Any = None) -> None:
        """Full weights into the model, keys rewritten by ``revise_keys`` (regex, repl).
        ``frozen``: a training checkpoint's ``frozen`` entry: the frozen weights it left out
        of ``state_dict`` are checked against the model's by digest (another base is
        refused, naming the first that differs) and kept."""
        self._need("load_model_state_dict()")
        self.load_full_model_state(self.module, state_dict, strict=strict,  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
                                   revise_keys=DEFAULT_REVISE_KEYS if revise_keys is None else revise_keys,
                                   frozen=frozen)

    def load_optim_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Inverse of :meth:`optim_state_dict`."""
        self._need("load_optim_state_dict()")
        if not self.optim_wrappers:
            raise RuntimeError("load_optim_state_dict(): prepare() was given no optim_wrapper")
        states = state_dict if isinstance(self.optim_wrapper, dict) else {"default": state_dict}
        for name, ow in self.optim_wrappers.items():
            ow.load_state_dict(states[name], functools.partial(self.set_optim_state, self.module, ow.optimizer))  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)

    def load_scheduler_state_dict(self, state_dict: Any) -> None:
        """Inverse of :meth:`scheduler_state_dict` (as many states as schedulers)."""
        self._need("load_scheduler_state_dict()")
        SchedulerStates(self).check_state_dict(state_dict)
        mine = self.param_schedulers if isinstance(self.param_schedulers, dict) else {"": self.param_schedulers}
        saved = state_dict if isinstance(self.param_schedulers, dict) and isinstance(state_dict, dict) else {"": state_dict}
        for name, group in mine.items():
            for sched, st in zip(group, saved[name]):
                sched.load_state_dict(st)

    # -- checkpoints ---------------------------------------------------------------------
    @property
    def checkpointer(self) -> Checkpointer:
        return Checkpointer(self)  # type: ignore[arg-type]  # self is a Strategy, its StorageBackend

    def checkpoint_states(self, parts: Mapping[str, Any] | None = None, rank_parts: Mapping[str, Any] | None = None,
                          *, save_optimizer: bool = True, save_param_scheduler: bool = True,
                          save_frozen: bool = False,
                          extra_ckpt: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(states, rank_states)``: the owners of a checkpoint by name, as
        :meth:`save_checkpoint` hands them to the checkpointer (the layout: the module
        docstring). ``parts``/``rank_parts``: the caller's own Statefuls (or plain dicts),
        by names other than the strategy's entries. ``save_frozen``: see :meth:`save_checkpoint`."""
        self._need("checkpoint_states()")
        parts, rank_parts = dict(parts or {}), dict(rank_parts or {})
        taken = sorted(set(parts) & set(STRATEGY_ENTRIES)) + sorted(set(rank_parts) & {"optim", "data"})
        if taken:
            raise ValueError(f"checkpoint parts {taken} take names of the strategy's own entries "
                             f"({', '.join(STRATEGY_ENTRIES)}); give them other names")
        extra = plain_state(extra_ckpt if extra_ckpt is not None else {}, "extra_ckpt")
        clash = sorted(set(extra) & set(parts))
        if clash:
            raise ValueError(f"extra_ckpt keys {clash} are also names of checkpoint parts; resume hands both "
                             "back in one dict, so give them other names")
        optim = OptimStates(self, self.module, self.optim_wrappers if save_optimizer else {})  # type: ignore[arg-type]  # self is a Strategy (StrategyAPI is its mixin)
        if self._frozen_digests is None:
            self._frozen_digests = FrozenDigests()
        frozen = FrozenWeights(self, self.module, self._frozen_digests, saved=save_frozen)  # type: ignore[arg-type]  # self is a Strategy (StrategyAPI is its mixin)
        states: dict[str, Any] = {"model": ModelState(self, self.module, frozen), "frozen": frozen, "optim": optim}  # type: ignore[arg-type]  # self is a Strategy (StrategyAPI is its mixin)
        if save_param_scheduler:
            states["param_schedulers"] = SchedulerStates(self)
        states.update({"data": self._places, "extra": extra, "strategy": RunState(self), **parts})  # type: ignore[arg-type]  # self is a Strategy (StrategyAPI is its mixin)
        return states, {"optim": optim.local, "data": self._places.local, **rank_parts}

    def save_checkpoint(self, filename: str | Path, *, save_optimizer: bool = True, save_param_scheduler: bool = True,
                        save_frozen: bool = False, extra_ckpt: dict[str, Any] | None = None,
                        callback: Callable[[dict[str, Any]], None] | None = None,
                        parts: Mapping[str, Any] | None = None, rank_parts: Mapping[str, Any] | None = None,
                        meta: Mapping[str, Any] | None = None, writer: Callable[..., Path] | None = None,
                        explain_nonfinite: str | None = None) -> Path:
        """Save everything the next step depends on to the directory ``filename`` (every
        rank calls it). ``extra_ckpt``: plain data (numbers, strings, tensors, lists and
        dicts of them) handed back by :meth:`resume`. ``callback(state)`` may edit the
        state before it is written. Refuses to replace what another run saved.

        ``save_frozen``: the parameters that do not train (``requires_grad=False``: a PEFT
        model's base, a frozen backbone) are written too, so that the checkpoint is
        self-contained; by default only their digests are (``state.pt["frozen"]``), computed
        once per run, and a resume needs the same frozen weights (another base is refused).

        For a caller with state of its own (the Trainer): ``parts`` / ``rank_parts`` are
        Statefuls saved by name in ``state.pt`` / this rank's file (see
        :meth:`checkpoint_states`); ``meta`` goes to the manifest; ``writer`` replaces
        rank 0's write (an ``AsyncCheckpointer``); ``explain_nonfinite``: name a NaN or inf
        by model weight and optimizer entry, and end that error with this advice."""
        self._need("save_checkpoint()")
        states, rank_states = self.checkpoint_states(parts, rank_parts, save_optimizer=save_optimizer,
                                                     save_param_scheduler=save_param_scheduler,
                                                     save_frozen=save_frozen, extra_ckpt=extra_ckpt)
        describe = states["optim"].describe_nonfinite if explain_nonfinite is not None else None
        meta = {**(meta or {}), "kind": "strategy", "model": self.model_info}
        path = self.checkpointer.save(filename, states, rank_states=rank_states, meta=meta, run=self.run_id,
                                      writer=writer, callback=callback, describe=describe, hint=explain_nonfinite or "")
        get_logger().debug(f"saved checkpoint {path}")
        return Path(path)

    def resume(self, filename: str | Path, *, resume_optimizer: bool = True, resume_param_scheduler: bool = True,
               map_location: str = "default", callback: Callable[[dict[str, Any]], None] | None = None,
               parts: Mapping[str, Any] | None = None, rank_parts: Mapping[str, Any] | None = None,
               rng: Callable[[dict[str, Any] | None], None] | None = None) -> dict[str, Any]:
        """Restore everything :meth:`save_checkpoint` saved in ``filename``: weights,
        optimizers, schedulers, the loaders' places, the RNG. Returns its ``extra_ckpt``,
        with the state of every saved part not handed in ``parts`` added by name (a Trainer
        checkpoint's ``loop``, ``hooks``, ``results``: ``extra["loop"]["iter"]`` is the
        iterations done). Nothing is changed before the checkpoint is known to fit.

        ``parts`` / ``rank_parts``: the caller's Statefuls, restored from the entries of
        those names (each checks its part first). ``callback(state)`` sees (and may edit)
        the state first. ``rng(own)``: takes this rank's RNG file (None when this rank has
        none) before anything is restored, instead of the RNG being set at the end (the
        Trainer sets it where the interrupted run took its next batch)."""
        self._need("resume()")
        parts, rank_parts = dict(parts or {}), dict(rank_parts or {})
        states, rank_states = self.checkpoint_states(parts, rank_parts, save_optimizer=resume_optimizer)
        state, own = self.checkpointer.load(filename, states)
        if callback is not None:
            callback(state)
        _check_fits(self, state, filename, resume_optimizer)
        where = f"resume({str(filename)!r})"
        del states["extra"]  # plain data, handed back
        if not states["optim"].wrappers:  # resume_optimizer=False, or no optimizer prepared
            del states["optim"]
        if not resume_param_scheduler or "param_schedulers" not in state:  # saved with save_param_scheduler=False
            states.pop("param_schedulers")
        if rng is not None:
            rng(own)
        Checkpointer.restore(states, state, where=where)  # every owner checks its part first
        local = own.get("rank_state") if own is not None else None
        if isinstance(local, dict):  # another world size: this rank may have none
            if "optim" not in states:
                rank_states.pop("optim")
            saved = state["strategy"]
            if int(saved.get("world_size", 1)) != self.world_size or int(saved.get("tp", 1)) != self.tp_size:  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
                rank_states.pop("data")  # the streams were shared out otherwise: read them up to the place
            Checkpointer.restore(rank_states, local, where=where, optional=rank_states)
        info = state["strategy"]
        if rng is not None:  # the caller sets it
            pass
        elif int(info.get("world_size", 1)) != self.world_size or own is None:  # alike on every rank: said once
            job_warning(f"resuming a checkpoint saved by {info.get('world_size')} process(es) on {self.world_size}: "
                        "weights, optimizer and positions are restored, the RNG streams are not (they cannot be "
                        "split differently)")
        elif int(info.get("tp", 1)) != self.tp_size:  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
            job_warning(f"resuming a checkpoint saved with tp {info.get('tp', 1)} on tp {self.tp_size}: "  # type: ignore[attr-defined]  # the Strategy's (StrategyAPI is its mixin)
                        "weights, optimizer and positions are restored, the RNG streams are not (the ranks share "
                        "the data differently)")
        else:
            set_rng_state(own)  # last: the next draw is the uninterrupted run's
        if not parts:  # a caller with parts of its own says where it goes on (the Trainer does)
            get_logger().info(f"resumed from {filename}")
        others = {name: state[name] for name in state if name not in STRATEGY_ENTRIES and name not in parts}
        return {**dict(state["extra"]), **others}

    def load_checkpoint(self, filename: str | Path, *, map_location: str = "cpu", strict: bool = False,
                        revise_keys: list[tuple[str, str]] | None = None,
                        callback: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Weights only, from a checkpoint directory, a ``.pt``/``.pth`` or a
        ``.safetensors`` file (always ``weights_only``); returns ``{"state_dict": ...}``
        after ``callback`` (which may edit it) and loading. A training checkpoint that left
        out the frozen weights: the model's own stay, once their digests match the
        checkpoint's (another base is refused, naming the first tensor that differs)."""
        from treadle.checkpoint.weights import read_weights_and_frozen

        self._need("load_checkpoint()")
        weights, frozen = read_weights_and_frozen(filename)
        checkpoint = {"state_dict": weights}
        if callback is not None:
            callback(checkpoint)
        self.load_model_state_dict(checkpoint["state_dict"], strict=strict, revise_keys=revise_keys, frozen=frozen)
        get_logger().info(f"loaded weights from {filename}")
        return checkpoint

    def load_or_resume(self, *, load_from: str | Path | None = None,
                       resume: bool | str | Path = False) -> dict[str, Any] | None:
        """MMEngine's rule: ``resume`` a path, or ``resume=True``: ``load_from`` when given,
        else the newest verified checkpoint this API saved anywhere under ``work_dir``
        (nothing there: start from scratch). Without resume, ``load_from`` loads weights.
        Returns the resumed checkpoint's ``extra_ckpt``, or None when nothing was resumed."""
        self._need("load_or_resume()")
        if resume is True and load_from is None:
            if self.work_dir is None:
                raise ValueError("load_or_resume(resume=True) looks under work_dir, but the strategy has none; "
                                 "build it with treadle.build_strategy(..., work_dir=...)")
            found = comm.broadcast_object(find_latest_saved(self.work_dir) if self.rank == 0 else None)
            if found is None:
                get_logger().info(f"resume=True: no checkpoint under {self.work_dir}; starting from scratch")
                return None
            return self.resume(found)
        if resume:
            return self.resume(load_from if resume is True else resume)  # type: ignore[arg-type]  # True with load_from None returned above
        if load_from is not None:
            self.load_checkpoint(load_from)
        return None


def _check_fits(strategy: StrategyAPI, state: dict[str, Any], filename: str | Path, resume_optimizer: bool) -> None:
    """Refuse, before anything changes, a checkpoint this prepared strategy cannot take."""
    where = f"resume({str(filename)!r})"
    missing = [k for k in ("model", "optim", "data", "extra", "strategy") if k not in state]
    if missing:
        raise CheckpointError(f"{where}: not a training checkpoint (it lacks {missing}); a weights-only file "
                              "loads with load_checkpoint()")
    if resume_optimizer and strategy.optim_wrappers and not set(strategy.optim_wrappers) <= set(state["optim"]):
        raise CheckpointError(f"{where}: the checkpoint holds no optimizer state (saved with save_optimizer=False); "
                              "pass resume_optimizer=False")


__all__ = ["StrategyAPI", "DEFAULT_REVISE_KEYS", "STRATEGY_ENTRIES"]
