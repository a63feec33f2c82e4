"""An MMEngine config's EMAHook averages as MMEngine's does: its first update copies the
weights (treadle's own EMA, timm's rule, averages with the initial weights), every
iteration counts, ``interval`` counts updates and ``begin_iter`` starts them.

The expected numbers are MMEngine 0.10.7's: a Runner with the same one-weight model
(``loss = w * x``, w = 1), the same data (batch size 1, in order), SGD lr 0.1 and
``custom_hooks=[dict(type="EMAHook", ...)]``, recording w and the average's w after every
iteration."""

from __future__ import annotations

import pytest
import torch

import treadle
from treadle.openmmlab.translate import translate
from treadle.hooks.ema import EMAHook
from mm_support import OneWeight, Record, loader
from support import ON_CPU

MMENGINE = {
    "momentum 0.5": dict(
        hook=dict(momentum=0.5), values=[1.0, 2.0, 3.0], epochs=2, accumulate=1,
        w=[0.8999999761581421, 0.699999988079071, 0.3999999761581421, 0.29999998211860657, 0.09999997913837433,
           -0.20000001788139343],
        ema=[0.8999999761581421, 0.7999999523162842, 0.5999999642372131, 0.44999998807907104, 0.2749999761581421,
             0.03749997913837433]),
    "momentum 0.25, interval 2, begin_iter 3": dict(
        hook=dict(momentum=0.25, interval=2, begin_iter=3), values=[1.0, 2.0, 3.0], epochs=3, accumulate=1,
        w=[0.8999999761581421, 0.699999988079071, 0.3999999761581421, 0.29999998211860657, 0.09999997913837433,
           -0.20000001788139343, -0.30000001192092896, -0.5, -0.800000011920929],
        ema=[0.8999999761581421, 0.699999988079071, 0.3999999761581421, 0.3999999761581421, 0.32499998807907104,
             0.32499998807907104, 0.16874998807907104, 0.16874998807907104, -0.07343751192092896]),
    "momentum 0.5, accumulative_counts 2": dict(
        hook=dict(momentum=0.5), values=[1.0, 2.0, 3.0], epochs=2, accumulate=2,
        w=[1.0, 0.8500000238418579, 0.8500000238418579, 0.6500000357627869, 0.6500000357627869, 0.40000003576278687],
        ema=[1.0, 0.925000011920929, 0.8875000476837158, 0.7687500715255737, 0.7093750238418579, 0.5546875]),
}


@pytest.mark.parametrize("case", list(MMENGINE))
def test_translated_ema_equals_mmengine(tmp_path, case):
    c = MMENGINE[case]
    cfg = translate({"custom_hooks": [{"type": "EMAHook", "update_buffers": True, **c["hook"]}],
                     "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}, "accumulative_counts": c["accumulate"]}})
    assert cfg["ema"]["convention"] == "mmengine"
    rec = Record()
    treadle.Trainer(OneWeight(), train_dataloader=loader(c["values"]), optimizer=cfg["optimizer"],
                    accumulate=cfg.get("accumulate", 1), accumulate_across_epochs=cfg.get("accumulate_across_epochs", False),
                    ema=cfg["ema"], max_epochs=c["epochs"], hooks=[rec],
                    strategy=ON_CPU, log_writers=()).fit()
    torch.testing.assert_close(rec.w, c["w"], rtol=0, atol=1e-6)
    torch.testing.assert_close(rec.ema, c["ema"], rtol=0, atol=1e-6)


def test_timm_convention_averages_with_the_initial_weights():
    """treadle's own EMA (the default) is unchanged: after 1, 2, 3 steps at momentum 0.5 it
    lies 0.5, 0.25, 0.125 of the way from the initial weights' side (MMEngine's copies)."""
    rec = Record()
    treadle.Trainer(OneWeight(), train_dataloader=loader([1.0, 2.0, 3.0]), optimizer=dict(type="SGD", lr=0.1),
                    ema=dict(momentum=0.5), max_epochs=1, hooks=[rec], strategy=ON_CPU, log_writers=()).fit()
    expected, avg = [], 1.0
    for w in rec.w:
        avg = 0.5 * avg + 0.5 * w
        expected.append(avg)
    torch.testing.assert_close(rec.ema, expected, rtol=0, atol=1e-6)


def test_convention_is_checked():
    with pytest.raises(ValueError, match="ema convention='MMEngine'; expected 'timm'"):
        EMAHook(convention="MMEngine")
