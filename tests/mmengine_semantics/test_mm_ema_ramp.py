"""mmdet's ``EMAHook(ema_type='ExpMomentumEMA')`` (YOLOX, RTMDet, mmpose configs) averages
as mmdet does: the weight on the new value is ``(1 - m) * exp(-(1 + steps) / gamma) + m``
(treadle: ``EMAHook(gamma=...)``), and treadle's own EMA ramps the same way (YOLOX's rule).

The expected numbers are MMEngine 0.10.7's with mmdet 3.3.0's ExpMomentumEMA (torch 2.13,
CPU), printed by ``files/make_mmengine_expmomentum.py``: a Runner with the one-weight model
(``loss = w * x``, w = 1), batches ``[1.0, 2.0, 3.0]`` of one value in order, SGD lr 0.1 and
``custom_hooks=[dict(type='EMAHook', ema_type='ExpMomentumEMA', update_buffers=True, ...)]``,
recording w and the average's w after every iteration."""

from __future__ import annotations

import math

import pytest
import torch

import treadle
from treadle.components.errors import ConfigError
from treadle.openmmlab.translate import translate
from treadle.hooks.ema import EMAHook
from mm_support import OneWeight, Record, loader
from support import ON_CPU

W6 = [0.8999999761581421, 0.699999988079071, 0.3999999761581421, 0.29999998211860657, 0.09999997913837433,
      -0.20000001788139343]
MMENGINE = {
    "mmdet defaults": dict(
        hook=dict(momentum=0.0002, priority=49), epochs=2, w=W6,
        ema=[0.8999999761581421, 0.7001998424530029, 0.40044984221458435, 0.3002006411552429, 0.10049975663423538,
             -0.1991000473499298]),
    "momentum 0.25, gamma 2": dict(
        hook=dict(momentum=0.25, gamma=2), epochs=2, w=W6,
        ema=[0.8999999761581421, 0.794818103313446, 0.6300417184829712, 0.5140315890312195, 0.38503435254096985,
             0.21693040430545807]),
    "momentum 0.1, gamma 3, interval 2, begin_iter 2": dict(
        hook=dict(momentum=0.1, gamma=3, interval=2, begin_iter=2), epochs=3,
        w=[*W6, -0.30000001192092896, -0.5, -0.800000011920929],
        ema=[0.8999999761581421, 0.699999988079071, 0.699999988079071, 0.5275633931159973, 0.5275633931159973,
             0.3311299681663513, 0.3311299681663513, 0.17548030614852905, 0.17548030614852905]),
}


def _fit(ema: dict, epochs: int) -> Record:
    rec = Record()
    treadle.Trainer(OneWeight(), train_dataloader=loader([1.0, 2.0, 3.0]), optimizer=dict(type="SGD", lr=0.1),
                    ema=ema, max_epochs=epochs, hooks=[rec], strategy=ON_CPU, log_writers=()).fit()
    return rec


@pytest.mark.parametrize("case", list(MMENGINE))
def test_translated_exp_momentum_ema_equals_mmdet(case):
    c = MMENGINE[case]
    cfg = translate({"custom_hooks": [{"type": "EMAHook", "ema_type": "ExpMomentumEMA", "update_buffers": True,
                                       **c["hook"]}],
                     "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}}})
    assert cfg["ema"]["gamma"] == c["hook"].get("gamma", 2000) and cfg["ema"]["convention"] == "mmengine"
    rec = _fit(cfg["ema"], c["epochs"])
    torch.testing.assert_close(rec.w, c["w"], rtol=0, atol=1e-6)
    torch.testing.assert_close(rec.ema, c["ema"], rtol=0, atol=1e-6)


def test_without_the_ramp_the_average_differs():
    """The stored numbers tell the ramp from MMEngine's constant momentum: the same hook as
    "momentum 0.25, gamma 2" with ema_type ExponentialMovingAverage lags much further."""
    cfg = translate({"custom_hooks": [{"type": "EMAHook", "momentum": 0.25, "update_buffers": True}],
                     "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}}})
    rec = _fit(cfg["ema"], 2)
    assert abs(rec.ema[-1] - MMENGINE["momentum 0.25, gamma 2"]["ema"][-1]) > 0.1


def test_scoped_type_and_gamma_only_for_exp_momentum():
    hook = {"type": "EMAHook", "ema_type": "mmdet.ExpMomentumEMA", "momentum": 0.0001, "update_buffers": True}
    assert translate({"custom_hooks": [hook]})["ema"] == {"momentum": 0.9999, "gamma": 2000, "convention": "mmengine"}
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\]\.gamma: option has no treadle equivalent"):
        translate({"custom_hooks": [{"type": "EMAHook", "gamma": 100, "update_buffers": True}]})
    with pytest.raises(ConfigError, match=r"ema_type: unsupported average.*ExpMomentumEMA"):
        translate({"custom_hooks": [{"type": "EMAHook", "ema_type": "StochasticWeightAverage"}]})


def test_timm_convention_ramps_as_yolox():
    """treadle's own EMA with ``gamma``: the n-th update weighs the average by
    ``momentum * (1 - exp(-n / gamma))`` (YOLOX's ModelEMA), from the initial weights."""
    rec = _fit(dict(momentum=0.9, gamma=2), 2)
    expected, avg = [], 1.0
    for n, w in enumerate(rec.w, start=1):
        d = 0.9 * (1 - math.exp(-n / 2))
        avg = d * avg + (1 - d) * w
        expected.append(avg)
    torch.testing.assert_close(rec.ema, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("gamma", [0, -1.0, float("nan"), float("inf"), "2000", True])
def test_gamma_is_checked(gamma):
    error = TypeError if isinstance(gamma, (str, bool)) else ValueError
    with pytest.raises(error, match=r"ema gamma=.*expected a finite number > 0"):
        EMAHook(gamma=gamma)
