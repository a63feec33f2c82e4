"""Prints the numbers tests/mmengine_semantics/test_mm_ema_ramp.py compares with: MMEngine
0.10.7 Runners whose EMAHook averages with mmdet 3.3.0's ``ExpMomentumEMA`` (torch 2.13,
CPU). Not run by the suite. In a scratch venv with mmengine==0.10.7::

    pip download mmdet==3.3.0 --no-deps -d WHEEL && unzip WHEEL/mmdet-3.3.0-*.whl -d MMDET
    python make_mmengine_expmomentum.py MMDET OUT.json   # the numbers, as the test holds them

mmdet's package imports mmcv, so its two files this needs (``registry.py`` and
``models/layers/ema.py``) are loaded by path, and the average is registered with
MMEngine's MODELS registry for the Runner to build it."""
import importlib.util
import json
import sys
import tempfile
import types

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import HOOKS, MODELS
from mmengine.runner import Runner
from torch import nn


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


root = sys.argv[1]
sys.modules["mmdet"] = types.ModuleType("mmdet")
load("mmdet.registry", f"{root}/mmdet/registry.py")
ema_module = load("mmdet.models.layers.ema", f"{root}/mmdet/models/layers/ema.py")
MODELS.register_module(module=ema_module.ExpMomentumEMA, force=True)


class DS(torch.utils.data.Dataset):
    def __init__(self, values): self.values = values
    def __len__(self): return len(self.values)
    def __getitem__(self, i): return torch.tensor([self.values[i]], dtype=torch.float32)


def collate(items): return dict(x=torch.stack(items))


class Linear(BaseModel):
    """loss = w * x, w = 1 at the start (tests/mm_support.py's OneWeight)."""
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
    def forward(self, x, mode='loss'):
        return dict(loss=(self.w * x).mean())


TRAJ = []


@HOOKS.register_module()
class Record(Hook):
    priority = 'LOWEST'
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        ema = next(h for h in runner.hooks if type(h).__name__ == 'EMAHook')
        TRAJ.append((runner.model.w.item(), ema.ema_model.module.w.item()))


def run(hook, values, epochs, n):
    TRAJ.clear()
    Runner(model=Linear(), work_dir=tempfile.mkdtemp(), experiment_name=f'exp{n}',
           train_dataloader=dict(dataset=DS(values), batch_size=1, sampler=dict(type='DefaultSampler', shuffle=False),
                                 collate_fn=collate, num_workers=0),
           optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)), train_cfg=dict(by_epoch=True, max_epochs=epochs),
           default_hooks=dict(logger=dict(type='LoggerHook', interval=1), checkpoint=None),
           custom_hooks=[dict(type='Record'), dict(type='EMAHook', ema_type='ExpMomentumEMA', update_buffers=True,
                                                   **hook)],
           randomness=dict(seed=0), log_level='WARNING').train()
    return dict(w=[w for w, _ in TRAJ], ema=[e for _, e in TRAJ])


CASES = {
    "mmdet defaults": (dict(momentum=0.0002, priority=49), [1.0, 2.0, 3.0], 2),
    "momentum 0.25, gamma 2": (dict(momentum=0.25, gamma=2), [1.0, 2.0, 3.0], 2),
    "momentum 0.1, gamma 3, interval 2, begin_iter 2": (dict(momentum=0.1, gamma=3, interval=2, begin_iter=2),
                                                        [1.0, 2.0, 3.0], 3),
}
with open(sys.argv[2], "w") as f:  # MMEngine's logger writes to stdout
    json.dump({name: run(hook, values, epochs, i) for i, (name, (hook, values, epochs)) in enumerate(CASES.items())},
              f, indent=1)
