"""The LR and momentum flavours of the generic parameter schedulers, under MMEngine's
names: ``LinearLR`` is :class:`LinearParamScheduler` on ``lr``, ``LinearMomentum`` the same
on momentum, and so on. Re-exported by :mod:`treadle.optim.schedulers`; the builder
(:mod:`treadle.optim.scheduler_builder`) imports them from here, as that module
re-exports the builder too.
"""

from __future__ import annotations

from typing import Any

from treadle.optim.param_schedulers import (
    ConstantParamScheduler, CosineAnnealingParamScheduler, CosineRestartParamScheduler,
    ExponentialParamScheduler, LinearParamScheduler, MultiStepParamScheduler, OneCycleParamScheduler,
    PolyParamScheduler, StepParamScheduler,
)
from treadle.optim.plateau import ReduceOnPlateauParamScheduler

__all__ = [
    "ConstantLR", "StepLR", "MultiStepLR", "ExponentialLR", "LinearLR", "CosineAnnealingLR", "PolyLR", "OneCycleLR",
    "CosineRestartLR", "ReduceOnPlateauLR",
    "ConstantMomentum", "StepMomentum", "MultiStepMomentum", "ExponentialMomentum", "LinearMomentum",
    "CosineAnnealingMomentum", "PolyMomentum", "CosineRestartMomentum", "ReduceOnPlateauMomentum",
]


# ---------------------------------------------------------------------------
# LR and momentum flavours (MMEngine's names)
# ---------------------------------------------------------------------------

class _LRMixin:
    """Fixes ``param_name='lr'``."""

    _fixed_param_name = "lr"

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, "lr", *args, **kwargs)  # type: ignore[call-arg]  # a mixin: the scheduler after it in the MRO takes these


class _MomentumMixin:
    """Fixes ``param_name='momentum'``; for Adam-style optimizers drives ``betas[0]``.

    Like MMEngine, Adam's groups get a ``momentum`` key mirroring ``betas[0]``,
    which is written back into ``betas`` after every step.
    """

    _fixed_param_name = "momentum"

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        raw = getattr(optimizer, "optimizer", optimizer)  # unwrap an OptimWrapper
        defaults = getattr(raw, "defaults", None)
        if defaults is None:
            defaults = optimizer.param_groups[0] if optimizer.param_groups else {}
        self.use_betas = False
        if "momentum" not in defaults:
            if "betas" not in defaults:
                raise ValueError(f"{type(self).__name__} needs an optimizer with `momentum` or "
                                 f"`betas`, got {type(raw).__name__}")
            self.use_betas = True
            for group in optimizer.param_groups:
                group["momentum"] = group["betas"][0]
        super().__init__(optimizer, "momentum", *args, **kwargs)  # type: ignore[call-arg]  # a mixin: the scheduler after it in the MRO takes these

    def step(self, *args: Any, **kwargs: Any) -> None:
        super().step(*args, **kwargs)  # type: ignore[misc]  # the scheduler's step(), after this mixin in the MRO
        if self.use_betas:
            for group in self.optimizer.param_groups:  # type: ignore[attr-defined]  # set by the scheduler's __init__
                group["betas"] = (group["momentum"], group["betas"][1])


class ConstantLR(_LRMixin, ConstantParamScheduler):
    """:class:`ConstantParamScheduler` on ``lr``."""


class StepLR(_LRMixin, StepParamScheduler):
    """:class:`StepParamScheduler` on ``lr``."""


class MultiStepLR(_LRMixin, MultiStepParamScheduler):
    """:class:`MultiStepParamScheduler` on ``lr``."""


class ExponentialLR(_LRMixin, ExponentialParamScheduler):
    """:class:`ExponentialParamScheduler` on ``lr``."""


class LinearLR(_LRMixin, LinearParamScheduler):
    """:class:`LinearParamScheduler` on ``lr`` (the usual warmup)."""


class CosineAnnealingLR(_LRMixin, CosineAnnealingParamScheduler):
    """:class:`CosineAnnealingParamScheduler` on ``lr``."""


class PolyLR(_LRMixin, PolyParamScheduler):
    """:class:`PolyParamScheduler` on ``lr``."""


class OneCycleLR(_LRMixin, OneCycleParamScheduler):
    """:class:`OneCycleParamScheduler` on ``lr``."""


class CosineRestartLR(_LRMixin, CosineRestartParamScheduler):
    """:class:`CosineRestartParamScheduler` on ``lr``."""


class ReduceOnPlateauLR(_LRMixin, ReduceOnPlateauParamScheduler):
    """:class:`ReduceOnPlateauParamScheduler` on ``lr``."""


class ConstantMomentum(_MomentumMixin, ConstantParamScheduler):
    """:class:`ConstantParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class StepMomentum(_MomentumMixin, StepParamScheduler):
    """:class:`StepParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class MultiStepMomentum(_MomentumMixin, MultiStepParamScheduler):
    """:class:`MultiStepParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class ExponentialMomentum(_MomentumMixin, ExponentialParamScheduler):
    """:class:`ExponentialParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class LinearMomentum(_MomentumMixin, LinearParamScheduler):
    """:class:`LinearParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class CosineAnnealingMomentum(_MomentumMixin, CosineAnnealingParamScheduler):
    """:class:`CosineAnnealingParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class PolyMomentum(_MomentumMixin, PolyParamScheduler):
    """:class:`PolyParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class CosineRestartMomentum(_MomentumMixin, CosineRestartParamScheduler):
    """:class:`CosineRestartParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class ReduceOnPlateauMomentum(_MomentumMixin, ReduceOnPlateauParamScheduler):
    """:class:`ReduceOnPlateauParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""
