"""Writes mmengine_tiny.pth and mmengine_tiny.json (tests/mmengine_semantics/test_mm_load_from.py)
with MMEngine 0.10.7 and torch 2.13 (pip install mmengine==0.10.7 in a scratch venv; not run by
the suite, which does not need mmengine)."""
import json
import os
import tempfile

import torch
from torch import nn
from mmengine.model import BaseModel
from mmengine.runner import Runner

class DS(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(8, 2, generator=g)
    def __len__(self): return 8
    def __getitem__(self, i): return self.x[i]

def collate(items): return dict(x=torch.stack(items))

class Tiny(BaseModel):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 2)
        self.bn = nn.BatchNorm1d(2)
        self.fc2 = nn.Linear(2, 1)
    def forward(self, x, mode='loss'):
        return dict(loss=self.fc2(self.bn(self.fc1(x))).pow(2).mean())

torch.manual_seed(0)
work = tempfile.mkdtemp()
runner = Runner(model=Tiny(), work_dir=work, experiment_name='tiny',
                train_dataloader=dict(dataset=DS(), batch_size=2, sampler=dict(type='DefaultSampler', shuffle=False),
                                      collate_fn=collate),
                optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
                param_scheduler=[dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=4)],
                train_cfg=dict(by_epoch=True, max_epochs=1),
                default_hooks=dict(checkpoint=None, logger=dict(type='LoggerHook', interval=1)),
                randomness=dict(seed=0), log_level='WARNING')
runner.train()
out = os.path.dirname(os.path.abspath(__file__))
os.makedirs(out, exist_ok=True)
runner.save_checkpoint(out, 'mmengine_tiny.pth')
sd = runner.model.state_dict()
json.dump({k: v.tolist() for k, v in sd.items()}, open(f'{out}/mmengine_tiny.json', 'w'))
ck = torch.load(f'{out}/mmengine_tiny.pth', weights_only=False)
print(sorted(ck), sorted(ck['message_hub']), type(ck['message_hub']['log_scalars'].get('train/loss')))
print(ck['meta'].keys())
