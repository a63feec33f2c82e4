"""Seeding of python, numpy, torch; per-rank seeds; deterministic algorithms."""

from __future__ import annotations

import random

import numpy as np
import torch

from treadle.seeding import derive_seed, seed_everything, set_deterministic


def draw():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_everything_reproduces_all_three_libraries():
    seed_everything(11)
    a = draw()
    seed_everything(11)
    assert draw() == a
    seed_everything(12)
    assert draw() != a


def test_per_rank_seeds_differ_and_shared_seed_does_not():
    assert seed_everything(5, rank=3, per_rank=True) == 8
    r3 = draw()
    seed_everything(5, rank=1, per_rank=True)
    assert draw() != r3
    assert seed_everything(5, rank=3, per_rank=False) == 5


def test_derive_seed_is_stable_and_spreads():
    assert derive_seed(1, 2) == derive_seed(1, 2)
    assert len({derive_seed(0, e) for e in range(100)}) == 100
    assert 0 <= derive_seed(2**70, -1) < 2**64


def test_deterministic_toggle():
    try:
        set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled()
