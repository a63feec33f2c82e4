"""MMEngine's scheduler names, bound to treadle's schedulers (same names, same arguments)."""

from treadle.optim.schedulers import *  # noqa: F403  (MMEngine's class names)
from treadle.optim.schedulers import ParamScheduler as _ParamScheduler  # noqa: F401
