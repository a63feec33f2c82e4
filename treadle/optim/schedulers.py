"""Parameter schedulers compatible with MMEngine's ``param_scheduler`` configs.

Every scheduler here takes MMEngine's class name and constructor arguments and
produces the same value at every step, so configs migrate unchanged. The
values are computed with the same *chainable* update rules (each step scales
the value currently in the param group), which is what lets several schedulers
on one optimizer compose in list order, e.g. a ``LinearLR`` warmup followed by
``CosineAnnealingLR``.

Stepping contract (same as MMEngine's runner): a scheduler applies its step-0
value when it is constructed; afterwards the trainer calls ``step()`` after
every training epoch when ``scheduler.by_epoch`` is true, otherwise after
every training iteration. ``ReduceOnPlateau*`` schedulers additionally have
``need_val_args = True`` and must be given ``step(metrics)`` after each
validation run.

The LR and momentum flavours are defined in :mod:`treadle.optim.lr_momentum`, the
config builder in :mod:`treadle.optim.scheduler_builder`; ``build_schedulers`` and
``SCHEDULERS`` are re-exported here.
"""

from __future__ import annotations

# The base class (scheduler_base), the generic *ParamScheduler classes (param_schedulers,
# plateau), their LR and momentum flavours (lr_momentum) and the builder live in modules
# that never import this one; they are re-exported here, along with the builder's helpers
# explicit_init_params/init_arg_names.
from treadle.optim.lr_momentum import (
    ConstantLR, StepLR, MultiStepLR, ExponentialLR, LinearLR, CosineAnnealingLR, PolyLR, OneCycleLR,
    CosineRestartLR, ReduceOnPlateauLR, ConstantMomentum, StepMomentum, MultiStepMomentum, ExponentialMomentum,
    LinearMomentum, CosineAnnealingMomentum, PolyMomentum, CosineRestartMomentum, ReduceOnPlateauMomentum,
)
from treadle.optim.param_schedulers import (
    ConstantParamScheduler, CosineAnnealingParamScheduler, CosineRestartParamScheduler,
    ExponentialParamScheduler, LinearParamScheduler, MultiStepParamScheduler, OneCycleParamScheduler,
    PolyParamScheduler, StepParamScheduler,
)
from treadle.optim.plateau import ReduceOnPlateauParamScheduler
from treadle.optim.scheduler_base import (
    INF, ParamScheduler, explicit_init_params, init_arg_names,
)
from treadle.optim.scheduler_builder import SCHEDULERS, build_schedulers

__all__ = [
    "INF", "ParamScheduler", "SCHEDULERS", "build_schedulers", "explicit_init_params", "init_arg_names",
    "ConstantParamScheduler", "StepParamScheduler", "MultiStepParamScheduler",
    "ExponentialParamScheduler", "LinearParamScheduler", "CosineAnnealingParamScheduler",
    "PolyParamScheduler", "OneCycleParamScheduler", "CosineRestartParamScheduler",
    "ReduceOnPlateauParamScheduler",
    "ConstantLR", "StepLR", "MultiStepLR", "ExponentialLR", "LinearLR", "CosineAnnealingLR",
    "PolyLR", "OneCycleLR", "CosineRestartLR", "ReduceOnPlateauLR",
    "ConstantMomentum", "StepMomentum", "MultiStepMomentum", "ExponentialMomentum",
    "LinearMomentum", "CosineAnnealingMomentum", "PolyMomentum", "CosineRestartMomentum",
    "ReduceOnPlateauMomentum",
]
