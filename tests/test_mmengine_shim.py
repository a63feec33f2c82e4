"""tools/mmengine_shim keeps working: its stand-in ``mmengine`` binds MMEngine's names to
treadle's objects (checked in a subprocess, so no ``mmengine`` module is left behind)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import torch
from torch import nn
import treadle.optim.schedulers as ts
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper, build_optim_wrapper
from mmengine.optim.scheduler import LinearLR, _ParamScheduler
from mmengine.testing import assert_allclose

assert LinearLR is ts.LinearLR and _ParamScheduler is ts.ParamScheduler
model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
cfg = dict(optimizer=dict(type='SGD', lr=0.1, weight_decay=0.01))
wrapper = DefaultOptimWrapperConstructor(cfg, dict(norm_decay_mult=0.0))(model)
assert isinstance(wrapper, OptimWrapper) and wrapper.base_param_settings is None
groups = wrapper.optimizer.param_groups  # one per parameter, in model order, as MMEngine
assert [g['params'][0] for g in groups] == list(model.parameters())
assert [g['weight_decay'] for g in groups] == [0.01, 0.01, 0.0, 0.0]
assert len(build_optim_wrapper(model, cfg).optimizer.param_groups) == 1
assert_allclose([0.1], [0.1 + 1e-9])
print('ok')
"""


@pytest.mark.slow  # a subprocess
def test_shim_maps_mmengine_names_onto_treadle():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tools" / "mmengine_shim"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
