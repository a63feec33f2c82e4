"""What an evaluation gives that would be silently useless: a loader without a batch
(refused when the Trainer is built when it has a length; said once after a pass when it
has none) and a result that is not a number (said once)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import treadle

from support import TinyNet, make_data


def _trainer(tmp_path, val, metrics=None, **kw):
    return treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(16), batch_size=8),
                           val_dataloader=val, metrics=metrics, loss_fn=nn.CrossEntropyLoss(),
                           optimizer=dict(type="SGD", lr=0.1), max_epochs=2, progress=False, log_writers=["jsonl"],
                           **kw)


@pytest.mark.parametrize("loader, named", [
    (DataLoader(TensorDataset(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long)), batch_size=4), None),
    (DataLoader(make_data(3), batch_size=4, drop_last=True), None),
    ({"clean": DataLoader(make_data(8), batch_size=4), "empty": DataLoader(make_data(3), batch_size=4,
                                                                          drop_last=True)}, "['empty']"),
])
def test_an_evaluation_loader_without_a_batch_is_refused_when_the_trainer_is_built(tmp_path, loader, named):
    with pytest.raises(ValueError, match=r"val_dataloader" + (r"\['empty'\]" if named else "") +
                       r" has no batches \(len 0 over \d+ sample\(s\)") as e:
        _trainer(tmp_path, loader, metrics={"acc": treadle.Accuracy()})
    assert len(str(e.value).splitlines()) == 1


class Nothing(IterableDataset):
    def __iter__(self):
        return iter(())


def test_a_loader_without_a_length_that_yields_nothing_is_said_once(tmp_path, caplog):
    trainer = _trainer(tmp_path, DataLoader(Nothing(), batch_size=4), metrics={"acc": treadle.Accuracy()})
    with caplog.at_level(logging.WARNING, logger="treadle"):
        trainer.fit()
    said = [r.getMessage() for r in caplog.records if "yielded no batches" in r.getMessage()]
    assert said == ["the val loader yielded no batches: its metrics are nan (said once)"], said


class Labelled:
    """A metric whose result is a string (what torchmetrics never gives, but a user's may)."""

    def update(self, outputs, targets) -> None:
        pass

    def compute(self) -> str:
        return "0.9"

    def reset(self) -> None:
        pass


def test_a_result_that_is_not_a_number_is_said_once_and_kept_in_the_log(tmp_path, caplog):
    trainer = _trainer(tmp_path, DataLoader(make_data(8), batch_size=4), metrics={"label": Labelled()})
    with caplog.at_level(logging.WARNING, logger="treadle"):
        trainer.fit()  # two validations
    said = [r.getMessage() for r in caplog.records if "not a number" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("val/label is a str ('0.9'), not a number: it is kept in "
                                                 "log.jsonl"), said
    records = treadle.logging.read_jsonl(tmp_path / "log.jsonl")
    assert [r["val/label"] for r in records if r.get("mode") == "val"] == ["0.9", "0.9"]
