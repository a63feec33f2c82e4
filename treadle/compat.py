"""What differs between the torch releases treadle supports, in one place.

treadle runs on torch ``TORCH_FLOOR`` and newer (pyproject.toml gives the same range,
docs/environments.md says how each release was tested). Code elsewhere
in treadle is written for the floor; where a release behaves differently, the
difference is handled here, and each shim names the releases that need it. Where the
behaviour can be seen before it runs (a keyword a function takes), the shim looks at it, so
a patched or nightly build takes the right branch; what shows only once training runs,
some of it as wrong numbers, is judged by the release.

This module is imported first by ``import treadle`` and must stay cheap: torch is
already loaded, nothing else is imported at module level.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

TORCH_FLOOR = (2, 6)  # FSDP2's public ``torch.distributed.fsdp.fully_shard`` (2.6)
TORCH_FLOOR_TEXT = ".".join(map(str, TORCH_FLOOR))


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: '2.11.0+cu130' -> (2, 11)."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        raise ValueError(f"cannot read a torch release from {version!r}") from None


@functools.cache
def _takes(fn: Any, name: str) -> bool:
    """Whether ``fn`` has a parameter ``name`` (looked at once per function)."""
    return name in inspect.signature(fn).parameters


def check_torch(version: str | None = None) -> None:
    """Raise ImportError, in one line, when the installed torch is below the floor."""
    version = str(torch.__version__ if version is None else version)
    if release(version) < TORCH_FLOOR:
        raise ImportError(f"treadle needs torch>={TORCH_FLOOR_TEXT}, but torch {version} is installed: "
                          f"pip install 'torch>={TORCH_FLOOR_TEXT}'")


# ----------------------------------------------------------------------------- DDP


def ddp_buffer_kwargs(sync_buffers: bool) -> dict[str, Any]:
    """DistributedDataParallel's argument for syncing buffers from rank 0 before each
    forward: ``forward_sync_buffers`` (torch 2.13 and newer, which deprecate the old name),
    ``broadcast_buffers`` in 2.6 to 2.12, which have no other."""
    from torch.nn.parallel import DistributedDataParallel

    name = "forward_sync_buffers" if _takes(DistributedDataParallel.__init__, "forward_sync_buffers") \
        else "broadcast_buffers"
    return {name: sync_buffers}


# ----------------------------------------------------------------------------- FSDP

# Judged by release: these failures show only once training runs, some as wrong numbers.
FSDP_ON_CPU = (2, 8)  # 2.6: fully_shard cannot run on the CPU ('Stream' has no 'record_event'); 2.7: it asks gloo
#   to reduce-scatter the gradients with ReduceOp.AVG, which gloo sums: N times too large on N processes, and
#   2.7 has no way to ask for the sum and divide itself (2.8: gloo_sums_average below)
GLOO_AVERAGE = (2, 9)  # 2.7, 2.8: gloo's reduce-scatter takes ReduceOp.AVG for a sum (2 processes: gradients x2)
SYNC_BN_FSDP_ON_CPU = (2, 9)  # 2.7, 2.8: an FSDP model whose BatchNorm is synchronized on the CPU trains
#   away from one process on the whole batch (tests/strategies/test_sync_batchnorm.py); DDP's is right
FSDP_MIXED_ON_CPU = (2, 12)  # 2.7-2.11: backward fails with a 16-bit param_dtype over gloo
#                              ("Found dtype Float but expected BFloat16")
DCP_RESHARD = (2, 9)  # 2.7, 2.8: once a sharded checkpoint is loaded onto another number of
#   processes, training departs from the uninterrupted run (8e-4 after one AdamW step of a
#   2-layer MLP, 1 -> 2 gloo ranks, in plain torch; exact onto the same number). Seen on the
#   CPU; held on every device, as nothing here says it is the CPU's. 2.6: not run (above).


def _needs(need: tuple[int, int], version: str | None) -> str | None:
    version = str(torch.__version__ if version is None else version)
    return None if release(version) >= need else f"torch>={'.'.join(map(str, need))}, but torch {version} is installed"


def fsdp_cpu_problem(mixed_precision: bool, version: str | None = None, replicas: bool = False,
                     sync_bn: bool = False) -> str | None:
    """Why FSDP cannot train on several CPU processes (gloo) with this torch, or None
    (``replicas``: HSDP, more than one replica, whose all-reduce across replicas is gloo's
    average too: the same release as FSDP's; ``sync_bn``: BatchNorm synchronized)."""
    need = _needs(FSDP_MIXED_ON_CPU if mixed_precision else FSDP_ON_CPU, version)
    if need is None and sync_bn:
        need = _needs(SYNC_BN_FSDP_ON_CPU, version)
        if need is not None:
            return (f"FSDP with sync_bn=True on the CPU (gloo) needs {need}; with DDP (strategy='ddp', "
                    "sync_bn=True) it trains on this release")
    if need is None:
        return None
    if mixed_precision:
        return f"FSDP with a 16-bit param_dtype on the CPU (gloo) needs {need}; on CUDA (nccl), FSDP runs from torch " \
               f"{TORCH_FLOOR_TEXT}"
    return (f"FSDP on the CPU (gloo) needs {need} (older releases sum the gradients of the processes where they "
            f"should average them); on CUDA (nccl), FSDP runs from torch {TORCH_FLOOR_TEXT}")


def gloo_sums_average(modules: Any, version: str | None = None) -> None:
    """On releases whose gloo sums what FSDP asks it to average (2.8; :data:`GLOO_AVERAGE`):
    each ``fully_shard``-ed module of ``modules`` sums and divides by the number of
    processes itself (FSDP's ``set_force_sum_reduction_for_comms``), as it does for float16.
    Nothing to do from 2.9, nor on CUDA (nccl averages)."""
    if _needs(GLOO_AVERAGE, version) is None:
        return
    for module in modules:
        force = getattr(module, "set_force_sum_reduction_for_comms", None)
        if callable(force):
            force(True)


def mesh_reshard_problem(saved_mesh: dict[str, int], mesh: dict[str, int], version: str | None = None) -> str | None:
    """Why a sharded checkpoint saved on the device mesh ``saved_mesh`` (same number of
    processes, other dimensions: ``{"dp_replicate": 1, "dp_shard": 2, "tp": 2}``) cannot
    be loaded for training on ``mesh`` with this torch, or None: the same resharding as
    :func:`reshard_problem`'s (2.7 and 2.8)."""
    need = _needs(DCP_RESHARD, version) if saved_mesh != mesh else None
    if need is None:
        return None
    text = lambda m: " x ".join(f"{k}={v}" for k, v in m.items())  # noqa: E731
    return (f"loading a sharded checkpoint saved on the mesh {text(saved_mesh)} onto {text(mesh)} needs {need} (older "
            "releases train on from it wrong); resume it on the same mesh, or consolidate it into full weights "
            "(treadle export, or load_from=)")


def reshard_problem(saved_world: int, world: int, version: str | None = None) -> str | None:
    """Why a sharded checkpoint saved by ``saved_world`` processes cannot be loaded for
    training by ``world`` on this torch, or None."""
    need = _needs(DCP_RESHARD, version) if saved_world != world else None
    if need is None:
        return None
    return (f"loading a sharded checkpoint saved by {saved_world} process(es) onto {world} needs {need} (older "
            f"releases train on from it wrong); resume it on {saved_world}, or consolidate it into full weights "
            "(treadle export, or load_from=)")


# ----------------------------------------------------------------------------- DCP


def dcp_kwargs(fn: Any, no_dist: bool) -> dict[str, Any]:
    """``no_dist=`` for ``dcp.save``/``async_save``/``load`` where they take it.

    torch 2.6 has no such argument: DCP decides by itself, running without collectives
    when no process group is initialised (what ``no_dist=True`` means here, but for
    a process group of one, on which 2.6 then runs its collectives: correct, slower).
    """
    return {"no_dist": no_dist} if _takes(fn, "no_dist") else {}


def saved_storage_data(metadata: Any, read_back: Callable[[], Any]) -> Any:
    """The ``storage_data`` of the ``Metadata`` a DCP save returned: where each item went.

    torch 2.11 returns its Metadata with ``storage_data=None`` (the files are written and
    ``.metadata`` on disk holds it): then ``read_back()`` reads that file's Metadata.
    """
    if metadata.storage_data is not None:
        return metadata.storage_data
    return read_back().storage_data


def staged_for_async_save(state: Any) -> Any:
    """``state`` as ``dcp.async_save`` may be handed it while training goes on.

    torch 2.6's async_save "stages" with ``tensor.cpu()``, which returns a CPU tensor
    itself, not a copy: the background write would then read weights that training has
    changed since (CPU runs, FSDP's ``cpu_offload``). There, CPU tensors are copied here
    first; 2.7 and newer copy them into buffers of their own.
    """
    if release(str(torch.__version__)) >= (2, 7):
        return state
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.detach().clone() if t.device.type == "cpu" else t, state)


# ----------------------------------------------------------------------------- weights_only globals


def class_allowed_as(full_name: str, base: type, attrs: dict[str, Any]) -> type:
    """A subclass of ``base`` that ``torch.serialization.safe_globals`` allows under the
    global name ``full_name`` (``module.Qual.Name``) of a pickle.

    torch 2.7 and newer look an allowed class up by ``{__module__}.{__qualname__}``; 2.6 by
    ``{__module__}.{__name__}``: the class claims the name both ways.
    """
    module, _, qualname = full_name.rpartition(".")
    return type(qualname.rpartition(".")[2], (base,), {**attrs, "__module__": module, "__qualname__": qualname})


def unsafe_globals_in(path: str) -> list[str]:
    """The globals of the checkpoint at ``path`` that ``weights_only`` does not allow, read
    from the pickle's opcodes (nothing run). ``get_unsafe_globals_in_checkpoint`` came with
    torch 2.6, the floor; a build without it lists none."""
    lister = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    return list(lister(path)) if lister is not None else []


# ----------------------------------------------------------------------------- stores


def store_get_many(store: Any, keys: list[str]) -> list[bytes]:
    """The values of ``keys`` in a ``torch.distributed`` Store, in one round trip where the
    store has the extended API (``multi_get``: TCPStore and PrefixStore over it in every
    supported release; a custom Store may lack it), else one ``get`` each."""
    has = getattr(store, "has_extended_api", None)
    if callable(has) and has():
        return list(store.multi_get(keys))
    return [store.get(k) for k in keys]


# ----------------------------------------------------------------------------- flight recorder
#: The environment variables that size torch's flight recorder (its ring buffer of each
#: process group's last collectives): TORCH_FR_BUFFER_SIZE from 2.8, which also records
#: gloo; TORCH_NCCL_TRACE_BUFFER_SIZE, read by every supported release (NCCL only before 2.8).
FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_on() -> bool:
    """Whether this process's environment switches torch's flight recorder on."""
    for key in FLIGHT_RECORDER_ENV:
        value = os.environ.get(key)
        if value is not None:
            try:
                return int(value) > 0
            except ValueError:
                return False
    return False


def dump_flight_record() -> bytes | None:
    """This process's flight record, pickled as torch's analyzer reads it
    (``python -m torch.distributed.flight_recorder.fr_trace DIR``), or None when there is
    none. ``_dump_fr_trace`` from 2.8 (NCCL and gloo); ``_dump_nccl_trace`` before (2.6,
    2.7: NCCL only, and only in a CUDA build)."""
    import torch._C._distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return None
    try:
        return dump(True, True, False)  # collectives, stack traces, not only the active ones
    except (RuntimeError, TypeError):
        return None
