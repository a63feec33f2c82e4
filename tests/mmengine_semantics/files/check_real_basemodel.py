"""A real mmengine.model.BaseModel (with its BaseDataPreprocessor) trained by treadle and by
MMEngine 0.10.7's Runner from the same weights, accumulative_counts=2 over epochs of 3
iterations: prints each parameter's largest difference (0.0 when run: bit-equal).
Run in a scratch venv with mmengine, PYTHONPATH=<treadle checkout>; not run by the suite."""
import copy
import tempfile

import torch
from torch import nn
from mmengine.model import BaseModel
from mmengine.runner import Runner
import treadle

class Net(BaseModel):
    def __init__(self):
        super().__init__(data_preprocessor=dict(type='BaseDataPreprocessor'))
        self.fc = nn.Linear(3, 1)
    def forward(self, inputs, labels=None, mode='tensor'):
        out = self.fc(inputs)
        if mode == 'loss':
            return dict(loss=((out.squeeze(1) - labels) ** 2).mean())
        return out

g = torch.Generator().manual_seed(0)
X, Y = torch.randn(12, 3, generator=g), torch.randn(12, generator=g)
items = [dict(inputs=X[i], labels=Y[i]) for i in range(12)]
def collate(b): return dict(inputs=torch.stack([x['inputs'] for x in b]), labels=torch.stack([x['labels'] for x in b]))

torch.manual_seed(0)
a = Net()
b = copy.deepcopy(a)
runner = Runner(model=a, work_dir=tempfile.mkdtemp(), train_dataloader=dict(dataset=items, batch_size=4,
                sampler=dict(type='DefaultSampler', shuffle=False), collate_fn=collate),
                optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1), accumulative_counts=2),
                train_cfg=dict(by_epoch=True, max_epochs=3), default_hooks=dict(checkpoint=None), log_level='WARNING')
runner.train()
loader = torch.utils.data.DataLoader(items, batch_size=4, collate_fn=collate)
t = treadle.Trainer(b, train_dataloader=loader, optimizer=dict(type='SGD', lr=0.1), accumulate=2,
                    accumulate_across_epochs=True, max_epochs=3, strategy={'type': 'single', 'device': 'cpu'},
                    log_writers=(), progress=False)
t.fit()
for (n, p), q in zip(a.named_parameters(), b.parameters()):
    print(n, (p - q).abs().max().item())
