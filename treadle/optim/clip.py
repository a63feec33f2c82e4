"""Clipping by the global gradient norm when gradients are DTensors on several meshes.

FSDP over a data-parallel mesh composed with tensor parallelism leaves gradients on two
meshes: a tensor-parallel layer's on ``(dp, tp)``, the rest on ``dp`` alone. torch's
``clip_grad_norm_`` stacks their norms, and DTensor refuses to mix meshes. Here each
group of gradients that share a mesh and a layout gets its norm as torch computes it (a
DTensor whose reduction is pending), made whole with ``full_tensor()`` (one all-reduce
per group, no host read); the groups' norms then combine as single numbers. A plain
tensor's norm counts as it is: it is replicated on every rank that holds it. The
result is the norm one process would compute over the whole model.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor


def _layout(t: Tensor) -> Any:
    mesh = getattr(t, "device_mesh", None)
    return None if mesh is None else (id(mesh), tuple(t.placements))  # type: ignore[attr-defined]  # a DTensor's


def clip_grad_norm_meshes(parameters: Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                          error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for gradients on several device meshes; returns
    the total norm as a plain tensor (replicated on every rank)."""
    params = [p for p in parameters if p.grad is not None]
    groups: dict[Any, list[Tensor]] = {}
    for p in params:
        groups.setdefault(_layout(p.grad), []).append(p)  # type: ignore[arg-type]  # grad checked above
    if not groups:
        return torch.tensor(0.0)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type, False, foreach)
        full = getattr(norm, "full_tensor", None)
        norms.append(full() if full is not None else norm)
    device = norms[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
    if error_if_nonfinite and not torch.isfinite(total):  # a host read, as torch's own option costs
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, so it cannot be "
                           "clipped; set error_if_nonfinite=False to clip anyway")
    for group in groups.values():  # one mesh per call: DTensor multiplies within a mesh only
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach)
    return total


__all__ = ["clip_grad_norm_meshes"]
