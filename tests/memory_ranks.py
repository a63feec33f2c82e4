"""The 2-process gloo runs of tests/strategies/test_activation_checkpointing.py and
tests/strategies/test_sync_batchnorm.py, in one call of dist_support.run_ranks (cached: the
slow tier starts the processes once for both modules).

Each rank, with DDPStrategy and with FSDPStrategy (skipped where torch cannot run FSDP on
the CPU: treadle/compat.py), through the public Strategy API (``prepare``):

* activation checkpointing: :class:`Stack` (two dropout blocks) trained 3 AdamW steps on
  this rank's half of each batch, with ``activation_checkpointing`` None, "full" and
  "selective"; the losses, the checkpointed modules, the final full weights (rank 0);
* sync_bn: :class:`ConvBN` (BatchNorm2d and BatchNorm1d) trained 2 SGD steps on this rank's
  half, with ``sync_bn`` True and False; each step's outputs and BatchNorm running
  statistics, the first step's (full) gradients, the final full weights.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

STEPS_AC = 3
STEPS_BN = 2
BATCH = 8  # global; each of the 2 ranks takes half


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.tanh(self.fc1(x))))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.blocks = nn.ModuleList([Block(8), Block(8)])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class ConvBN(nn.Module):
    """A convolution with BatchNorm2d, then a linear layer with BatchNorm1d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn2d = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 6)
        self.bn1d = nn.BatchNorm1d(6, momentum=None)  # a cumulative average: the other update rule
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn2d(self.conv(x))).mean((2, 3))
        return self.head(F.relu(self.bn1d(self.fc(x))))


def is_linear(module: nn.Module, out_features: int | None = None) -> bool:
    """A predicate for ``activation_checkpointing: {check_fn: memory_ranks.is_linear}`` in
    the config tests (an importable function)."""
    return isinstance(module, nn.Linear) and out_features in (None, module.out_features)


def make(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls()


def ac_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def bn_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(200 + step)
    return torch.randn(BATCH, 3, 6, 6, generator=g) * 2 + 1, torch.randn(BATCH, 2, generator=g)


def half(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = t.shape[0] // world
    return t[rank * n:(rank + 1) * n]


def bn_stats(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient (a DTensor's gathered: a collective under FSDP)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


def _strategy(kind: str, **options: Any) -> Any:
    from treadle.strategies.build import resolve_strategy

    strategy = resolve_strategy({"type": kind, **options})
    strategy.setup_env(seed=0)
    return strategy


def ac_runs(kind: str, rank: int, world: int) -> dict[str, Any]:
    from support import checkpointed_modules

    runs = {}
    for mode in (None, "full", "selective"):
        strategy = _strategy(kind, **({"wrap": ["Block"]} if kind == "fsdp" else {}))
        model, ow = strategy.prepare(make(Stack), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2)),
                                     activation_checkpointing=mode)
        losses = []
        for step in range(STEPS_AC):
            x, y = (half(t, rank, world) for t in ac_batch(step))
            loss = F.mse_loss(model(x), y)
            ow.update_params(loss)
            losses.append(float(loss.detach()))
        runs[mode or "none"] = {"losses": losses, "checkpointed": checkpointed_modules(strategy.module),
                                "weights": strategy.get_full_model_state(strategy.module)}
    return runs


def bn_runs(kind: str, rank: int, world: int) -> dict[str, Any]:
    from treadle.strategies.sync_batchnorm import CPUSyncBatchNorm

    runs = {}
    for sync in (True, False):
        strategy = _strategy(kind, sync_bn=sync)
        model, ow = strategy.prepare(make(ConvBN), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.5)))
        module = strategy.module
        record: dict[str, Any] = {"classes": [type(module.bn2d).__name__, type(module.bn1d).__name__],
                                  "synced": isinstance(module.bn2d, CPUSyncBatchNorm), "outputs": [], "stats": []}
        for step in range(STEPS_BN):
            x, y = (half(t, rank, world) for t in bn_batch(step))
            out = model(x)
            F.mse_loss(out, y).backward()
            if step == 0:
                record["grads"] = full_grads(module)
            ow.optimizer.step()
            ow.optimizer.zero_grad(set_to_none=True)
            record["outputs"].append(out.detach().clone())
            record["stats"].append(bn_stats(module))
        record["weights"] = strategy.get_full_model_state(module)
        runs["sync" if sync else "plain"] = record
    return runs


def worker(rank: int, world: int) -> dict[str, Any]:
    from treadle.compat import fsdp_cpu_problem

    out: dict[str, Any] = {"ddp": ac_runs("ddp", rank, world), "ddp_bn": bn_runs("ddp", rank, world)}
    problem = fsdp_cpu_problem(False)
    if problem is not None:
        out["fsdp_skipped"] = problem
        return out
    out["fsdp"] = ac_runs("fsdp", rank, world)
    problem = fsdp_cpu_problem(False, sync_bn=True)
    if problem is not None:  # treadle refuses it on this release
        out["fsdp_bn_skipped"] = problem
        return out
    out["fsdp_bn"] = bn_runs("fsdp", rank, world)
    return out


@functools.cache
def results() -> list[dict[str, Any]]:
    """Both ranks' results of :func:`worker` (run once per test session)."""
    from dist_support import run_ranks

    return run_ranks(worker, world_size=2, timeout_s=240)


__all__ = ["ConvBN", "Stack", "bn_batch", "bn_stats", "full_grads", "half", "is_linear", "make", "results", "worker"]
