"""SyncBatchNorm: BatchNorm statistics over all data-parallel ranks, on the GPU and on the CPU.

``DDPStrategy(sync_bn=True)`` and ``FSDPStrategy(sync_bn=True)`` call
:func:`convert_sync_batchnorm` before wrapping the model, with the strategy's
``layout.data_group`` (None: every process). Each ``BatchNorm1d/2d/3d`` becomes a
synchronized layer with the same parameters (the same ``Parameter`` objects), buffers,
mode and name, so state dict keys do not change and a checkpoint loads with or without it.

In training, a synchronized layer normalizes with the mean and variance of the whole
batch across the group's ranks, so N processes with B samples each compute what one
process computes on the N x B batch (up to float rounding: sums are taken in another
order), running statistics included, and gradients flow back through the statistics to
every rank's inputs. In evaluation it uses the running statistics, as BatchNorm does.

Which layer: on CUDA (any device but the CPU) torch's ``nn.SyncBatchNorm``, its fused
kernels unchanged. torch refuses the CPU twice (checked on torch 2.13; both checks are older
than the releases treadle supports): ``nn.SyncBatchNorm``
raises "SyncBatchNorm expected input tensor to be on GPU" in training (its statistics
kernels have no CPU implementation), and ``DistributedDataParallel`` refuses a CPU module
holding one ("SyncBatchNorm layers only work with GPU modules"). On the CPU the layer is
therefore :class:`CPUSyncBatchNorm`, which computes the same thing with plain tensor ops
and one collective: each rank's per-channel mean, biased variance and count are gathered
(an all-reduce of a zero-padded matrix, which gloo runs and autograd differentiates) and
combined exactly (Chan's pairwise formula: no E[x^2] - E[x]^2 cancellation); backward
all-reduces the gradients of those statistics, one more collective. Every rank of the
group must call it equally often, as with torch's class.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm  # the base of BatchNorm1d/2d/3d and SyncBatchNorm, 2.6 to 2.14

#: The BatchNorm classes :func:`convert_sync_batchnorm` replaces.
BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) over ``group``, in forward and, for the gradient, in backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.contiguous().clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


class CPUSyncBatchNorm(_BatchNorm):
    """A BatchNorm layer (any input of 2 dimensions or more) whose training statistics are
    those of the whole batch across ``process_group``'s ranks (None: every process), on
    the CPU with gloo, where torch's ``nn.SyncBatchNorm`` cannot run (see the module
    docstring). Its ops are device-agnostic; treadle uses it on the CPU only. Without a
    process group, and in evaluation, it is BatchNorm."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(input)
        return self._synced_forward(input)

    def _synced_forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if x.shape[1] == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        group = self.process_group
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        acc = x if x.dtype in (torch.float32, torch.float64) else x.float()  # statistics in float32 at least
        count = x.numel() // channels
        if count:
            mean, var = acc.mean(dims), acc.var(dims, unbiased=False)
        else:  # an empty share: it adds nothing
            mean = var = acc.new_zeros(channels)
        local = torch.cat([mean, var, acc.new_full((1,), float(count))])
        rows = torch.stack([local if r == rank else torch.zeros_like(local) for r in range(ranks)])
        rows = _SumOverRanks.apply(rows, group)  # row r: rank r's statistics
        means, variances, counts = rows[:, :channels], rows[:, channels:2 * channels], rows[:, 2 * channels:]
        total = counts.sum()
        if float(total.detach()) <= 1:  # a host read: this layer runs on the CPU
            raise ValueError(f"Expected more than 1 value per channel when training, got {int(total)} over "
                             f"{ranks} process(es) for input of size {tuple(x.shape)}")
        weights = counts / total
        mean = (weights * means).sum(0)
        var = (weights * (variances + (means - mean).square())).sum(0)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                unbiased = var * (total / (total - 1))
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        shape = [1, channels] + [1] * (x.dim() - 2)
        out = (acc - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(x.dtype)


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None, *, cpu: bool = True) -> nn.Module:
    """``module`` with every BatchNorm layer (:data:`BATCHNORMS`) synchronized over
    ``process_group`` (None: every process), in place; returns ``module``, or its
    replacement when ``module`` is itself a BatchNorm layer. ``cpu``: the model computes on
    the CPU, so the layers become :class:`CPUSyncBatchNorm` (and a ``torch.nn.SyncBatchNorm``
    already there becomes one too); else torch's ``nn.SyncBatchNorm.convert_sync_batchnorm``.
    Hooks registered on a replaced layer are not carried over (as with torch's)."""
    if not cpu:
        return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
    if isinstance(module, (*BATCHNORMS, nn.SyncBatchNorm)):
        new = CPUSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats, process_group)
        if module.affine:
            new.weight, new.bias = module.weight, module.bias  # the same Parameter objects
        new.running_mean, new.running_var = module.running_mean, module.running_var
        new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        if hasattr(module, "qconfig"):
            new.qconfig = module.qconfig
        return new
    if isinstance(module, CPUSyncBatchNorm):
        module.process_group = process_group
    for name, child in module.named_children():
        replaced = convert_sync_batchnorm(child, process_group)
        if replaced is not child:
            setattr(module, name, replaced)
    return module


def count_batchnorms(module: nn.Module) -> int:
    """How many BatchNorm layers (:data:`BATCHNORMS`, synchronized or not) ``module`` holds."""
    return sum(isinstance(m, (*BATCHNORMS, nn.SyncBatchNorm, CPUSyncBatchNorm)) for m in module.modules())


__all__ = ["BATCHNORMS", "CPUSyncBatchNorm", "convert_sync_batchnorm", "count_batchnorms"]
