"""PreciseBNHook: the running statistics equal a hand computation over the epoch's first
N batches (and mmpretrain's ``update_bn_stats`` where mmpretrain and mmengine are
importable); the training streams and a resume are unchanged by it; MMEngine configs
translate mmpretrain's hook."""

from __future__ import annotations

import copy
import importlib.util
import shutil
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import treadle
from support import ON_CPU, load_module_file, make_data
from treadle.openmmlab.translate import translate
from treadle.hooks.precise_bn import PreciseBNHook


class BNNet(nn.Module):
    """Two BatchNorm layers, the second fed by the first's output."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.bn1 = nn.Linear(6, 8), nn.BatchNorm1d(8)
        self.fc2, self.bn2 = nn.Linear(8, 5), nn.BatchNorm1d(5, momentum=None)  # a cumulative average too
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.relu(self.bn2(self.fc2(self.drop(torch.relu(self.bn1(self.fc1(x))))))))


class Record(treadle.Hook):
    """The batches of each epoch, and a copy of the model before the epoch's closing hooks."""

    priority = "HIGHEST"

    def __init__(self):
        self.batches, self.before = {}, {}

    def before_train_iter(self, trainer, batch):
        self.batches.setdefault(trainer.state.epoch, []).append(batch)

    def after_train_epoch(self, trainer):
        self.before[trainer.state.epoch] = copy.deepcopy(trainer.module)


class After(treadle.Hook):
    priority = "LOWEST"

    def __init__(self):
        self.stats = {}

    def after_train_epoch(self, trainer):
        m = trainer.module
        self.stats[trainer.state.epoch] = [t.clone() for t in (m.bn1.running_mean, m.bn1.running_var,
                                                              m.bn2.running_mean, m.bn2.running_var)]


def _by_hand(model: BNNet, batches) -> list[torch.Tensor]:
    """Each layer's mean and unbiased variance of its input per batch, in training mode
    (batch statistics all the way), averaged over the batches with equal weights."""
    sums = [torch.zeros(8), torch.zeros(8), torch.zeros(5), torch.zeros(5)]
    with torch.no_grad():
        for x, _ in batches:
            a = model.fc1(x)
            h = torch.relu(F.batch_norm(a, None, None, model.bn1.weight, model.bn1.bias, training=True))
            b = model.fc2(h)
            for i, t in enumerate((a.mean(0), a.var(0, unbiased=True), b.mean(0), b.var(0, unbiased=True))):
                sums[i] += t / len(batches)
    return sums


def test_statistics_equal_a_hand_computation_over_the_epochs_first_batches():
    rec, after = Record(), After()
    loader = DataLoader(make_data(40), batch_size=6, shuffle=True)
    treadle.Trainer(BNNet(), train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1),
                    max_epochs=2, seed=1, strategy=ON_CPU, log_writers=(), progress=False,
                    hooks=[PreciseBNHook(num_batches=3), rec, after]).fit()
    for epoch in (0, 1):
        want = _by_hand(rec.before[epoch], rec.batches[epoch][:3])
        for got, w in zip(after.stats[epoch], want):
            torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
        before = rec.before[epoch]
        assert not torch.allclose(before.bn1.running_mean, want[0])  # the training's average was another
    assert rec.batches[0][0][1].tolist() != rec.batches[1][0][1].tolist()  # two epochs, two orders


def test_num_samples_counts_batches_as_mmpretrain_and_interval_skips_epochs():
    hook = PreciseBNHook(num_samples=20)
    view = types.SimpleNamespace(train_dataloader=DataLoader(make_data(40), batch_size=6),
                                 strategy=types.SimpleNamespace(dp_size=2))
    assert hook.batches(view) == 1  # 20 // (6 * 2)
    view.strategy.dp_size = 1
    assert PreciseBNHook(num_samples=10**6).batches(view) == 7  # at most the loader's length
    calls = []

    class Count(PreciseBNHook):
        def recompute(self, trainer, epoch):
            calls.append(epoch)
            super().recompute(trainer, epoch)

    treadle.Trainer(BNNet(), train_dataloader=DataLoader(make_data(12), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                    optimizer=dict(type="SGD", lr=0.1), max_epochs=4, seed=1, strategy=ON_CPU, log_writers=(),
                    progress=False, hooks=[Count(num_batches=2, interval=2)]).fit()
    assert calls == [1, 3]  # after the 2nd and 4th epochs
    with pytest.raises(ValueError, match="interval=0"):
        PreciseBNHook(interval=0)


def test_iteration_based_runs_every_interval_iterations():
    calls = []

    class Count(PreciseBNHook):
        def recompute(self, trainer, epoch):
            calls.append((trainer.state.iter, epoch))
            super().recompute(trainer, epoch)

    treadle.Trainer(BNNet(), train_dataloader=DataLoader(make_data(12), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                    optimizer=dict(type="SGD", lr=0.1), max_iters=7, seed=1, strategy=ON_CPU, log_writers=(),
                    progress=False, hooks=[Count(num_batches=2, interval=3)]).fit()
    assert calls == [(2, 0), (5, 1)]  # after iterations 3 and 6 (MMEngine's every_n_train_iters)


def _run(work, resume=False, hook=True):
    torch.manual_seed(0)
    loader = DataLoader(make_data(24), batch_size=4, shuffle=True)
    t = treadle.Trainer(BNNet(dropout=0.3), work_dir=work, train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=3, seed=2, strategy=ON_CPU,
                        log_writers=(), progress=False, resume=resume,
                        checkpoint=dict(interval=1, keep=None), hooks=[PreciseBNHook(num_batches=2)] if hook else [])
    t.fit()
    return {k: v.clone() for k, v in t.module.state_dict().items()}


def test_resume_after_the_hook_equals_the_uninterrupted_run_and_training_streams_do_not_move(tmp_path):
    whole = _run(tmp_path / "whole")
    part = tmp_path / "part"
    _run(part)
    for p in (part / "checkpoints").iterdir():
        if p.name != "epoch_0001":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    resumed = _run(part, resume=True)
    for k, v in whole.items():
        assert torch.equal(resumed[k], v), k
    # Without the hook the weights (dropout's draws included) are the same; only the statistics differ.
    plain = _run(tmp_path / "plain", hook=False)
    for k, v in whole.items():
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(plain[k], v), k
    assert not torch.equal(plain["bn1.running_mean"], whole["bn1.running_mean"])


def test_mmpretrain_hook_is_translated():
    cfg = translate({"custom_hooks": [dict(type="mmpretrain.PreciseBNHook", num_samples=8192, interval=1,
                                           priority="ABOVE_NORMAL")]})
    assert cfg["hooks"] == [{"type": "PreciseBNHook", "num_samples": 8192, "interval": 1, "priority": "ABOVE_NORMAL"}]


def _mmpretrain_update_bn_stats():
    """mmpretrain's update_bn_stats, its module loaded by path over MMEngine."""
    pytest.importorskip("mmengine")
    spec = importlib.util.find_spec("mmpretrain")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mmpretrain is not installed")
    from mmengine import registry

    path = Path(next(iter(spec.submodule_search_locations))) / "engine" / "hooks" / "precise_bn_hook.py"
    stubs = {"mmpretrain": types.ModuleType("mmpretrain"), "mmpretrain.registry": types.ModuleType("mmpretrain.registry")}
    stubs["mmpretrain.registry"].HOOKS = registry.Registry("stub hooks")  # type: ignore[attr-defined]
    module = load_module_file("mmpretrain_precise_bn_hook", path, stubs)
    return module.update_bn_stats


class MMStyle(BNNet):
    """BNNet with the data_preprocessor and forward(**data) mmpretrain's function calls."""

    def data_preprocessor(self, data, training=False):
        return {"x": data[0]}


def test_equal_to_mmpretrains_update_bn_stats():
    update_bn_stats = _mmpretrain_update_bn_stats()
    torch.manual_seed(3)
    theirs = MMStyle()
    ours = copy.deepcopy(theirs)
    data = make_data(30)
    update_bn_stats(theirs, DataLoader(data, batch_size=4), num_samples=17, logger="silent")  # 17 // 4 = 4 batches
    after = After()
    treadle.Trainer(ours, train_dataloader=DataLoader(data, batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                    optimizer=dict(type="SGD", lr=0.0), max_epochs=1, seed=1, strategy=ON_CPU, log_writers=(),
                    progress=False, hooks=[PreciseBNHook(num_samples=17), after]).fit()
    want = [theirs.bn1.running_mean, theirs.bn1.running_var, theirs.bn2.running_mean, theirs.bn2.running_var]
    for got, w in zip(after.stats[0], want):
        torch.testing.assert_close(got, w, rtol=1e-6, atol=1e-7)


def test_a_model_without_batchnorm_is_told_once_and_left_alone(caplog):
    loader = DataLoader(TensorDataset(torch.randn(8, 6), torch.randint(0, 3, (8,))), batch_size=4)
    model = nn.Linear(6, 3)
    treadle.Trainer(model, train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1),
                    max_epochs=1, strategy=ON_CPU, log_writers=(), progress=False,
                    hooks=[PreciseBNHook(num_batches=1)]).fit()
    assert "no BatchNorm layer" in caplog.text
