"""seed=None as MMEngine means it: a seed is drawn, every RNG is seeded with it, and it is
logged, so that passing it repeats the run."""

from __future__ import annotations

import logging
import re

import torch
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, TinyNet, make_data


def _run(tmp_path, name, seed):
    torch.manual_seed(0)  # the same initial weights for both runs: only the Trainer's seeding differs
    model = TinyNet(dropout=0.5)  # dropout and shuffling draw from the seeded RNGs
    loader = DataLoader(make_data(32), batch_size=8, shuffle=True)
    trainer = treadle.Trainer(model, work_dir=tmp_path / name, train_dataloader=loader, loss_fn=torch.nn.functional.cross_entropy,
                              optimizer=dict(type="SGD", lr=0.1), max_epochs=2, seed=seed, strategy=ON_CPU,
                              log_writers=("jsonl",))
    trainer.fit()
    return trainer, [p.detach().clone() for p in model.parameters()]


def test_seed_none_draws_logs_and_repeats(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="treadle"):
        first, weights = _run(tmp_path, "a", None)
    assert isinstance(first.seed, int)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("seed: ")]
    assert logged == [f"seed: {first.seed} (drawn, as seed=None asks; seed={first.seed} repeats this run)"]
    env = (tmp_path / "a" / "env.txt").read_text()
    assert re.search(rf"seed\s+{first.seed}\b", env), env
    _, again = _run(tmp_path, "b", first.seed)
    for a, b in zip(weights, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    _, other = _run(tmp_path, "c", first.seed + 1)  # another seed trains otherwise: the seed is what repeats it
    assert any(not torch.equal(a, b) for a, b in zip(weights, other))


def test_two_unseeded_runs_draw_different_seeds(tmp_path):
    a, _ = _run(tmp_path, "a", None)
    b, _ = _run(tmp_path, "b", None)
    assert a.seed != b.seed
