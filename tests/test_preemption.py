"""PreemptionConfig: every bad ``preemption=`` value fails at construction, naming the key
(the handlers themselves are exercised in tests/hooks/test_checkpoint_hook.py)."""

from __future__ import annotations

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.preemption import PreemptionConfig

from support import TinyNet, make_data


@pytest.mark.parametrize("cfg,exc,match", [
    (dict(signals=("SIGKILL",)), ValueError, r"preemption signal 'SIGKILL' cannot be caught"),
    (dict(signals=["SIGTERM", "SIGSTOP"]), ValueError, r"preemption signal 'SIGSTOP' cannot be caught"),
    (dict(signals="SIGTERM"), TypeError, r"preemption signals='SIGTERM'; expected a list of signal names such as "
                                         r"\['SIGTERM', 'SIGUSR1'\]"),
    (dict(signals=None), TypeError, r"preemption signals=None; expected a list of signal names"),
    (dict(signals=["SIGFOO"]), ValueError, r"preemption signal 'SIGFOO' is not a signal name"),
    (dict(signals=[15]), ValueError, r"preemption signal 15 is not a signal name"),
    (dict(exit_code="x"), TypeError, r"preemption exit_code='x' is not an int; expected an int in 0..255"),
    (dict(exit_code=143.0), TypeError, r"preemption exit_code=143.0 is not an int"),
    (dict(exit_code=300), ValueError, r"preemption exit_code=300 is out of range; expected an int in 0..255"),
    (dict(requeue="no"), TypeError, r"preemption requeue='no'; expected True .* or False"),
    (dict(signal=["SIGTERM"]), ValueError, r"preemption has unknown keys \['signal'\]"),
    ("yes", TypeError, r"preemption must be True, False or dict"),
])
def test_bad_preemption_fails_at_construction(cfg, exc, match, tmp_path):
    with pytest.raises(exc, match=match):
        PreemptionConfig.build(cfg)
    with pytest.raises(exc, match=match):
        treadle.Trainer(TinyNet(), work_dir=tmp_path / "run", train_dataloader=DataLoader(make_data(8), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1, preemption=cfg)
    assert not (tmp_path / "run").exists()


def test_good_preemption_values():
    assert PreemptionConfig.build(False) is None and PreemptionConfig.build(None) is None
    assert PreemptionConfig.build(True) == PreemptionConfig()
    cfg = PreemptionConfig.build(dict(signals=["SIGUSR2"], exit_code=0, requeue=False))
    assert (cfg.signals, cfg.exit_code, cfg.requeue) == (("SIGUSR2",), 0, False)
    assert PreemptionConfig.build(dict(requeue=False)).signals == ("SIGTERM", "SIGUSR1")
