"""Seeding of python, numpy and torch, and deterministic algorithms."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def derive_seed(seed: int, *salt: int) -> int:
    """A 64-bit seed that depends on ``seed`` and every ``salt`` (e.g. the epoch).

    SplitMix64-style mixing, so neighbouring epochs get unrelated streams.
    """
    x = seed & _MASK64
    for s in salt:
        x = (x + 0x9E3779B97F4A7C15 + (s & _MASK64)) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x


def seed_everything(seed: int, *, rank: int = 0, per_rank: bool = False) -> int:
    """Seed python's ``random``, numpy and torch (every device); return the seed used.

    With ``per_rank=True`` each process gets ``seed + rank`` (different dropout and
    augmentation per rank); otherwise every rank uses the same seed.
    """
    if per_rank:
        seed = seed + rank
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


def set_deterministic(enabled: bool) -> None:
    """Turn torch's deterministic algorithms on or off (and cuDNN's autotuner off)."""
    if enabled:
        # cuBLAS needs this to be deterministic; it must be set before the first call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    if enabled:
        torch.backends.cudnn.benchmark = False
