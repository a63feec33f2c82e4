"""FSDPStrategy: parameters, gradients and optimizer state sharded over the processes
(FSDP2), on a device mesh of replicas x shards x tensor parallel.

    strategy = FSDPStrategy(wrap=("TransformerBlock",),
                            mixed_precision=dict(param_dtype="bfloat16", reduce_dtype="float32"),
                            reshard_after_forward=True, cpu_offload=False,
                            dp_replicate=1, dp_shard=-1, tp=1, tp_plan=None)

``setup()`` initialises the process group as DDPStrategy does, then the device mesh
(treadle/strategies/mesh.py): ``dp_replicate x dp_shard x tp`` processes, ``dp_shard=-1``
taking what the others leave. ``setup_model`` first splits the layers of ``tp_plan``
over the ``tp`` dimension (treadle/strategies/tensor_parallel.py), then calls
``torch.distributed.fsdp.fully_shard`` bottom-up over the data-parallel dimensions: on
every submodule the ``wrap`` policy selects (each becomes one all-gather/reduce-scatter
group, e.g. a transformer block), then on the root, and returns the same module object
(FSDP2 swaps its class and turns its parameters into DTensors sharded on dim 0).
``dp_replicate > 1`` is HSDP: each of the replicas holds the whole model sharded over
its ``dp_shard`` ranks, gradients are reduced within a replica and then across them.
With one process the model is only placed on the device, as DDPStrategy does.

The ranks of one tensor-parallel group read the same batches: the data is split over
``dp_replicate x dp_shard`` shards (``dp_rank``/``dp_size``), and losses, logged values
and metrics are reduced over those shards, each counted once.

The optimizer must be built *after* ``setup_model``: one built before holds the
replaced parameters and would update nothing (:meth:`FSDPStrategy.check_optimizer`
says so). State dicts go through ``torch.distributed.checkpoint.state_dict``: the
model/optimizer ones are sharded (DTensors, for ``treadle.checkpoint.sharded``),
:meth:`FSDPStrategy.get_full_model_state` gathers full CPU tensors on rank 0 (exports,
best checkpoints).
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from treadle.checkpoint.io import CheckpointError
from treadle.checkpoint.manifest import STATE_FILE
from treadle.distributed import comm
from treadle.distributed.voice import job_warning
from treadle.logging.writers import get_logger
from treadle.optim.wrapper import GradientSync
from treadle.compat import fsdp_cpu_problem, gloo_sums_average, mesh_reshard_problem
from treadle.strategies.base import ProcessGroupStrategy, move_model
from treadle.distributed.layout import MeshShape, ParallelLayout, data_groups
from treadle.strategies.mesh import ParallelMesh
from treadle.strategies.tensor_parallel import Plan, check_plan_type
from treadle.precision import torch_dtype

WrapPolicy = tuple[type | str, ...] | list[type | str] | Callable[[nn.Module], bool] | None

_MP_KEYS = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")


def _dtype(key: str, value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    dtype = torch_dtype(value) if isinstance(value, str) else None
    if dtype is not None:
        return dtype
    raise ValueError(f"mixed_precision[{key!r}]={value!r}: expected a torch.dtype or one of "
                     f"'bfloat16', 'float16', 'float32'")


def mixed_precision_policy(config: dict[str, Any] | None) -> Any:
    """``dict(param_dtype="bfloat16", reduce_dtype="float32", ...)`` as a ``MixedPrecisionPolicy``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if config is None:
        return MixedPrecisionPolicy()
    if not isinstance(config, dict):
        raise TypeError(f"mixed_precision must be a dict such as dict(param_dtype='bfloat16', "
                        f"reduce_dtype='float32'), got {config!r}")
    unknown = sorted(set(config) - set(_MP_KEYS))
    if unknown:
        raise ValueError(f"mixed_precision has unknown keys {unknown}; allowed: {list(_MP_KEYS)}")
    kwargs = {k: _dtype(k, v) for k, v in config.items() if k != "cast_forward_inputs"}
    if "cast_forward_inputs" in config:
        kwargs["cast_forward_inputs"] = bool(config["cast_forward_inputs"])
    return MixedPrecisionPolicy(**kwargs)


def _wrap_predicate(wrap: WrapPolicy) -> tuple[Callable[[nn.Module], bool], list[type | str]]:
    """A predicate for ``wrap``, and the classes/names it lists (to report unmatched ones)."""
    if wrap is None:
        return (lambda m: False), []
    if callable(wrap) and not isinstance(wrap, type):
        return wrap, []
    items = [wrap] if isinstance(wrap, (type, str)) else list(wrap)
    for it in items:
        if not isinstance(it, (type, str)):
            raise TypeError(f"wrap entries must be nn.Module classes or class names, got {it!r}")
    classes = tuple(it for it in items if isinstance(it, type))
    names = {it for it in items if isinstance(it, str)}

    def pred(m: nn.Module) -> bool:
        cls = type(m)
        return isinstance(m, classes) or cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names
    return pred, items


@dataclass(eq=False)
class FSDPStrategy(ProcessGroupStrategy):
    """FSDP2 (``fully_shard``) over torch.distributed (see the module docstring).

    Args:
        wrap: submodules that get their own ``fully_shard`` (before the root, which is
            always sharded): classes or class names (``"Block"`` or ``"pkg.mod.Block"``),
            or a predicate ``fn(module) -> bool``. Listed classes that match nothing are
            an error (a typo would silently shard the whole model as one group).
        mixed_precision: ``dict(param_dtype=, reduce_dtype=, output_dtype=,
            cast_forward_inputs=)`` for ``MixedPrecisionPolicy`` (dtypes or names).
        reshard_after_forward: free gathered parameters after forward (less memory,
            one more all-gather in backward).
        cpu_offload: keep sharded parameters, gradients and optimizer state on the CPU.
        dp_replicate: replicas of the sharded model (HSDP when > 1); -1: what
            ``dp_shard x tp`` leave of the world size.
        dp_shard: processes each replica is sharded over; -1: what ``dp_replicate x
            tp`` leave of the world size; ``"node"``: the processes of one node (over tp).
        tp: tensor-parallel ranks per data shard (1: none); needs ``tp_plan``.
        tp_plan: which layers ``tp`` splits, and how: a dict of module-name patterns to
            styles (``{"layers.*.attn.q_proj": "colwise", ...}``), ``"auto"`` (the
            model's own plan: a Hugging Face model's), or a callable ``plan(model, tp_mesh)``
            (treadle/strategies/tensor_parallel.py).
        backend, timeout_s, shard_data, sync_bn, stall_warn_s, stall_timeout_s, empty_init:
            the options every multi-process strategy takes (``ProcessGroupStrategy``); with
            ``empty_init`` the model is split and sharded on the meta device, and each
            process materializes only its shards.
    """

    name = "fsdp"
    shards_state = True
    eval_in_lockstep = True  # forward all-gathers parameters
    saves_window_grads = False  # sharded gradients under no_sync have no stable layout

    wrap: WrapPolicy = None
    mixed_precision: dict[str, Any] | None = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    _: KW_ONLY
    dp_replicate: int = 1
    dp_shard: int | str = -1
    tp: int = 1
    tp_plan: Plan = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._wrap_pred, self._wrap_items = _wrap_predicate(self.wrap)
        self.mp_policy = mixed_precision_policy(self.mixed_precision)  # validated now: errors before any process starts
        self.reshard_after_forward = bool(self.reshard_after_forward)
        self.cpu_offload = bool(self.cpu_offload)
        # as asked: setup() resolves it against the world size
        self.shape = MeshShape(dp_replicate=self.dp_replicate, dp_shard=self.dp_shard, tp=self.tp)
        check_plan_type(self.tp_plan)
        if self.tp > 1 and self.tp_plan is None:
            raise ValueError(f"tp={self.tp} needs tp_plan=: a dict of module-name patterns to styles, such as "
                             "{'layers.*.attn.q_proj': 'colwise', 'layers.*.attn.o_proj': 'rowwise'}, 'auto' (a "
                             "Hugging Face model's own plan) or a callable plan(model, tp_mesh)")
        self.device_mesh: ParallelMesh | None = None  # built by setup() over several processes
        self.mesh: Any = None  # the mesh fully_shard takes (torch's DeviceMesh)

    # -- the mesh ----------------------------------------------------------------------
    def setup(self) -> None:
        """The process group, then the mesh over it (a collective): the shape checked
        against the world size first, in one line."""
        super().setup()
        from treadle.distributed.env import detect_launcher

        shape = self.shape.resolve(self.world_size, detect_launcher().local_world_size)
        if shape.tp == 1 and self.tp_plan is not None and self.is_main:
            get_logger().warning("strategy 'fsdp': tp_plan is given, but tp=1: no layer is split")
        if not self.distributed:
            self.layout = ParallelLayout(shape, self.rank)
            return
        self.device_mesh = ParallelMesh.build(self.device.type, shape)
        if shape.tp > 1 or shape.dp_replicate > 1:
            _quiet_sequential_collective_hints()
            if self.is_main:
                get_logger().info(f"device mesh: {shape.describe()}")
        groups = data_groups(shape, self.rank, ("gloo", dist_backend()))
        self.layout = ParallelLayout(shape, self.rank, data_group=groups.get(dist_backend()),
                                     data_object_group=groups.get("gloo"))

    def check_trainer_options(self, options: dict[str, Any]) -> None:
        if options.get("ema") is not None and self.distributed:
            raise ValueError("ema= is not supported with strategy='fsdp' yet (the average would be a sharded "
                             "copy); use strategy='ddp', or train without EMA")

    # -- wrapping ------------------------------------------------------------------------
    def setup_model(self, model: nn.Module) -> nn.Module:
        """``fully_shard`` the policy's submodules, then the root; returns ``model`` itself."""
        self._check_wrap_matched(model)  # on one process too: a typo should not wait for a cluster
        if isinstance(self.tp_plan, dict) and self.layout.tp_size == 1:  # the plan's names, checked all the same
            from treadle.strategies.tensor_parallel import resolve_plan

            resolve_plan(model, self.tp_plan, 1, checked=True)
        if not self.distributed:  # one process: nothing to shard
            model = self.materialize_model(model)
        elif self.cpu_offload and self._pending_init is not None:  # the offloaded shards start on the CPU
            raise ValueError("FSDPStrategy(cpu_offload=True) with a model built on the meta device is not supported "
                             "yet; pass empty_init=False (the model is then built whole on each process)")
        if not self.cpu_offload:
            model = move_model(model, self.device)
        model = self.convert_batchnorm(model)  # sync_bn: before fully_shard
        if not self.distributed:
            return model
        if self.device.type == "cpu":
            mixed = self.mp_policy.param_dtype not in (None, torch.float32)
            problem = fsdp_cpu_problem(mixed, replicas=self.layout.shape.dp_replicate > 1, sync_bn=self.sync_bn)
            if problem is not None:
                raise RuntimeError(problem)
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        # Chosen before any fully_shard: it changes the classes (Block -> FSDPBlock).
        targets = [m for m in model.modules() if m is not model and self._wrap_pred(m)]
        assert self.device_mesh is not None  # setup() built it: several processes
        if self.device_mesh.tp is not None:  # tensor parallel first, then FSDP over the data dimensions
            from treadle.strategies.tensor_parallel import apply_plan

            self.loss_parallel = apply_plan(model, self.device_mesh.tp, self.tp_plan, self.layout.tp_size,
                                            checked=True)
        self.mesh = self.device_mesh.fsdp
        offload = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if self.cpu_offload else OffloadPolicy()
        kwargs = dict(mesh=self.mesh, mp_policy=self.mp_policy, offload_policy=offload)
        # Bottom-up: reversed pre-order puts every descendant before its ancestors.
        for m in [*reversed(targets), model]:
            fully_shard(m, reshard_after_forward=self.reshard_after_forward, **kwargs)
        if self.device.type == "cpu":  # gloo: averaged by FSDP itself where gloo would sum (treadle/compat.py)
            gloo_sums_average([*reversed(targets), model])
        return self.materialize_model(model)  # built on the meta device: each rank's shards now

    def _check_wrap_matched(self, model: nn.Module) -> None:
        seen = {type(m) for m in model.modules()}
        unmatched = [it for it in self._wrap_items if not any(
            (issubclass(c, it) if isinstance(it, type) else it in (c.__name__, f"{c.__module__}.{c.__qualname__}"))
            for c in seen)]
        if unmatched:
            names = sorted({c.__name__ for c in seen})
            raise ValueError(f"FSDPStrategy(wrap=...): {unmatched} match no submodule of the model; "
                             f"its module classes are {names}")

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard works in place

    @staticmethod
    def check_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        """Raise ValueError if ``optimizer`` holds parameters other than ``model``'s current ones.

        ``setup_model`` replaces every parameter by a sharded DTensor; an optimizer
        built before would step the old tensors and train nothing.
        """
        current = {id(p) for p in model.parameters()}
        stale = [tuple(p.shape) for g in optimizer.param_groups for p in g["params"] if id(p) not in current]
        if stale:
            raise ValueError(
                f"the optimizer holds {len(stale)} parameter(s) that are not the model's current parameters "
                f"(shapes {stale[:3]}{' ...' if len(stale) > 3 else ''}): it was built before "
                "FSDPStrategy.setup_model(), which replaces every parameter by a sharded DTensor. Build the "
                "optimizer after wrapping: pass optimizer=dict(type='AdamW', lr=...) to the Trainer, not an "
                "Optimizer object.")

    def setup_optim_wrapper(self, optim_wrapper: Any, model: nn.Module) -> None:
        """The optimizer checked against the sharded parameters, then :meth:`gradient_sync`."""
        self.check_optimizer(optim_wrapper.optimizer, model)
        super().setup_optim_wrapper(optim_wrapper, model)

    def gradient_sync(self, model: nn.Module) -> GradientSync:
        """Accumulation: micro-batches that do not step skip the reduce-scatter; with
        tensor parallelism, clipping by the norm over both meshes (treadle/optim/clip.py)."""
        from torch.distributed.fsdp import FSDPModule

        no_sync = (lambda: _no_gradient_sync(model)) if isinstance(model, FSDPModule) else None
        if self.layout.tp_size > 1:  # gradients on two meshes, (dp, tp) and dp: the global norm across both
            from treadle.optim.clip import clip_grad_norm_meshes

            return GradientSync(no_sync=no_sync, clip_grad_norm=clip_grad_norm_meshes)
        return GradientSync(no_sync=no_sync)

    # -- state dicts (collectives: every rank calls them) --------------------------------
    def get_model_state(self, module: nn.Module) -> dict[str, Any]:
        """Sharded: this rank's DTensor shards, for ``treadle.checkpoint.sharded``."""
        return get_model_state_dict(module)

    def set_model_state(self, module: nn.Module, state: dict[str, Any], *, strict: bool = True) -> None:
        """Load a sharded (or full) model state dict (``strict=False``: see Strategy.set_model_state)."""
        set_model_state_dict(module, state, options=StateDictOptions(strict=strict))

    def load_full_model_state(self, module: nn.Module, state: Any, *, strict: bool = False,
                              revise_keys: Any = ((r"^module\\.", ""),), frozen: Any = None) -> None:
        """Full weights into the sharded model, as :meth:`get_full_model_state` gives them:
        rank 0's are broadcast (the other ranks' ``state`` is not read). Keys are rewritten
        by ``revise_keys`` and shapes checked first; ``strict``: missing or unexpected keys
        raise; ``frozen`` (rank 0's): the checkpoint's ``frozen`` entry, whose frozen weights
        left out are checked against the model's by digest and kept. A collective; every
        rank raises alike."""
        from treadle.checkpoint.frozen import describe, verify_left_out
        from treadle.checkpoint.weights import LoadReport, WeightsMismatchError, compare_weights, read_weights, revise_state_keys

        sd: dict[str, Any] = {}
        report = LoadReport()
        if self.is_main:
            sd = revise_state_keys(read_weights(state), revise_keys)
            full = get_model_state_dict(module)  # DTensors: their shapes are the global ones
            report = compare_weights(full, sd)
            sd = {k: v for k, v in sd.items() if k in full}
        else:
            get_model_state_dict(module)  # the collective rank 0 runs above
        report, frozen = comm.broadcast_object((report, frozen))
        kept = verify_left_out(frozen, report.missing, "the checkpoint", lambda names: describe(
            get_model_state_dict(module), names, rank=self.rank, world_size=self.world_size,
            gather=comm.all_gather_object))
        report.missing, report.frozen = [k for k in report.missing if k not in kept], len(kept)
        if report.mismatched or (strict and not report.ok):
            raise WeightsMismatchError(report)
        set_model_state_dict(module, sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                                  strict=False))
        if not report.ok:  # rank 0's report, on every rank: said once
            job_warning(f"partial weight load:\n{report}")

    def get_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Sharded optimizer state keyed by parameter names (FQNs), not ids. On an optimizer
        that has not stepped yet, torch fills the state with a zero-lr step first."""
        return get_optimizer_state_dict(module, optimizer)

    def set_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any]) -> None:
        set_optimizer_state_dict(module, optimizer, state)

    def get_full_model_state(self, module: nn.Module) -> dict[str, Any]:
        """Full (unsharded) CPU tensors on rank 0, ``{}`` on the others; a collective."""
        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    # -- checkpoints ---------------------------------------------------------------------
    def write_checkpoint(self, path: str | Path, payloads: dict[str, Any], meta: dict[str, Any],
                         writer: Any = None, sharded: Iterable[str] = ()) -> Path:
        """A sharded checkpoint through DCP (on one process too, so any number of processes
        can resume it): the tensors of the ``state.pt`` entries named in ``sharded`` go to
        DCP files written by every rank; the rest of ``state.pt`` and the RNG files are
        written by rank 0. ``writer`` (an asynchronous saver) makes it a DCP
        ``async_save``, committed by the next save or :meth:`finish_saves`."""
        from treadle.checkpoint.tree import split_tensors

        self.finish_saves()  # an asynchronous save still in flight is committed first
        if self.distributed:  # the mesh it was saved on: a resume on another one reshards (treadle/compat.py)
            meta = {**meta, "mesh": self.layout.shape.as_dict()}
        tensors, rest = split_tensors(payloads[STATE_FILE], sharded)
        where = _find_dtensor(rest)
        if where is not None:
            raise ValueError(f"sharded checkpoint: {where.replace('payloads', 'state')} is a sharded DTensor of an "
                             "entry that is not written sharded (e.g. EMA), which is not supported with FSDP yet")
        pending = self.save_sharded_checkpoint(path, tensors, {**payloads, STATE_FILE: rest}, meta,
                                               async_=writer is not None)
        if writer is None:
            return pending.wait()
        # The saver's completion callback (pruning, a log line) runs once DCP's commit is done.
        self._async_done = (getattr(writer, "keywords", {}).get("on_done"), Path(path))
        return Path(path)

    def finish_saves(self) -> None:
        """Commit an asynchronous save still in flight (every rank calls this)."""
        pending = getattr(self, "_async_done", None)
        if pending is None:
            return
        from treadle.checkpoint.sharded import wait_pending

        self._async_done = None
        path = wait_pending() or pending[1]
        if pending[0] is not None and self.is_main:
            pending[0](path)

    def read_checkpoint(self, path: str | Path, template: Any = None) -> dict[str, Any]:
        """Payloads with the tensors of the sharded entries read through DCP into
        ``template()`` (this run's states of those entries: DCP reshards across world
        sizes) and put back into ``state.pt``'s entries."""
        from treadle.checkpoint.manifest import read_manifest
        from treadle.checkpoint.sharded import is_sharded_checkpoint
        from treadle.checkpoint.tree import merge_tensors, split_tensors

        if not is_sharded_checkpoint(path):
            raise ValueError(f"{path} is not a sharded (FSDP) checkpoint; strategy='fsdp' resumes from its own "
                             "checkpoints (saved by any number of processes). For weights only, use load_from=")
        if template is None:
            raise ValueError("FSDPStrategy.read_checkpoint needs template=, the current sharded states")
        manifest = read_manifest(path)
        saved_mesh = (manifest.get("meta") or {}).get("mesh")
        if isinstance(saved_mesh, dict) and self.distributed and math.prod(saved_mesh.values()) == self.world_size:
            problem = mesh_reshard_problem(saved_mesh, self.layout.shape.as_dict())  # another number: load_sharded checks
            if problem is not None:
                raise CheckpointError(f"{path}: {problem}")

        def wanted(saved: set[str]) -> dict[str, Any]:  # the entries the checkpoint holds of what may be left out
            state = template(saved)
            return split_tensors(state, state)[0]
        loaded, payloads = self.load_sharded_checkpoint(path, wanted)
        return {**payloads, STATE_FILE: merge_tensors(payloads[STATE_FILE], loaded)}

    def save_sharded_checkpoint(self, path: str | Path, sharded_state: dict[str, Any], payloads: dict[str, Any],
                                meta: dict[str, Any], async_: bool = False) -> Any:
        """:func:`treadle.checkpoint.sharded.save_sharded`, with every rank's
        ``rng_rank<r>.pt`` gathered into rank 0's payloads as ``write_checkpoint`` does.
        Returns the ``PendingSave`` (call ``wait()`` on every rank before the next save)."""
        from treadle.checkpoint.sharded import save_sharded

        return save_sharded(path, sharded_state, self.gather_rank_files(payloads), meta, async_=async_)

    def load_sharded_checkpoint(self, path: str | Path, template: dict[str, Any] | Callable[[set[str]], dict[str, Any]]
                                ) -> tuple[dict[str, Any], dict[str, Any]]:
        """:func:`treadle.checkpoint.sharded.load_sharded`: ``(state, small payloads)``."""
        from treadle.checkpoint.sharded import load_sharded

        return load_sharded(path, template)


class _SequentialCollectiveHint(logging.Filter):
    """Drops DTensor's hint that reducing over two mesh dimensions takes two collectives:
    treadle's reductions over both (the gradient norm, a scalar; full state dicts for
    checkpoints and exports, gathered rarely) cost nothing worth a line on every rank."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("While redistributing from")


def _quiet_sequential_collective_hints() -> None:
    hinting = logging.getLogger("torch.distributed.tensor._redistribute")
    if not any(isinstance(f, _SequentialCollectiveHint) for f in hinting.filters):
        hinting.addFilter(_SequentialCollectiveHint())


def dist_backend() -> str:
    """The default process group's backend (gloo on the CPU, nccl on CUDA)."""
    import torch.distributed as dist

    return str(dist.get_backend())


def _find_dtensor(obj: Any, where: str = "payloads") -> str | None:
    """Where the first DTensor inside nested dicts/lists/tuples is, or None."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return where
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        found = _find_dtensor(v, f"{where}[{k!r}]")
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def _no_gradient_sync(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
