"""How the processes of a run split, and which of them each reduction runs over: the
one object that knows it (:class:`ParallelLayout`), built once by the strategy
(``strategy.layout``) and asked by everyone else: the loaders (which shard of the data a
rank reads), the metrics and the evaluation (over which ranks results are summed, each
batch once), PreciseBN, the logged values, the checkpoints (the layout that saved).

    shape = MeshShape(dp_replicate=2, dp_shard=-1, tp=2).resolve(world_size=8)   # 2 x 2 x 2
    layout = ParallelLayout(shape, rank=5, data_group=..., data_object_group=...)
    layout.dp_rank, layout.dp_size, layout.tp_size   # 2, 4, 2: rank 5 reads the third of 4 shards

Ranks lie row-major over ``(dp_replicate, dp_shard, tp)``, as ``init_device_mesh`` lays
them: ``rank = (r * S + s) * T + t``. The ``T`` ranks of a tensor-parallel group are
neighbours, so they share a node whenever ``T`` divides the GPUs per node (TP's
collectives run inside every layer; the data-parallel ones once per step). A rank's
data-parallel index, the shard of the data it reads, is ``r * S + s = rank // T``: the
ranks of one tensor-parallel group read the same batches.

This module is the one place that computes ranks and groups; the strategy builds torch's
device mesh from the same shape (treadle/strategies/mesh.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The mesh's dimension names, outermost first (Accelerate and torchtitan use the same).
DIMS = ("dp_replicate", "dp_shard", "tp")


def _size(name: str, value: Any, extra: tuple[Any, ...] = ()) -> Any:
    if value in extra and not isinstance(value, bool):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        more = "".join(f" or {e!r}" for e in extra)
        raise ValueError(f"{name}={value!r}; expected a positive int{more}")
    return value


@dataclass(frozen=True)
class MeshShape:
    """How many ways the processes split: ``dp_replicate`` replicas (HSDP when > 1), each
    sharded ``dp_shard`` ways (FSDP), each shard split ``tp`` ways (tensor parallel).
    ``-1`` (for one of ``dp_shard`` and ``dp_replicate``) takes what the others leave of
    the world size; ``dp_shard="node"`` is the processes of one node (HSDP's usual
    layout: shards within a node, replicas across nodes)."""

    dp_replicate: int = 1
    dp_shard: int | str = -1
    tp: int = 1

    def __post_init__(self) -> None:
        _size("dp_replicate", self.dp_replicate, (-1,))
        _size("dp_shard", self.dp_shard, (-1, "node"))
        _size("tp", self.tp)
        if self.dp_replicate == -1 and self.dp_shard == -1:
            raise ValueError("dp_replicate=-1 and dp_shard=-1; expected at most one of them to take what is left")

    def resolve(self, world_size: int, local_world_size: int | None = None) -> "MeshShape":
        """The shape for ``world_size`` processes, ``local_world_size`` of them per node
        (-1 and "node" filled in); a one-line ValueError when the product is not the world size."""
        r, s, t = self.dp_replicate, self.dp_shard, self.tp
        if s == "node":
            s = (local_world_size or world_size) // t
            if s < 1 or s * t != (local_world_size or world_size):
                raise ValueError(f"dp_shard='node' with tp={t}: tp does not divide the {local_world_size or world_size} "
                                 "process(es) of a node; expected a tp that divides them")
        if r == -1 or s == -1:
            known = t * (s if r == -1 else r)
            if world_size % known:
                named = f"dp_shard={s}" if r == -1 else f"dp_replicate={r}"
                raise ValueError(f"{named} x tp={t} = {known} does not divide the {world_size} process(es) "
                                 "of this job; expected dp_replicate x dp_shard x tp = the number of processes")
            r, s = (world_size // known, s) if r == -1 else (r, world_size // known)
        if r * s * t != world_size:
            raise ValueError(f"dp_replicate={r} x dp_shard={s} x tp={t} = {r * s * t} process(es), but this job has "
                             f"{world_size}; expected dp_replicate x dp_shard x tp = the number of processes "
                             "(dp_shard=-1 takes what is left)")
        return MeshShape(r, s, t)

    @property
    def resolved(self) -> bool:
        return isinstance(self.dp_shard, int) and self.dp_shard > 0 and self.dp_replicate > 0

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: the number of different batches a step sees."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        """The data shard ``rank`` reads (shared by its tensor-parallel group)."""
        return rank // self.tp

    def tp_rank(self, rank: int) -> int:
        """``rank``'s place inside its tensor-parallel group."""
        return rank % self.tp

    def dp_groups(self) -> list[list[int]]:
        """The ranks of each data-parallel group (one per tensor-parallel index): the
        ranks whose batches differ, over which losses and metrics are reduced."""
        return [[d * self.tp + t for d in range(self.dp_size)] for t in range(self.tp)]

    def as_dict(self) -> dict[str, int]:
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp}

    def describe(self) -> str:
        """For a person: ``2 replicas x 2 shards x tp 2 (8 processes)``."""
        parts = []
        if self.dp_replicate > 1:
            parts.append(f"{self.dp_replicate} replicas")
        parts.append(f"{self.dp_shard} shard{'s' if self.dp_shard != 1 else ''}")
        if self.tp > 1:
            parts.append(f"tp {self.tp}")
        return f"{' x '.join(parts)} ({self.dp_size * self.tp} processes)"


@dataclass(frozen=True)
class ParallelLayout:
    """How the processes split (``shape``: replicas x shards x tensor parallel), this
    process's ``rank``, and the groups the data-parallel reductions run over:
    ``data_group`` on the training backend (torchmetrics objects, SyncBatchNorm) and
    ``data_object_group`` over gloo (Python objects: sums of results). Both None when the
    data-parallel ranks are every process (no tensor parallelism): the world's groups
    serve. The default is one process."""

    shape: MeshShape = field(default_factory=lambda: MeshShape(1, 1, 1))
    rank: int = 0
    data_group: Any = None
    data_object_group: Any = None

    @classmethod
    def data_parallel(cls, world_size: int, rank: int) -> "ParallelLayout":
        """Every process a data-parallel rank (DDP, DeepSpeed, FSDP without tensor parallelism)."""
        return cls(MeshShape(1, world_size, 1), rank)

    @property
    def world_size(self) -> int:
        return self.shape.dp_size * self.shape.tp

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def dp_rank(self) -> int:
        """The shard of the data this process reads (shared by its tensor-parallel group)."""
        return self.shape.dp_rank(self.rank)

    @property
    def dp_size(self) -> int:
        """How many shards the data is split into: the number of different batches a step sees."""
        return self.shape.dp_size

    @property
    def tp_size(self) -> int:
        """Tensor-parallel ranks per data shard (1: none)."""
        return self.shape.tp

    def data_leaders(self) -> list[int]:
        """One rank per data shard, in shard order (the results of the others repeat theirs)."""
        return self.shape.dp_groups()[0]

    def describe(self) -> str:
        return self.shape.describe()


def data_groups(shape: MeshShape, rank: int, backends: tuple[str, ...]) -> dict[str, Any]:
    """This rank's data-parallel group for each of ``backends`` (``{"gloo": g, ...}``);
    every rank creates every group (a collective). Empty when the data-parallel ranks are
    the whole world (no tensor parallelism): then the world group serves."""
    if shape.tp == 1:
        return {}
    import torch.distributed as dist

    groups = shape.dp_groups()
    mine = next(g for g in groups if rank in g)
    out = {}
    for backend in dict.fromkeys(backends):
        made = [dist.new_group(ranks, backend=backend) for ranks in groups]  # same order on every rank
        out[backend] = made[groups.index(mine)]
    return out


__all__ = ["DIMS", "MeshShape", "ParallelLayout", "data_groups"]
