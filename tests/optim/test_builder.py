"""build_optimizer: fused kernels by default on CUDA for Adam/AdamW/SGD configs, CPU unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from treadle.optim.builder import build_optimizer, wants_fused


def _fake(device: str = "cuda", floating: bool = True) -> SimpleNamespace:
    """A stand-in parameter: wants_fused only looks at the device type and the dtype kind."""
    return SimpleNamespace(device=torch.device(device), is_floating_point=lambda: floating)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_cpu_keeps_torchs_default(name):
    opt = build_optimizer(dict(type=name, lr=1e-3), nn.Linear(3, 2))
    assert opt.defaults.get("fused") is None and opt.defaults.get("foreach") is None


def test_fused_on_cuda_params_when_the_config_leaves_it_open():
    params = [_fake(), _fake()]
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        assert wants_fused(cls, {"lr": 1e-3}, params, None)
    assert wants_fused(torch.optim.AdamW, {"lr": 1e-3}, [{"params": params, "weight_decay": 0.0}], None)  # param groups


@pytest.mark.parametrize("kwargs", [dict(fused=False), dict(foreach=True), dict(foreach=False), dict(differentiable=True)])
def test_an_explicit_choice_is_kept(kwargs):
    assert not wants_fused(torch.optim.AdamW, {"lr": 1e-3, **kwargs}, [_fake()], None)


def test_not_fused_off_cuda_or_for_other_optimizers_or_dtypes_or_sparse_embeddings():
    assert not wants_fused(torch.optim.AdamW, {}, [_fake("cpu")], None)
    assert not wants_fused(torch.optim.AdamW, {}, [_fake(), _fake("cpu")], None)
    assert not wants_fused(torch.optim.AdamW, {}, [_fake(floating=False)], None)
    assert not wants_fused(torch.optim.RMSprop, {}, [_fake()], None)
    assert not wants_fused(torch.optim.SGD, {}, [], None)
    sparse = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2))
    assert not wants_fused(torch.optim.SGD, {}, [_fake()], sparse)
    assert wants_fused(torch.optim.SGD, {}, [_fake()], nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_config_builds_a_fused_optimizer():
    model = nn.Linear(8, 4).cuda()
    assert build_optimizer(dict(type="AdamW", lr=1e-3), model).defaults["fused"] is True
    assert build_optimizer(dict(type="AdamW", lr=1e-3, foreach=True), model).defaults["fused"] in (None, False)
