"""PreciseBNHook: BatchNorm statistics recomputed with the weights fixed, before validation.

During training the running mean and variance of a BatchNorm layer average statistics
of weights that kept changing; validation then normalizes with statistics no single
model had. This hook recomputes them for the trained weights (Wu and Johnson,
"Rethinking Batch in BatchNorm", Sec. 3), as mmpretrain's ``PreciseBNHook`` and
detectron2's ``PreciseBN`` do:

1. every BatchNorm layer in training mode that tracks running statistics gets
   ``momentum = 1``, so after a forward pass its running mean and variance are that
   batch's (the variance unbiased, as torch keeps it);
2. ``N`` training batches go through the model in training mode, without gradients (the
   evaluation step's forward: ``trainer.forward_eval``), and each layer's running mean
   and variance after each batch are averaged with equal weights, ``1/N`` each;
3. with several processes the averages are averaged over the data-parallel ranks (each
   read ``N`` batches of its shard);
4. the averages become the running statistics and the momentum is put back.

``N`` is ``num_batches``, or ``num_samples // (batch_size * data-parallel ranks)``
(mmpretrain's rule, ``num_samples=8192`` by default), at most the loader's length. The
batches are those the epoch being closed began with: the training loader's order for
that epoch, read through a copy of the loader (``trainer.training_batches(epoch)``), so
the training loop's place does not move.

When: after every ``interval``-th training epoch (epoch-based) or after every
``interval``-th iteration (iteration-based), before the validation that follows and
before the checkpoint hook saves (priority ``ABOVE_NORMAL``: before ``NORMAL`` hooks such
as the EMA, and the checkpoint hook's ``VERY_LOW``).

State and resume: the hook keeps none. What it changes is in the model's buffers (the
running statistics, and BatchNorm's ``num_batches_tracked``, which counts its passes
too, as in mmpretrain), so a checkpoint saved after it holds the precise statistics.
Its forward passes draw from the global random streams (dropout) inside
``torch.random.fork_rng``: training's streams, and so a resumed run, are the same
whether or not the hook ran. Layers in evaluation mode (frozen BatchNorm), without
running statistics, and other normalizations (GroupNorm, LayerNorm, InstanceNorm) are
left alone.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from treadle.distributed.comm import all_gather_object
from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"PreciseBNHook {name}={value!r}; expected an int >= 1")
    return value


def precise_layers(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers whose statistics the hook recomputes: in training mode, with
    running statistics."""
    return [m for m in module.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats]


class PreciseBNHook(Hook):
    """Recompute BatchNorm statistics over ``N`` training batches (see the module's docstring).

    Args:
        num_samples: ``N = num_samples // (batch_size * data-parallel ranks)`` (mmpretrain's
            argument; 8192 by default).
        interval: every this many epochs (epoch-based) or iterations (iteration-based).
        num_batches: ``N`` itself, instead of ``num_samples``.
    """

    priority = Priority.ABOVE_NORMAL

    def __init__(self, num_samples: int = 8192, interval: int = 1, num_batches: int | None = None) -> None:
        self.num_samples = _positive_int(num_samples, "num_samples")
        self.interval = _positive_int(interval, "interval")
        self.num_batches = None if num_batches is None else _positive_int(num_batches, "num_batches")

    def next_train_iter(self, state: Any) -> int | None:
        """Iteration-based: after every ``interval``-th iteration; epoch-based: none."""
        if state.by_epoch:
            return None
        return state.iter + (-(state.iter + 1)) % self.interval

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        s = trainer.state
        if not s.by_epoch and (s.iter + 1) % self.interval == 0:
            self.recompute(trainer, s.epoch)

    def after_train_epoch(self, trainer: "RunView") -> None:
        s = trainer.state
        loop = trainer.train_loop
        complete = loop is None or loop.closing_complete  # a stop inside the epoch: no statistics now
        if s.by_epoch and complete and (s.epoch + 1) % self.interval == 0:
            self.recompute(trainer, s.epoch)

    def batches(self, trainer: "RunView") -> int:
        """``N``: the batches each process reads."""
        loader = trainer.train_dataloader
        if self.num_batches is not None:
            n = self.num_batches
        else:
            batch_size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None),
                                                                           "batch_size", None)
            if not isinstance(batch_size, int):
                raise ValueError(f"PreciseBNHook: the training loader ({type(loader).__name__}) has no batch_size to "
                                 "count num_samples in; give num_batches instead")
            n = self.num_samples // (batch_size * trainer.strategy.dp_size)
        try:
            n = min(n, len(loader))
        except TypeError:
            pass
        return n

    def recompute(self, trainer: "RunView", epoch: int) -> None:
        """Steps 1 to 4 of the module's docstring, over the first ``N`` batches of ``epoch``."""
        layers = precise_layers(trainer.module)
        if not layers:
            get_logger().warning("PreciseBNHook: the model has no BatchNorm layer in training mode with running "
                                 "statistics; nothing to recompute")
            return
        n = self.batches(trainer)
        if n < 1:
            raise ValueError(f"PreciseBNHook: num_samples={self.num_samples} gives no batch "
                             f"(batch_size x {trainer.strategy.dp_size} data-parallel ranks is larger); "
                             "give more num_samples or num_batches")
        means = [torch.zeros_like(m.running_mean) for m in layers]  # type: ignore[arg-type]
        variances = [torch.zeros_like(m.running_var) for m in layers]  # type: ignore[arg-type]
        momenta = [m.momentum for m in layers]
        device = trainer.strategy.device
        devices = [device] if device.type == "cuda" else []
        seen = 0
        try:
            for m in layers:
                m.momentum = 1.0
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                for batch in itertools.islice(trainer.training_batches(epoch), n):
                    trainer.forward_eval(batch)
                    for i, m in enumerate(layers):
                        means[i] += m.running_mean / n  # type: ignore[operator]
                        variances[i] += m.running_var / n  # type: ignore[operator]
                    seen += 1
        finally:
            for m, momentum in zip(layers, momenta):
                m.momentum = momentum
        if seen != n:
            raise RuntimeError(f"PreciseBNHook: the training loader gave {seen} batches, fewer than the {n} needed")
        group = trainer.strategy.layout.data_object_group  # the ranks that read different batches
        means, variances = _mean_over_ranks(means, group), _mean_over_ranks(variances, group)
        for m, mean, var in zip(layers, means, variances):
            m.running_mean.copy_(mean)  # type: ignore[union-attr]
            m.running_var.copy_(var)  # type: ignore[union-attr]
        if trainer.is_main:
            get_logger().info(f"PreciseBNHook: statistics of {len(layers)} BatchNorm layers recomputed over {n} "
                              f"batches per process")


def _mean_over_ranks(tensors: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Each tensor averaged over the data-parallel ranks of ``group`` (None: every rank;
    one process: unchanged)."""
    gathered = all_gather_object([t.cpu() for t in tensors], group=group)
    if len(gathered) == 1:
        return tensors
    return [sum(rank[i] for rank in gathered).to(t.device) / len(gathered) for i, t in enumerate(tensors)]


__all__ = ["PreciseBNHook", "precise_layers"]
