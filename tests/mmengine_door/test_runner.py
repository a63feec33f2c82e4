"""MMEngine's tutorial (a BaseModel, a BaseMetric, DataLoader objects, the Runner) with
``from treadle.mmengine import Runner`` in place of ``from mmengine.runner import Runner``: the same
final weights and validation results. The tutorial's ResNet-50 and CIFAR-10 download are a small
CNN and generated images here (CPU, no network); everything else is the tutorial's code."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def tutorial_parts():
    from mmengine.evaluator import BaseMetric
    from mmengine.model import BaseModel

    class MMSmallCNN(BaseModel):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                     nn.Linear(8, 10))

        def forward(self, imgs, labels, mode):
            x = self.net(imgs)
            if mode == "loss":
                return {"loss": F.cross_entropy(x, labels)}
            elif mode == "predict":
                return x, labels

    class Accuracy(BaseMetric):
        def process(self, data_batch, data_samples):
            score, gt = data_samples
            self.results.append({"batch_size": len(gt), "correct": (score.argmax(dim=1) == gt).sum().cpu()})

        def compute_metrics(self, results):
            total_correct = sum(item["correct"] for item in results)
            total_size = sum(item["batch_size"] for item in results)
            return dict(accuracy=100 * total_correct / total_size)

    return MMSmallCNN, Accuracy


def images(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    x = torch.randn(n, 3, 16, 16, generator=g) + labels.view(-1, 1, 1, 1) / 5
    return TensorDataset(x, labels)


def run(runner_cls, work_dir, loaders, model):
    from torch.optim import SGD

    MMSmallCNN, Accuracy = tutorial_parts()
    train_dataloader, val_dataloader = loaders
    runner = runner_cls(
        model=model, work_dir=str(work_dir), train_dataloader=train_dataloader,
        optim_wrapper=dict(optimizer=dict(type=SGD, lr=0.01, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        val_dataloader=val_dataloader, val_cfg=dict(), val_evaluator=dict(type=Accuracy),
        randomness=dict(seed=0))
    runner.train()
    return runner.model.state_dict(), runner.val()


@pytest.mark.parametrize("loaders", ["objects", "dicts"])
def test_the_tutorial_with_either_import_ends_with_the_same_weights(tmp_path, loaders):
    from mmengine.runner import Runner as MMEngineRunner

    from treadle.mmengine import Runner

    MMSmallCNN, _ = tutorial_parts()
    torch.manual_seed(0)
    model = MMSmallCNN()
    train, val = images(64, 1), images(32, 2)
    if loaders == "objects":  # in order: a DataLoader's own shuffle draws from torch's global RNG (docs/mmengine.md)
        made = (DataLoader(train, batch_size=16, shuffle=False), DataLoader(val, batch_size=16, shuffle=False))
    else:  # MMEngine's loader dicts: its DefaultSampler's order, shuffled
        made = tuple(dict(dataset=ds, batch_size=16, sampler=dict(type="DefaultSampler", shuffle=shuffle),
                          collate_fn=dict(type="default_collate")) for ds, shuffle in ((train, True), (val, False)))
    theirs = run(MMEngineRunner, tmp_path / "mmengine", copy.deepcopy(made), copy.deepcopy(model))
    ours = run(Runner, tmp_path / "treadle", copy.deepcopy(made), copy.deepcopy(model))
    assert sorted(ours[0]) == sorted(theirs[0])
    for name, w in theirs[0].items():
        assert torch.equal(ours[0][name], w), name
    assert ours[1] == {k: float(v) for k, v in theirs[1].items()} and set(ours[1]) == {"accuracy"}


def test_a_loader_dict_without_collate_fn_gets_pseudo_collate_as_under_mmengine(tmp_path):
    from treadle.mmengine import Runner

    MMSmallCNN, _ = tutorial_parts()
    runner = Runner(model=MMSmallCNN(), work_dir=str(tmp_path),
                    train_dataloader=dict(dataset=images(8, 0), batch_size=4, sampler=dict(type="DefaultSampler")),
                    optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)), train_cfg=dict(max_epochs=1))
    batch = runner.train_dataloader.collate_fn([(torch.zeros(2), 1), (torch.ones(2), 0)])
    from mmengine.dataset import pseudo_collate

    assert runner.train_dataloader.collate_fn is pseudo_collate  # MMEngine's own: the scope's FUNCTIONS
    assert isinstance(batch, list) and len(batch[0]) == 2 and not isinstance(batch[0], torch.Tensor)  # not stacked
    with pytest.raises(TypeError, match=r"unexpected arguments \['max_epoch'\]"):
        Runner(model=MMSmallCNN(), work_dir=str(tmp_path), max_epoch=3)


def test_from_cfg_runs_a_released_config_to_mmengines_weights(mm_work, monkeypatch, tmp_path, mmengine_lenet):
    """``Runner.from_cfg`` of the released lenet5_mnist.py, read by MMEngine's own ``Config``, ends
    with the weights of MMEngine's Runner on the same file (conftest.py's reference run)."""
    from mmengine.config import Config

    from treadle.mmengine import Runner

    monkeypatch.chdir(mm_work)
    cfg = Config.fromfile("configs/lenet/lenet5_mnist.py")
    cfg.merge_from_dict({"train_cfg.max_epochs": 2, "randomness.seed": 0, "work_dir": str(tmp_path / "run")})
    runner = Runner.from_cfg(cfg)
    model = runner.train()
    want = mmengine_lenet[1]["state_dict"]
    got = model.state_dict()
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert torch.equal(got[name], w), name
    assert runner.val() == {"accuracy/top1": mmengine_lenet[1]["val"][-1]["accuracy/top1"]}
