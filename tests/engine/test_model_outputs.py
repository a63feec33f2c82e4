"""The default step with loss_fn=None: how the model is called on the whole batch, and
what of its output is the loss and what is logged (a Hugging Face-style model, no wrapper)."""

from __future__ import annotations

import collections
import copy
import dataclasses
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import treadle
from treadle.engine.step import metric_inputs, parse_losses, whole_batch_caller
from treadle.strategies.base import move_to

from support import DEVICE, FUSED


@dataclasses.dataclass
class Output:
    """Like a Hugging Face ModelOutput that is not a dict."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    past_key_values: object


class KeywordModel(nn.Module):
    """forward(input_ids, attention_mask=None, labels=None), as a Hugging Face model."""

    def __init__(self, as_dict: bool = False):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 3)
        self.as_dict = as_dict

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.emb(input_ids) * attention_mask[..., None]
        logits = self.head(h.mean(1))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        if self.as_dict:
            return {"loss": loss, "logits": logits, "past_key_values": object(), "aux": torch.tensor(0.5)}
        return Output(loss, logits, object())


class Tokens(Dataset):
    def __init__(self, n=24):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 10, (n, 5), generator=g)
        self.labels = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(5), "labels": self.labels[i]}


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_keyword_model_trains_as_a_hand_loop_calling_model_of_star_star_batch(tmp_path, as_dict):
    torch.manual_seed(0)
    model = KeywordModel(as_dict)
    reference = copy.deepcopy(model).to(DEVICE)  # the reference runs where the run does
    loader = DataLoader(Tokens(), batch_size=8)
    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=loader, optimizer=dict(type="SGD", lr=0.1),
                        max_iters=6, log_interval=3, strategy="single", checkpoint=False, progress=False,
                        log_writers=["jsonl"])
    t.fit()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, **FUSED)
    for _ in range(2):
        for batch in loader:
            out = reference(**move_to(batch, DEVICE))
            loss = out["loss"] if as_dict else out.loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    for a, b in zip(t.module.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if r["mode"] == "train"]
    assert len(train) == 2
    logged = {k for r in train for k in r} - {"mode", "epoch", "iter", "timestamp", "lr", "data_time", "step_time",
                                             "samples_per_s", "eta_s", "max_memory_mb"}  # the last: on CUDA
    assert logged == ({"loss", "aux"} if as_dict else {"loss"})  # no logits, no cache object


def test_a_forward_that_takes_the_whole_batch_still_gets_it():
    got = []

    class Whole(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, batch, scale=1.0):
            got.append(type(batch))
            return (batch["x"] * self.w).sum() * scale

    call = whole_batch_caller(Whole())
    call(Whole(), {"x": torch.ones(2), "y": torch.ones(2)})
    assert got == [dict]
    keyword = whole_batch_caller(KeywordModel())
    model = KeywordModel()
    batch = Tokens()[0]
    batch = {k: v[None] for k, v in batch.items()}
    assert keyword(model, batch).loss is not None  # model(**batch)
    with pytest.raises(TypeError):
        keyword(model, {**batch, "unknown": 1})  # a key the forward does not name: model(batch), which fails

    class Kw(nn.Module):
        def forward(self, **kwargs):
            return sorted(kwargs)

    assert whole_batch_caller(Kw())(Kw(), {"a": 1, "b": 2}) == ["a", "b"]


def test_outputs_that_carry_a_loss_and_what_is_logged():
    loss = torch.tensor(2.0, requires_grad=True)

    class WithLoss:
        def __init__(self):
            self.loss = loss
            self.logits = torch.ones(4, 3)

    for out in (Output(loss, torch.ones(4, 3), object()), WithLoss(),
                collections.OrderedDict(loss=loss, logits=torch.ones(4, 3), hidden=(torch.ones(2),))):
        total, logged = parse_losses(out)
        assert total is loss and set(logged) == {"loss"} and not logged["loss"].requires_grad
    total, logged = parse_losses({"loss_a": loss, "loss_b": loss * 2, "acc": 0.5, "flag": True, "n": torch.ones(1)})
    assert total.item() == 6.0 and set(logged) == {"loss", "loss_a", "loss_b", "acc", "n"}
    with pytest.raises(ValueError, match="no key containing 'loss'"):
        parse_losses(Output(None, torch.ones(1), None))


def test_mapping_batches_of_any_kind_are_moved():
    class Encoding(collections.UserDict):  # like transformers.BatchEncoding
        pass

    moved = move_to(Encoding(input_ids=torch.ones(2, dtype=torch.long), mask=[torch.zeros(1)]), torch.device("cpu"),
                    dtype=torch.float16)
    assert isinstance(moved, dict) and moved["input_ids"].dtype == torch.long and moved["mask"][0].dtype == torch.float16


def test_metrics_get_the_logits_and_the_labels():
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    assert metric_inputs({"loss": torch.tensor(1.0), "logits": logits}, {"input_ids": 0, "labels": labels}) == \
        (logits, labels)
    out = torch.randn(4, 3)
    assert metric_inputs(out, (torch.ones(4), labels))[1] is labels
    batch = {"x": 1}
    assert metric_inputs(out, batch) == (out, batch)


def test_validation_of_a_keyword_model_feeds_metrics_and_reports_its_loss():
    torch.manual_seed(0)
    model = KeywordModel()
    t = treadle.Trainer(model, val_dataloader=DataLoader(Tokens(), batch_size=8), metrics={"acc": treadle.Accuracy()},
                        strategy="single")
    res = t.validate()
    ds = Tokens()
    with torch.no_grad():  # the model stays where the run put it
        out = model(*(x.to(DEVICE) for x in (ds.ids, torch.ones(len(ds), 5), ds.labels)))
    assert res["val/acc"] == pytest.approx((out.logits.argmax(1).cpu() == ds.labels).float().mean().item())
    assert res["val/loss"] == pytest.approx(out.loss.item(), rel=1e-5)


def test_metrics_that_are_modules_go_to_the_run_device():
    """A torchmetrics metric is an nn.Module holding its state in buffers: it is moved to
    the device the model's outputs are on (on a GPU it was left on the CPU: the first
    update raised 'different devices')."""
    class Spy(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(()))
            self.moved_to = []

        def to(self, *args, **kwargs):
            self.moved_to.append(torch.device(args[0] if args else kwargs["device"]))
            return super().to(*args, **kwargs)

        def reset(self):
            self.total.zero_()

        def update(self, outputs, targets):
            self.total += (outputs.argmax(1) == targets).sum()  # the logits: treadle picks them

        def compute(self):
            return self.total.item()

    spy = Spy()
    t = treadle.Trainer(KeywordModel(), val_dataloader=DataLoader(Tokens(), batch_size=8), metrics={"n": spy},
                        strategy="single")
    assert spy.moved_to == [t.strategy.device] == [DEVICE]
    assert t.validate()["val/n"] == spy.total.item()
