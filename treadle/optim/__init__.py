"""Optimization: the OptimWrapper (AMP, accumulation, clipping) and builders."""

from treadle.optim.builder import build_optimizer
from treadle.optim.wrapper import OptimWrapper

__all__ = ["OptimWrapper", "build_optimizer"]
