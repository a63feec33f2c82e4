"""Shared pieces of the probes: the tiny MLP, the data, the reference loop."""
import torch
from torch import nn

IN, HID, OUT = 8, 32, 4
MB = 4  # per-rank micro batch


def make_model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT))


def make_data(steps, gas, world=2):
    g = torch.Generator().manual_seed(0)
    n = steps * gas * world * MB
    return torch.randn(n, IN, generator=g), torch.randn(n, OUT, generator=g) * 3


def micro(X, Y, step, m, gas, rank=None, world=2):
    k = step * gas + m
    lo = k * world * MB
    if rank is None:
        return X[lo:lo + world * MB], Y[lo:lo + world * MB]
    lo += rank * MB
    return X[lo:lo + MB], Y[lo:lo + MB]


def reference(steps, gas, clip=0.0, lr=1e-2, wd=0.01, sched=False):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    X, Y = make_data(steps, gas)
    sch = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if sched else None
    for s in range(steps):
        opt.zero_grad()
        for m in range(gas):
            x, y = micro(X, Y, s, m, gas)
            loss = nn.functional.mse_loss(model(x), y) / gas
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sch is not None:
            sch.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
