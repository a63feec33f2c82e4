"""The FSDP strategy's device mesh: torch's ``DeviceMesh`` over the run's
:class:`~treadle.distributed.layout.MeshShape`, and the sub-meshes each parallelism takes.

    mesh = ParallelMesh.build("cuda", shape)    # torch's DeviceMesh, dims named as DIMS
    mesh.fsdp, mesh.tp                          # what fully_shard and parallelize_module take

The ranks and groups themselves are computed in treadle/distributed/layout.py.
"""

from __future__ import annotations

from typing import Any

from treadle.distributed.layout import DIMS, MeshShape


class ParallelMesh:
    """torch's DeviceMesh over a :class:`MeshShape`, with the sub-meshes each parallelism
    takes. Built by every rank together (a collective)."""

    def __init__(self, mesh: Any, shape: MeshShape) -> None:
        self.mesh, self.shape = mesh, shape

    @classmethod
    def build(cls, device_type: str, shape: MeshShape) -> "ParallelMesh":
        from torch.distributed.device_mesh import init_device_mesh

        # Only the dimensions that split: a plain FSDP run keeps the one-dimensional mesh
        # (and the DTensor layouts) it always had.
        names = [d for d, n in zip(DIMS, (shape.dp_replicate, shape.dp_shard, shape.tp)) if n > 1 or d == "dp_shard"]
        sizes = tuple(getattr(shape, d) for d in names)
        return cls(init_device_mesh(device_type, sizes, mesh_dim_names=tuple(names)), shape)

    @property
    def fsdp(self) -> Any:
        """What ``fully_shard`` takes: ``(dp_replicate, dp_shard)`` for HSDP, else ``dp_shard``."""
        return self.mesh["dp_replicate", "dp_shard"] if self.shape.dp_replicate > 1 else self.mesh["dp_shard"]

    @property
    def tp(self) -> Any:
        """What ``parallelize_module`` takes (None without tensor parallelism)."""
        return self.mesh["tp"] if self.shape.tp > 1 else None


__all__ = ["ParallelMesh"]
