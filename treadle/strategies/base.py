"""Strategy: where the model lives, how batches reach it, how its state is saved.

The Trainer talks to a strategy at these points, in this order::

    strategy.setup()                         # process group (multi-process strategies)
    model = strategy.setup_model(module)     # place and wrap; the optimizer is built after
    model, wrappers = strategy.setup_optim_wrappers(model, wrappers)  # DDP's no_sync; DeepSpeed's engine
    move = strategy.batch_mover()            # None on CPU
    ... training ...
    strategy.get_model_state(module) / get_optim_state(module, optimizer)
    strategy.write_checkpoint(path, payloads, meta) / read_checkpoint(path)

``SingleDevice`` is the one-process case; ``DDPStrategy`` (strategies/ddp.py),
``FSDPStrategy`` (strategies/fsdp.py) and ``DeepSpeedStrategy`` (strategies/deepspeed.py)
are the multi-process ones.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn

from treadle.checkpoint.checkpointer import rng_file
from treadle.checkpoint.io import CheckpointError
from treadle.distributed import comm
from treadle.distributed.layout import ParallelLayout
from treadle.optim.wrapper import GradientSync
from treadle.optim.wrapper_builder import check_optimizes
from treadle.strategies.api import DEFAULT_REVISE_KEYS, StrategyAPI


def pick_device() -> torch.device:
    """CUDA if available, then MPS, then CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def move_to(obj: Any, device: torch.device, non_blocking: bool = False, dtype: torch.dtype | None = None) -> Any:
    """Move every tensor inside nested tuples, lists and mappings to ``device`` (and the
    floating-point ones to ``dtype``, when given)."""
    if isinstance(obj, torch.Tensor):
        if dtype is not None and obj.is_floating_point():
            return obj.to(device, dtype, non_blocking=non_blocking)
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):  # a dict, or e.g. Hugging Face's BatchEncoding (a UserDict): a dict
        return {k: move_to(v, device, non_blocking, dtype) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [move_to(v, device, non_blocking, dtype) for v in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*moved)
        return type(obj)(moved)
    return obj


class Strategy(StrategyAPI):
    """Base class. Subclasses set ``device``, ``rank`` and ``world_size``; the public
    methods for your own loop (``prepare``, ``save_checkpoint``, ...) are in
    treadle/strategies/api.py."""

    name = "base"
    device: torch.device = torch.device("cpu")
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    #: The training loader is sharded across ranks (a DistributedSampler) unless False.
    shard_data: bool = True
    #: Model and optimizer states are sharded (DTensors): checkpoints write their tensors
    #: through DCP, every rank its shards (treadle/checkpoint/tree.py).
    shards_state: bool = False
    #: Evaluation has collectives inside forward (FSDP): ranks run equally many batches.
    eval_in_lockstep: bool = False
    #: ``write_checkpoint`` honours an asynchronous ``writer`` (DeepSpeed: every save is synchronous).
    async_saves: bool = True
    #: An open accumulation window's gradients are saved (FSDP's are shards under no_sync,
    #: DeepSpeed's live in ZeRO's buffers: not saved, the window restarts on resume).
    saves_window_grads: bool = True

    #: The loss is computed on class shards (a tensor-parallel plan's ``loss_parallel``
    #: style): the default steps run inside torch's ``loss_parallel()``.
    loss_parallel: bool = False

    #: A model given as a spec is built on the meta device and each process materializes
    #: its share only (treadle/components/empty_init.py); None: when this strategy shards
    #: the model over several processes (the multi-process strategies' option).
    empty_init: bool | None = None
    _pending_init: Any = None  # (EmptyModel or None, load_from): what prepare has the meta tensors filled from

    @property
    def builds_empty(self) -> bool:
        """Whether a model spec is built on the meta device (``empty_init``, or by default
        when this strategy shards the model over several processes)."""
        if self.empty_init is not None:
            return self.empty_init
        return self.shards_state and self.distributed

    @property
    def is_main(self) -> bool:
        """True on the process that writes logs and checkpoints."""
        return self.rank == 0

    # -- how the processes split: the layout, built once by setup() -------------------
    #: Replicas x shards x tensor parallel, this rank, the data-parallel groups
    #: (treadle/distributed/layout.py): what loaders, metrics, evaluation and logging ask.
    layout: ParallelLayout = ParallelLayout()

    @property
    def dp_rank(self) -> int:
        """The shard of the data this process reads (``layout.dp_rank``)."""
        return self.layout.dp_rank

    @property
    def dp_size(self) -> int:
        """How many shards the data is split into (``layout.dp_size``)."""
        return self.layout.dp_size

    @property
    def tp_size(self) -> int:
        """Tensor-parallel ranks per data shard, 1 for none (``layout.tp_size``)."""
        return self.layout.tp_size

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def setup(self) -> None:
        """Called once by the Trainer before the model is placed."""

    def check_trainer_options(self, options: dict[str, Any]) -> None:
        """Refuse, before anything starts, Trainer arguments this strategy cannot honour
        (``options``: the Trainer's arguments by name)."""

    def gradient_sync(self, model: nn.Module) -> GradientSync:
        """How ``model``'s gradients cross processes, for the optimizer wrapper: here,
        they are not reduced outside the backward pass and clipping is torch's (DDP and
        FSDP give their ``no_sync``; FSDP with tensor parallelism the norm over both meshes)."""
        return GradientSync()

    def setup_optim_wrapper(self, optim_wrapper: Any, model: nn.Module) -> None:
        """Give the optimizer wrapper :meth:`gradient_sync` (its one point of contact
        with the strategy)."""
        optim_wrapper.gradient_sync = self.gradient_sync(model)

    def setup_optim_wrappers(self, model: nn.Module, wrappers: dict[str, Any], *,
                             micro_batch: int | None = None) -> tuple[nn.Module, dict[str, Any]]:
        """After the optimizers were built over the placed model: ``(model to call,
        wrappers)``. Here each wrapper gets :meth:`setup_optim_wrapper`; DeepSpeed makes
        its engine from both. ``micro_batch``: the training loader's batch size, if known."""
        for ow in wrappers.values():
            self.setup_optim_wrapper(ow, model)
        check_optimizes(self.module, wrappers)  # an optimizer over another model's parameters: refused
        return model, wrappers

    # -- state dicts: full tensors here; FSDP returns sharded ones ---------------------
    def get_model_state(self, module: nn.Module) -> dict[str, Any]:
        return module.state_dict()

    def set_model_state(self, module: nn.Module, state: dict[str, Any], *, strict: bool = True) -> None:
        """``state`` into ``module``; ``strict=False``: keys it lacks are left as they are
        (the caller checked which: ``ModelState``, for frozen weights a checkpoint left out)."""
        module.load_state_dict(state, strict=strict)

    def full_shapes(self, module: nn.Module) -> dict[str, tuple[int, ...]]:
        """The whole shape of each entry of ``module``'s state dict (DeepSpeed stage 3:
        not the local placeholders'), to check a checkpoint against."""
        return {k: tuple(v.shape) for k, v in module.state_dict().items()}

    def get_full_model_state(self, module: nn.Module) -> dict[str, Any]:
        """Full (unsharded) weights for exports and best checkpoints; a collective
        under FSDP, so every rank calls it; meaningful on rank 0."""
        return module.state_dict()

    def load_full_model_state(self, module: nn.Module, state: Any, *, strict: bool = False,
                              revise_keys: Any = DEFAULT_REVISE_KEYS, frozen: Any = None) -> Any:
        """Full (unsharded) weights into ``module``, keys rewritten by ``revise_keys``;
        shapes that differ are never loaded; ``strict``: any difference raises first.
        ``frozen``: the checkpoint's ``frozen`` entry (the frozen weights it left out are
        checked against ``module``'s by digest, and kept)."""
        from treadle.checkpoint.weights import load_weights

        return load_weights(module, state, strict=strict, revise_keys=revise_keys, frozen=frozen)

    def get_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def set_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)

    def check_optim_state(self, state: Any) -> None:
        """Refuse a saved optimizer state this strategy cannot load, before anything is
        loaded: here, anything but a torch optimizer's state (DeepSpeed's checks its own)."""
        if not (isinstance(state, dict) and "state" in state and "param_groups" in state):
            what = (f"DeepSpeed ZeRO (stage {state['zero_stage']})" if isinstance(state, dict) and "zero_stage" in state
                    else "another strategy")
            raise CheckpointError(f"the checkpoint's optimizer state was saved by {what}, not a torch optimizer's; "
                                  f"resume it with the strategy that saved it (load_from= takes the weights alone)")

    # -- checkpoints ---------------------------------------------------------------------
    def write_checkpoint(self, path: str | Path, payloads: dict[str, Any], meta: dict[str, Any],
                         writer: Callable[..., Path] | None = None, sharded: Iterable[str] = ()) -> Path:
        """Write a checkpoint directory once, from rank 0, with every rank's RNG file.
        (``sharded``: the ``state.pt`` entries a sharding strategy writes through DCP;
        nothing is sharded here.)

        ``payloads`` holds this rank's ``rng_rank<r>.pt``; the others are gathered
        (a collective: every rank calls this). ``writer(path, payloads, meta=meta)``
        replaces :func:`treadle.checkpoint.io.save_checkpoint` on rank 0, e.g. an
        ``AsyncCheckpointer`` (treadle/checkpoint/async_save.py).
        """
        from treadle.checkpoint.io import save_checkpoint

        write = writer or save_checkpoint
        payloads = self.gather_rank_files(payloads)
        if not self.is_main:
            return Path(path)
        return write(path, payloads, meta=meta)

    def gather_rank_files(self, payloads: dict[str, Any]) -> dict[str, Any]:
        """``payloads`` with every rank's ``rng_rank<r>.pt`` on rank 0 (a collective);
        other ranks get theirs without it."""
        payloads = dict(payloads)
        if self.distributed:
            gathered = comm.gather_object(payloads.pop(rng_file(self.rank)))
            if self.is_main:
                payloads.update({rng_file(r): state for r, state in enumerate(gathered)})  # type: ignore[arg-type]  # gather_object's list, on rank 0
        return payloads

    def finish_saves(self) -> None:
        """Complete any save this strategy left in flight (FSDP's async DCP saves)."""

    def read_checkpoint(self, path: str | Path, template: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """Every payload of the checkpoint at ``path`` (verified, weights_only).
        ``template()`` gives this run's states of the sharded entries, for sharded loads."""
        from treadle.checkpoint.io import load_checkpoint

        return load_checkpoint(path)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order (``[obj]`` in one process)."""
        return comm.all_gather_object(obj)

    # -- reductions ------------------------------------------------------------------
    def reduce_log_values(self, values: dict[str, float]) -> dict[str, float]:
        """Logged scalars from every rank made one: times as the slowest rank's (max),
        the rest averaged over the data shards. Runs at the log interval only, on host values."""
        if not self.distributed:
            return values
        per_rank = comm.all_gather_object(values)
        leaders = [per_rank[r] for r in self.layout.data_leaders()]  # tensor parallelism: a shard's values once
        out: dict[str, float] = {}
        for key in values:
            if key.endswith("_time") or key.startswith("time/"):
                out[key] = max(v[key] for v in per_rank if key in v)
            else:
                seen = [v[key] for v in leaders if key in v]
                out[key] = sum(seen) / len(seen)
        return out

    def setup_model(self, model: nn.Module) -> nn.Module:
        """Place (and wrap) the model; returns what the loop should call. A model on the
        meta device is materialized here (:meth:`materialize_model`): by a sharding
        strategy after it split the model, by the others before they place it."""
        raise NotImplementedError

    def materialize_model(self, model: nn.Module,
                          each_module: Callable[[nn.Module], None] | None = None) -> nn.Module:
        """The tensors of ``model`` still on the meta device allocated on this process's
        device and filled: from the weights ``prepare`` was given, the rest from the record
        of the model's constructor (treadle/strategies/materialize.py); a sharded parameter
        gets this process's shard only. ``each_module``: called with each submodule once its
        own tensors are filled, children first, each allocated only in its turn (DeepSpeed's
        ZeRO-3 partitions it there). Nothing to do for a model built whole."""
        from treadle.strategies.materialize import has_meta, materialize

        pending, self._pending_init = self._pending_init, None
        if not has_meta(model):
            return model
        empty, load_from = pending if pending is not None else (None, None)
        materialize(model, self.device, empty=empty, weights=empty.weights if empty is not None else (),
                    load_from=load_from, what=type(model).__name__, each_module=each_module)
        return model

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module under any wrapper."""
        return model

    def eval_model(self, model: nn.Module) -> nn.Module:
        """What validation and test call (DDP: the module itself, so ranks may run
        different numbers of batches without a collective inside)."""
        return model

    def batch_mover(self) -> Callable[[Any], Any] | None:
        """A function moving a batch to the device, or None when none is needed (CPU)."""
        if self.device.type == "cpu":
            return None
        device = self.device
        non_blocking = device.type == "cuda"  # overlaps with compute when the loader pins memory
        return lambda batch: move_to(batch, device, non_blocking)


#: Seconds a rank may make no progress, while the others wait for it, before the stall
#: watch names it with its stack (treadle/distributed/watch.py): long enough that a
#: normal step never reaches it, short enough to be seen the same hour.
STALL_WARN_S = 300.0


def check_seconds(name: str, value: Any, none: str) -> float | None:
    """``value`` as a positive number of seconds, or None (``none``: what None means)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value \
            or value == float("inf"):
        raise ValueError(f"{name}={value!r}; expected a positive number of seconds, or None ({none})")
    return float(value)


@dataclass(kw_only=True, eq=False)
class ProcessGroupStrategy(Strategy):
    """Base of the multi-process strategies: the process group from the launcher's
    environment (treadle/distributed), and the options they share, defined here once
    (each strategy is a dataclass of its options: these, then its own).

    Args:
        backend: the process group's backend: None (nccl on CUDA, gloo on the CPU), "gloo"
            or "nccl".
        timeout_s: the process group's timeout (a collective waits that long for a peer).
        shard_data: the training loader is sharded across the data-parallel ranks.
        sync_bn: BatchNorm statistics over all data-parallel processes (each BatchNorm layer
            made a SyncBatchNorm before wrapping, treadle/strategies/sync_batchnorm.py).
        stall_warn_s: the stall watch (treadle/distributed/watch.py, docs/distributed.md "A
            rank that hangs"): when a rank has made no progress for this many seconds while
            the others wait for it, one warning names it, its phase and iteration, with its
            Python stack; None: no warning.
        stall_timeout_s: after this many seconds the job is ended (exit status 1), naming
            it. None (default): ended a few seconds before ``timeout_s``, which would end it
            then anyway, blaming a rank that waits; so a long compile, save or validation is
            only warned about. Both None: no watch.
        empty_init: a model given as a spec is built on the meta device and each process
            materializes only what it holds (None: when the strategy shards the model over
            several processes; treadle/strategies/materialize.py).
    """

    backend: str | None = None
    timeout_s: float = 1800.0
    shard_data: bool = True
    sync_bn: bool = False
    stall_warn_s: float | None = STALL_WARN_S
    stall_timeout_s: float | None = None
    empty_init: bool | None = None

    def __post_init__(self) -> None:
        self.stall_warn_s = check_seconds("stall_warn_s", self.stall_warn_s, "no warning")
        self.stall_timeout_s = check_seconds("stall_timeout_s", self.stall_timeout_s,
                                             "ended just before the process group's timeout_s")
        if self.empty_init is not None and not isinstance(self.empty_init, bool):
            raise TypeError(f"empty_init={self.empty_init!r}; expected True (a model spec built on the meta device, "
                            "each process materializing its share), False (built whole) or None (when the model is "
                            "sharded)")
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend={self.backend!r}; expected None (nccl on CUDA, gloo on CPU), 'gloo' or 'nccl'")
        if not isinstance(self.sync_bn, bool):
            raise TypeError(f"sync_bn={self.sync_bn!r}; expected True (BatchNorm statistics over all data-parallel "
                            "processes) or False")
        self.device = torch.device("cpu")

    def setup(self) -> None:
        """Initialise the process group (nothing to do in one process)."""
        from treadle.distributed.env import detect_launcher

        env = detect_launcher()
        self.device = comm.init_distributed(env, backend=self.backend, timeout_s=self.timeout_s)
        self.rank, self.world_size = comm.get_rank(), comm.get_world_size()
        self.layout = ParallelLayout.data_parallel(self.world_size, self.rank)  # FSDP's mesh splits it further
        self.local_rank = env.local_rank
        watching = self.stall_warn_s is not None or self.stall_timeout_s is not None
        comm.start_watch(warn_s=self.stall_warn_s, timeout_s=self.stall_timeout_s,
                         group_timeout_s=self.timeout_s if watching else None)

    def convert_batchnorm(self, model: nn.Module) -> nn.Module:
        """With ``sync_bn``: every BatchNorm layer of ``model`` made a SyncBatchNorm over
        ``layout.data_group`` (treadle/strategies/sync_batchnorm.py), in place, before
        the model is wrapped. Unchanged without it, and when that group is one process
        (said once in the log: there is nothing to synchronize)."""
        if not self.sync_bn:
            return model
        from treadle.logging.writers import get_logger
        from treadle.strategies.sync_batchnorm import BATCHNORMS, convert_sync_batchnorm, count_batchnorms

        if isinstance(model, (*BATCHNORMS, torch.nn.SyncBatchNorm)):
            raise ValueError(f"sync_bn=True: the model is itself a {type(model).__name__} layer; put it inside a "
                             "module (e.g. nn.Sequential) so that it can be replaced")
        group = self.layout.data_group
        size = comm.get_world_size() if group is None else _group_size(group)
        layers = count_batchnorms(model)
        if size <= 1:
            get_logger().info("sync_bn: one data-parallel process; BatchNorm layers left as they are")
            return model
        if not layers:  # every rank builds the same model: said once
            from treadle.distributed.voice import job_warning

            job_warning(f"sync_bn=True, but {type(model).__name__} has no BatchNorm layer: nothing to synchronize")
            return model
        convert_sync_batchnorm(model, group, cpu=self.device.type == "cpu")
        get_logger().info(f"sync_bn: {layers} BatchNorm layer(s) synchronized over {size} data-parallel processes")
        return model


def _group_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` that exists on this machine (a clear error, not
    torch's assertion at the first ``.to()``)."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device={device!r}; expected a device name such as 'cpu', 'cuda' or 'cuda:1', or None "
                        "(picked automatically)")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"device={device!r} is not a device name ({e}); expected e.g. 'cpu', 'cuda' or "
                         "'cuda:1'") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={device!r}, but CUDA is not available on this machine "
                             "(torch.cuda.is_available() is False); expected 'cpu' or None (picked automatically)")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={device!r}, but this machine has {count} CUDA device(s); expected an index "
                             f"in 0..{count - 1}")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device={device!r}, but MPS is not available on this machine; expected 'cpu' or None")
    return dev


def move_model(model: nn.Module, device: torch.device) -> nn.Module:
    """``model.to(device)``, skipped when every parameter and buffer is there already
    (the usual CPU case: torch's walk over the modules costs 0.2 ms at a process's first run)
    or on the meta device (materialized on ``device`` later: :meth:`Strategy.materialize_model`)."""
    tensors = list(itertools.chain(model.parameters(), model.buffers()))
    return model if all(t.device == device or t.is_meta for t in tensors) else model.to(device)


class SingleDevice(Strategy):
    """One process, one device (picked automatically when not given)."""

    name = "single"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = check_device(device) if device is not None else pick_device()
        self.rank, self.world_size = comm.get_rank(), comm.get_world_size()
        self.layout = ParallelLayout.data_parallel(self.world_size, self.rank)

    def setup_model(self, model: nn.Module) -> nn.Module:
        return move_model(self.materialize_model(model), self.device)
