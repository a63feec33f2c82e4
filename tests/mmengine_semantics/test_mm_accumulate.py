"""``optim_wrapper.accumulative_counts`` as MMEngine counts it: windows over the whole run
(MMEngine's ``OptimWrapper.initialize_count_status(model, iter, max_iters)``: a step when
the run's iteration count is a multiple of the counts or the last one; the last
``max_iters % counts`` iterations divide their loss by that remainder), not per epoch.

The expected weights are MMEngine 0.10.7's: a Runner with the one-weight model
(``loss = w * x``, w = 1), epochs of 2 batches ``[1.0, 2.0]``, 3 epochs, SGD lr 0.1 and
``accumulative_counts=4``, recording w after every iteration: steps at iterations 4 and 6."""

from __future__ import annotations

import torch

import treadle
from treadle.openmmlab.translate import translate
from mm_support import OneWeight, Record, engine_keys, loader
from support import ON_CPU

MMENGINE_W = [1.0, 1.0, 1.0, 0.8500000238418579, 0.8500000238418579, 0.7000000476837158]


def _run(**kwargs) -> list[float]:
    rec = Record()
    treadle.Trainer(OneWeight(), train_dataloader=loader([1.0, 2.0]), max_epochs=3, hooks=[rec], strategy=ON_CPU,
                    log_writers=(), **kwargs).fit()
    return rec.w


def test_translated_accumulative_counts_step_as_mmengine():
    cfg = translate({"optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}, "accumulative_counts": 4}})
    cfg = engine_keys(cfg)
    assert cfg == {"optimizer": {"type": "SGD", "lr": 0.1}, "accumulate": 4, "accumulate_across_epochs": True}
    torch.testing.assert_close(_run(**cfg), MMENGINE_W, rtol=0, atol=1e-6)


def test_treadles_own_rule_closes_windows_with_each_epoch():
    """Without the flag, each epoch's window of 2 closes with the epoch (divided by 2):
    steps at iterations 2, 4 and 6, each by lr * mean(1, 2) = 0.15."""
    w = _run(optimizer=dict(type="SGD", lr=0.1), accumulate=4)
    torch.testing.assert_close(w, [1.0, 0.85, 0.85, 0.7, 0.7, 0.55], rtol=0, atol=1e-6)


def test_no_translation_flag_without_accumulation():
    cfg = translate({"optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}, "accumulative_counts": 1}})
    assert "accumulate_across_epochs" not in cfg
