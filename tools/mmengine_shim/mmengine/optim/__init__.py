"""``mmengine.optim``: treadle's OptimWrapper and optimizer builder under MMEngine's names."""

from mmengine.optim.optimizer import (  # noqa: F401
    OPTIM_WRAPPER_CONSTRUCTORS, OPTIMIZERS, DefaultOptimWrapperConstructor, OptimWrapper, build_optim_wrapper,
)
from mmengine.optim.scheduler import *  # noqa: F403
