"""Writes mmengine_refs.json: the numbers the tests in tests/mmengine_semantics/ compare with
(logged loss smoothing, accumulation steps, EMA), from MMEngine 0.10.7 and torch 2.13 runs
(pip install mmengine==0.10.7 in a scratch venv; not run by the suite)."""
import json
import os
import tempfile
import torch
from torch import nn
from mmengine.model import BaseModel
from mmengine.runner import Runner
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

VALUES = [((i * 37) % 11) + 0.25 * i for i in range(7)]

class DS(torch.utils.data.Dataset):
    def __init__(self, values): self.values = values
    def __len__(self): return len(self.values)
    def __getitem__(self, i): return torch.tensor([self.values[i]], dtype=torch.float32)

def collate(items): return dict(x=torch.stack(items))

class ValueLoss(BaseModel):
    """loss = the batch value (w gets a zero gradient)."""
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
    def forward(self, x, mode='loss'):
        return dict(loss=(self.w * 0).sum() + x.mean())

class Linear(BaseModel):
    """loss = w * x: a real gradient, to see when the optimizer steps."""
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
        rec = dict(iter=runner.iter + 1, w=runner.model.w.item())
        for h in runner.hooks:
            if type(h).__name__ == 'EMAHook':
                rec['ema'] = h.ema_model.module.w.item()
        TRAJ.append(rec)

def run(model, *, values=VALUES, epochs=None, iters=None, interval=1, log_processor=None, optim=None,
        custom_hooks=(), work_dir=None, lr=0.1):
    TRAJ.clear()
    work_dir = work_dir or tempfile.mkdtemp()
    train_cfg = dict(by_epoch=True, max_epochs=epochs) if epochs else dict(by_epoch=False, max_iters=iters)
    global N
    N = globals().get('N', 0) + 1
    runner = Runner(model=model, work_dir=work_dir, experiment_name=f'exp{N}',
                    train_dataloader=dict(dataset=DS(values), batch_size=1, sampler=dict(type='DefaultSampler', shuffle=False),
                                          collate_fn=collate, num_workers=0),
                    optim_wrapper=optim or dict(optimizer=dict(type='SGD', lr=lr)),
                    train_cfg=train_cfg,
                    default_hooks=dict(logger=dict(type='LoggerHook', interval=interval), checkpoint=None),
                    custom_hooks=[dict(type='Record'), *custom_hooks],
                    log_processor=log_processor or {}, randomness=dict(seed=0),
                    log_level='WARNING', visualizer=dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')]))
    runner.train()
    logs = []
    for root, _, files in os.walk(work_dir):
        for f in files:
            if f == 'scalars.json':
                with open(os.path.join(root, f)) as fh:
                    logs = [json.loads(line) for line in fh]
    return runner, logs, list(TRAJ)

out = {}
keys = ('step', 'loss', 'loss_global', 'loss_epoch', 'loss_max', 'loss_cur')
def pick(logs):
    return [{k: r[k] for k in keys if k in r} for r in logs]

# log_processor: window larger than the interval, the case
_, logs, _ = run(ValueLoss(), epochs=3, interval=1, log_processor=dict(window_size=5, by_epoch=True))
out['window5_interval1'] = pick(logs)
_, logs, _ = run(ValueLoss(), epochs=3, interval=3, log_processor=dict(window_size=5, by_epoch=True))
out['window5_interval3'] = pick(logs)
custom = [dict(data_src='loss', log_name='loss_global', method_name='mean', window_size='global'),
          dict(data_src='loss', log_name='loss_epoch', method_name='mean', window_size='epoch'),
          dict(data_src='loss', log_name='loss_max', method_name='max', window_size=4),
          dict(data_src='loss', log_name='loss_cur', method_name='current')]
_, logs, _ = run(ValueLoss(), epochs=3, interval=2, log_processor=dict(window_size=3, by_epoch=True, custom_cfg=custom))
out['custom_interval2'] = pick(logs)
_, logs, _ = run(ValueLoss(), iters=17, interval=3,
                 log_processor=dict(window_size=4, by_epoch=False, custom_cfg=[custom[0], custom[2]]))
out['iter_based_window4_interval3'] = pick(logs)

# accumulation over epochs of 2 iterations
_, _, traj = run(Linear(), values=[1.0, 2.0], epochs=3,
                 optim=dict(optimizer=dict(type='SGD', lr=0.1), accumulative_counts=4))
out['accumulate4_epochs_of_2'] = [r['w'] for r in traj]

# EMA
_, _, traj = run(Linear(), values=[1.0, 2.0, 3.0], epochs=2, custom_hooks=[dict(type='EMAHook', momentum=0.5)])
out['ema_m05'] = dict(w=[r['w'] for r in traj], ema=[r['ema'] for r in traj])
_, _, traj = run(Linear(), values=[1.0, 2.0, 3.0], epochs=3,
                 custom_hooks=[dict(type='EMAHook', momentum=0.25, interval=2, begin_iter=3)])
out['ema_m025_interval2_begin3'] = dict(w=[r['w'] for r in traj], ema=[r['ema'] for r in traj])
_, _, traj = run(Linear(), values=[1.0, 2.0, 3.0], epochs=2,
                 optim=dict(optimizer=dict(type='SGD', lr=0.1), accumulative_counts=2),
                 custom_hooks=[dict(type='EMAHook', momentum=0.5)])
out['ema_m05_accumulate2'] = dict(w=[r['w'] for r in traj], ema=[r['ema'] for r in traj])
json.dump(out, open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mmengine_refs.json"), "w"), indent=1)
