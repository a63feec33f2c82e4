"""DDPStrategy: one model replica per process, gradients all-reduced by DDP.

    strategy = DDPStrategy(find_unused_parameters=False, static_graph=False,
                           gradient_as_bucket_view=True, sync_buffers=True, timeout_s=1800, sync_bn=False,
                           stall_warn_s=300, stall_timeout_s=None)

``setup()`` initialises the process group from the launcher's environment (torchrun,
SLURM, MPI; see treadle/distributed/env.py): gloo on CPU, nccl on CUDA with one GPU per
local rank. The model is wrapped in ``DistributedDataParallel``; with gradient
accumulation the micro-batches that do not step run under ``no_sync`` (forward and
backward), so gradients cross the network once per window. Checkpoints hold the
unwrapped module's state dict, written once by rank 0. ``sync_bn=True`` makes every
BatchNorm layer a SyncBatchNorm over all processes before wrapping
(treadle/strategies/sync_batchnorm.py; on the CPU too); one process keeps BatchNorm.
``stall_warn_s``/``stall_timeout_s``: the stall watch, ``empty_init``: a model spec built on
the meta device, each replica materialized whole (see ProcessGroupStrategy).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from treadle.compat import ddp_buffer_kwargs
from treadle.optim.wrapper import GradientSync
from treadle.strategies.base import ProcessGroupStrategy, move_model


@dataclass(eq=False)
class DDPStrategy(ProcessGroupStrategy):
    """DistributedDataParallel over torch.distributed (see the module docstring).

    Args:
        find_unused_parameters, static_graph, gradient_as_bucket_view: DDP's own.
        sync_buffers: buffers (BatchNorm statistics, ...) broadcast from rank 0 before
            each forward.
        backend, timeout_s, shard_data, sync_bn, stall_warn_s, stall_timeout_s, empty_init:
            the options every multi-process strategy takes (``ProcessGroupStrategy``).
    """

    name = "ddp"

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = True
    sync_buffers: bool = True

    def setup_model(self, model: nn.Module) -> nn.Module:
        model = self.convert_batchnorm(move_model(self.materialize_model(model), self.device))  # sync_bn
        if not self.distributed:  # one process: DDP would only add overhead
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(
            model, device_ids=device_ids, find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph, gradient_as_bucket_view=self.gradient_as_bucket_view,
            **ddp_buffer_kwargs(self.sync_buffers))

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def eval_model(self, model: nn.Module) -> nn.Module:
        return self.unwrap(model)

    def gradient_sync(self, model: nn.Module) -> GradientSync:
        """DDP's ``no_sync`` for micro-batches that do not step (one all-reduce per window)."""
        return GradientSync(no_sync=model.no_sync if isinstance(model, DistributedDataParallel) else None)
