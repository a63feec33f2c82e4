"""sync_bn=True on DDPStrategy and FSDPStrategy (treadle/strategies/sync_batchnorm.py): 2 gloo
processes, each with half of every batch, give the BatchNorm running statistics, the
outputs, the gradients and the weights of one process on the whole batch (a hand-written
PyTorch reference with plain BatchNorm); without sync_bn they do not (the negative control).

Tolerance: 1e-5 relative, 1e-6 absolute. The synchronized statistics are combined from
per-rank means and variances (Chan's formula) where the reference's kernel sums the whole
batch at once: the same quantities summed in another order, which float32 rounds
differently (observed below 1e-6); unsynchronized halves differ by more than 1e-2.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memory_ranks
from memory_ranks import ConvBN, bn_batch, bn_stats, make
from treadle.strategies.build import resolve_strategy
from treadle.strategies.ddp import DDPStrategy
from treadle.strategies.fsdp import FSDPStrategy
from treadle.strategies.sync_batchnorm import CPUSyncBatchNorm, convert_sync_batchnorm, count_batchnorms

TOL = dict(rtol=1e-5, atol=1e-6)


def reference() -> dict:
    """One process, the whole batch, plain BatchNorm, the same SGD steps."""
    model = make(ConvBN)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out: dict = {"outputs": [], "stats": []}
    for step in range(memory_ranks.STEPS_BN):
        x, y = bn_batch(step)
        o = model(x)
        F.mse_loss(o, y).backward()
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["outputs"].append(o.detach())
        out["stats"].append(bn_stats(model))
    out["weights"] = model.state_dict()
    return out


def close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k].double(), b[k].double(), **TOL) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_processes_with_half_batches_equal_one_process_on_the_whole_batch(kind) -> None:
    results = memory_ranks.results()
    if kind == "fsdp" and (results[0].get("fsdp_skipped") or results[0].get("fsdp_bn_skipped")):
        pytest.skip(results[0].get("fsdp_skipped") or results[0]["fsdp_bn_skipped"])
    ref = reference()
    synced = [r[f"{kind}_bn"]["sync"] for r in results]
    plain = [r[f"{kind}_bn"]["plain"] for r in results]
    assert all(s["synced"] and s["classes"] == ["CPUSyncBatchNorm", "CPUSyncBatchNorm"] for s in synced)
    assert all(p["classes"] == ["BatchNorm2d", "BatchNorm1d"] for p in plain)
    for step in range(memory_ranks.STEPS_BN):
        outputs = torch.cat([s["outputs"][step] for s in synced])  # rank 0's half, then rank 1's
        torch.testing.assert_close(outputs, ref["outputs"][step], **TOL)
        for s in synced:  # every rank holds the whole batch's statistics
            assert close(s["stats"][step], ref["stats"][step]), step
        # The negative control: each rank normalizes its half with its own statistics.
        assert not torch.allclose(torch.cat([p["outputs"][step] for p in plain]), ref["outputs"][step], atol=1e-2)
        assert not any(close(p["stats"][step], ref["stats"][step]) for p in plain)
    for s in synced:
        assert close(s["grads"], ref["grads"])
    assert not close(plain[0]["grads"], ref["grads"])
    assert close(synced[0]["weights"], ref["weights"])  # full weights: rank 0's
    assert list(synced[0]["weights"]) == list(ref["weights"])  # the state dict keys of plain BatchNorm


def test_conversion_keeps_parameters_buffers_names_and_results_without_a_process_group() -> None:
    model = make(ConvBN)
    model.bn1d.eval()
    before = model.state_dict()
    params = dict(model.named_parameters())
    plain = copy.deepcopy(model)
    assert count_batchnorms(model) == 2
    assert convert_sync_batchnorm(model) is model
    assert type(model.bn2d) is CPUSyncBatchNorm and type(model.bn1d) is CPUSyncBatchNorm and not model.bn1d.training
    assert model.bn1d.momentum is None and model.bn2d.momentum == 0.1
    assert all(p is params[n] for n, p in model.named_parameters())  # the same Parameter objects
    assert list(model.state_dict()) == list(before) and all(torch.equal(v, before[k]) for k, v in
                                                             model.state_dict().items())
    x = bn_batch(0)[0]
    # No process group in this process: torch's own path, which is BatchNorm's.
    assert torch.equal(model(x), plain(x)) and close(bn_stats(model), bn_stats(plain))
    bn = nn.BatchNorm2d(3)
    assert type(convert_sync_batchnorm(bn)) is CPUSyncBatchNorm  # a layer on its own: its replacement
    torch_sync = nn.Sequential(nn.SyncBatchNorm(4))
    assert type(convert_sync_batchnorm(torch_sync)[0]) is CPUSyncBatchNorm  # torch's: made one that runs on the CPU
    # Another device than the CPU: torch's own class (its conversion; nothing runs here).
    assert type(convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3)), cpu=False)[0]) is nn.SyncBatchNorm


def test_one_process_keeps_batchnorm_and_says_so(caplog) -> None:
    for kind in ("ddp", "fsdp"):
        strategy = resolve_strategy({"type": kind, "sync_bn": True})
        strategy.setup_env(seed=0)
        with caplog.at_level("INFO", logger="treadle"):
            model = strategy.prepare(make(ConvBN))
        assert type(model.bn2d) is nn.BatchNorm2d
        assert "sync_bn: one data-parallel process; BatchNorm layers left as they are" in caplog.text
        caplog.clear()


def test_the_strategy_asks_its_layout_for_the_data_parallel_group(monkeypatch) -> None:
    """sync_bn converts over the layout's data group (a mesh strategy's data-parallel
    dimension); a group of one process leaves BatchNorm as it is."""
    from treadle.distributed.layout import ParallelLayout
    import treadle.strategies.base as base

    strategy = DDPStrategy(sync_bn=True)
    assert strategy.layout.data_group is None
    strategy.layout = ParallelLayout(data_group="the data group")
    sizes = []
    monkeypatch.setattr(base, "_group_size", lambda group: sizes.append(group) or 1)
    model = strategy.convert_batchnorm(make(ConvBN))
    assert sizes == ["the data group"] and type(model.bn2d) is nn.BatchNorm2d  # a group of one process
    assert DDPStrategy().convert_batchnorm(make(ConvBN)).bn2d.__class__ is nn.BatchNorm2d  # off


@pytest.mark.parametrize("options, message", [
    ({"type": "ddp", "sync_bn": "torch"}, "strategy 'ddp': sync_bn='torch'; expected True"),
    ({"type": "fsdp", "sync_bn": 1}, "strategy 'fsdp': sync_bn=1; expected True"),
])
def test_bad_values_are_one_line_errors(options, message) -> None:
    with pytest.raises(TypeError, match=message) as e:
        resolve_strategy(options)
    assert "\n" not in str(e.value)


def test_a_model_that_is_a_batchnorm_layer_is_refused() -> None:
    strategy = FSDPStrategy(sync_bn=True)
    with pytest.raises(ValueError, match="sync_bn=True: the model is itself a BatchNorm2d layer"):
        strategy.convert_batchnorm(nn.BatchNorm2d(3))
