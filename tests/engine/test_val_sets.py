"""Several validation sets: ``val_dataloader={name: loader}`` logs each set's results under
``val/<name>/``, equal to validating that set alone; ``best=`` and early stopping name one
set; the evaluation feeds' places resume exactly; configs (treadle's and mmagic's
MultiValLoop, translated) give the sets by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, TinyNet, make_data
from treadle.config.assemble import trainer_kwargs
from treadle.openmmlab.translate import translate
from treadle.hooks.early_stopping import EarlyStoppingHook


def _sets():
    return {"clean": DataLoader(make_data(10, seed=1), batch_size=4),
            "noisy": DataLoader(make_data(7, seed=2), batch_size=3)}


def test_each_set_is_logged_under_its_name_as_it_validates_alone(tmp_path):
    stop = EarlyStoppingHook(monitor="val/noisy/acc", patience=10)
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(16), batch_size=4),
                        val_dataloader=_sets(), loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.5),
                        max_epochs=3, seed=0, metrics={"acc": treadle.metrics.Accuracy()}, strategy=ON_CPU,
                        progress=False, checkpoint=dict(best="val/clean/loss", rule="min"), hooks=[stop])
    results = t.fit()
    assert sorted(results) == ["val/clean/acc", "val/clean/loss", "val/noisy/acc", "val/noisy/loss"]
    for name, loader in _sets().items():
        alone = treadle.Trainer(t.module, val_dataloader=loader, loss_fn=nn.CrossEntropyLoss(),
                                metrics={"acc": treadle.metrics.Accuracy()}, strategy=ON_CPU, log_writers=(),
                                progress=False).validate()
        assert alone == {f"val/{k}": results[f"val/{name}/{k}"] for k in ("loss", "acc")}
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    vals = [r for r in records if "val/clean/acc" in r]
    assert len(vals) == 3 and all("val/noisy/loss" in r for r in vals)
    best = min(r["val/clean/loss"] for r in vals)
    assert [p.name for p in (tmp_path / "checkpoints" / "best").iterdir() if p.name.startswith("best_val_clean_loss")]
    assert stop.state_dict()["best"] == max(r["val/noisy/acc"] for r in vals)
    assert best == pytest.approx(min(r["val/clean/loss"] for r in vals))


class Record(treadle.Hook):
    def __init__(self):
        self.results = []

    def after_val(self, trainer, metrics):
        self.results.append(dict(metrics))


def _iter_run(work, resume=False):
    torch.manual_seed(0)  # the model's initial weights
    rec = Record()
    # 5 and 4 batches of validation, 2 of each per val phase: the feeds wrap around mid-pass.
    sets = {"a": DataLoader(make_data(10, seed=1), batch_size=2), "b": DataLoader(make_data(12, seed=2), batch_size=3,
                                                                               shuffle=True)}
    t = treadle.Trainer(TinyNet(dropout=0.2), work_dir=work, train_dataloader=DataLoader(make_data(20), batch_size=4,
                                                                                        shuffle=True),
                        val_dataloader=sets, loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1),
                        max_iters=12, workflow=[("train", 3), ("val", 2)], seed=4, strategy=ON_CPU, log_writers=(),
                        progress=False, resume=resume, checkpoint=dict(interval=3, by_epoch=False, keep=None),
                        hooks=[rec])
    t.fit()
    return rec.results, {k: v.clone() for k, v in t.module.state_dict().items()}, t


def test_iteration_workflow_val_places_resume_exactly(tmp_path):
    whole, weights, _ = _iter_run(tmp_path / "whole")
    assert len(whole) == 4
    part = tmp_path / "part"
    _iter_run(part)
    for p in (part / "checkpoints").iterdir():
        if p.name != "iter_00000006":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    resumed, got, t = _iter_run(part, resume=True)
    assert resumed == whole[1:]  # the checkpoint came before its validation: from there on, each set where it was
    for k, v in weights.items():
        assert torch.equal(got[k], v), k
    assert t.val_loop.state_dict()["sets"] == {"a": {"epoch": 1, "batch_idx": 3}, "b": {"epoch": 1, "batch_idx": 4}}


def test_config_sets_by_name_and_mmagics_multivalloop():
    cfg = {"model": {"type": "support.TinyNet"}, "loss_fn": {"type": "CrossEntropyLoss"},
           "val_dataloader": {"x": {"dataset": {"type": "support.make_data", "n": 4}, "batch_size": 2},
                              "y": {"dataset": {"type": "support.make_data", "n": 6, "seed": 3}, "batch_size": 3}},
           "metrics": {"acc": {"type": "Accuracy"}}, "strategy": "single", "log_writers": []}
    kw = trainer_kwargs(cfg, "validate")
    assert sorted(kw["val_dataloader"]) == ["x", "y"] and len(kw["val_dataloader"]["y"]) == 2
    results = treadle.Trainer(**kw, progress=False).validate()
    assert sorted(results) == ["val/x/acc", "val/x/loss", "val/y/acc", "val/y/loss"]
    mm = translate({"val_cfg": {"type": "mmagic.MultiValLoop"}, "test_cfg": {"type": "MultiTestLoop"},
                    "val_dataloader": [{"batch_size": 2, "dataset": {"type": "support.make_data", "n": 4}},
                                       {"batch_size": 2, "dataset": {"type": "support.make_data", "n": 4},
                                        "sampler": {"type": "DefaultSampler", "shuffle": False}}]})
    assert mm["val_dataloader"] == {"0": {"batch_size": 2, "dataset": {"type": "support.make_data", "n": 4}},
                                    "1": {"batch_size": 2, "dataset": {"type": "support.make_data", "n": 4},
                                          "sampler": {"type": "DefaultSampler", "shuffle": False}}}
    from treadle.components.errors import ConfigError

    with pytest.raises(ConfigError, match="^val_cfg: options have no treadle equivalent"):
        translate({"val_cfg": {"type": "MultiValLoop", "fp16": True}})


def test_set_names_must_be_loggable():
    with pytest.raises(ValueError, match="set name 'a/b'"):
        treadle.Trainer(TinyNet(), val_dataloader={"a/b": DataLoader(make_data(4))}, strategy=ON_CPU, log_writers=())


def test_a_key_naming_no_set_is_refused_when_built_and_a_set_key_is_accepted(tmp_path):
    kwargs = dict(work_dir=tmp_path, train_dataloader=DataLoader(make_data(16), batch_size=4), val_dataloader=_sets(),
                  loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.5), max_epochs=1, strategy=ON_CPU,
                  metrics={"acc": treadle.metrics.Accuracy()}, progress=False)
    with pytest.raises(ValueError, match=r"best='val/acc': validation never produces 'val/acc': it can give "
                                         r"val/clean/acc, val/clean/loss, val/noisy/acc, val/noisy/loss"):
        treadle.Trainer(TinyNet(), checkpoint=dict(best="val/acc", rule="max"), **kwargs)
    with pytest.raises(ValueError, match=r"'val/dirty/acc'.*val/<set>/<name>.*Did you mean 'val/noisy/acc' or 'val/clean/acc'"):
        treadle.Trainer(TinyNet(), hooks=[EarlyStoppingHook(monitor="val/dirty/acc")], **kwargs)
    treadle.Trainer(TinyNet(), checkpoint=dict(best="val/noisy/loss", rule="min"), **kwargs)
