"""Detection batches as torchvision writes them: ``(images, targets)`` from the reference collate
``lambda b: tuple(zip(*b))`` goes in as ``model(images, targets)`` (no loss_fn) when the forward
takes the two; validation of a model that returns predictions; best/monitor keys that validation
never produces refused when the Trainer is built. tests/vision runs torchvision's own Faster R-CNN."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.engine.monitored import ANY, LOSSES, NONE, may_produce
from treadle.engine.step import takes_inputs_and_targets, whole_batch_caller
from treadle.hooks import EarlyStoppingHook


class Detector(nn.Module):
    """A stand-in with torchvision's detection contract: ``forward(images, targets=None)``,
    a list of images and a list of target dicts; losses by name in training (targets
    required), a list of predictions in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 4)

    def forward(self, images, targets=None):
        feats = torch.stack([img.mean(dim=(1, 2)) for img in images])
        boxes = self.head(feats)
        if self.training:
            if targets is None:
                raise AssertionError("targets should not be none when in training mode")
            truth = torch.stack([t["boxes"][0] for t in targets])
            return {"loss_box_reg": (boxes - truth).abs().mean(), "loss_classifier": boxes.pow(2).mean() * 1e-3}
        return [{"boxes": b[None], "scores": torch.ones(1), "labels": torch.ones(1, dtype=torch.long)} for b in boxes]


def items(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        h, w = (int(v) for v in torch.randint(8, 13, (2,), generator=g))  # images of several sizes
        out.append((torch.rand(3, h, w, generator=g), {"boxes": torch.rand(1, 4, generator=g) * 8,
                                                      "labels": torch.ones(1, dtype=torch.long)}))
    return out


def reference_collate(batch):
    return tuple(zip(*batch))  # torchvision's references/detection/utils.py collate_fn


class BoxError:
    """Mean absolute error of the first predicted box (a metric of treadle's protocol)."""

    def reset(self):
        self.total, self.n = 0.0, 0

    def update(self, outputs, targets):
        for o, t in zip(outputs, targets):
            self.total += float((o["boxes"][0] - t["boxes"][0]).abs().mean())
            self.n += 1

    def compute(self):
        return self.total / max(self.n, 1)


def detection_trainer(**kw):
    torch.manual_seed(0)
    return treadle.Trainer(
        Detector(), train_dataloader=DataLoader(items(8, 1), batch_size=4, shuffle=True, collate_fn=reference_collate),
        val_dataloader=DataLoader(items(4, 2), batch_size=2, collate_fn=reference_collate),
        optimizer=dict(type="SGD", lr=0.05), max_epochs=2, metrics={"box_err": BoxError()}, progress=False, seed=0, **kw)


def test_the_reference_collate_trains_a_detector_and_validates_without_a_loss():
    t = detection_trainer()
    first = t.validate()["val/box_err"]
    results = t.fit()
    assert set(results) == {"val/box_err"}  # predictions in eval mode: no val/loss
    assert results["val/box_err"] < first


def test_the_call_is_the_hand_written_one():
    """model(images, targets) with the batch's two parts, exactly as a loop written by hand calls it."""
    model, batch = Detector(), reference_collate(items(2, 3))
    call = whole_batch_caller(model)
    assert call(model, batch) == model(batch[0], batch[1])
    model.eval()
    out = call(model, batch)
    assert isinstance(out, list) and torch.equal(out[0]["boxes"], model(batch[0])[0]["boxes"])


class One(nn.Module):
    def forward(self, batch):
        return batch


class Flagged(nn.Module):
    def forward(self, batch, return_all=False):
        return batch


class Two(nn.Module):
    def forward(self, x, y):
        return x, y


class Args(nn.Module):
    def forward(self, *args):
        return args


class NeedsKeyword(nn.Module):
    def forward(self, x, y=None, *, scale):
        return x


@pytest.mark.parametrize("model, pair", [(Detector(), True), (Two(), True), (One(), False), (Flagged(), False),
                                         (Args(), False), (NeedsKeyword(), False), (nn.Linear(2, 2), False)])
def test_which_forwards_take_inputs_and_targets(model, pair):
    assert takes_inputs_and_targets(model) is pair
    batch = ("inputs", "targets")
    expected = ("inputs", "targets") if pair else (batch if not isinstance(model, Args) else (batch,))
    if isinstance(model, (Two, One, Flagged, Args)):  # forwards that hand back what they got
        assert whole_batch_caller(model)(model, batch) == expected


def test_a_pair_is_split_only_when_it_is_a_pair():
    call = whole_batch_caller(Two())
    with pytest.raises(TypeError):
        call(Two(), ("a", "b", "c"))  # three parts: model(batch), which a two-argument forward refuses


@pytest.mark.parametrize("kw, message", [
    (dict(checkpoint=dict(best="val/loss")),
     r"^checkpoint best='val/loss': validation never produces 'val/loss': it can give val/box_err \(.*without a "
     r"loss_fn, Detector returns"),
    (dict(hooks=[EarlyStoppingHook(monitor="val/mAP")]),
     r"^EarlyStoppingHook monitor='val/mAP': validation never produces 'val/mAP'"),
    (dict(hooks=[EarlyStoppingHook(monitor="box_err", rule="less")]),
     r"^EarlyStoppingHook monitor='box_err': validation never produces 'box_err'.* Did you mean 'val/box_err'\?"),
])
def test_a_key_validation_never_produces_is_refused_when_the_trainer_is_built(kw, message, monkeypatch):
    from treadle.engine import monitored

    monkeypatch.setattr(monitored, "returns_predictions_in_eval", lambda m: isinstance(m, Detector))
    with pytest.raises(ValueError, match=message):
        detection_trainer(**kw)


def test_a_key_a_loss_may_give_is_left_for_the_first_validation():
    detection_trainer(checkpoint=dict(best="val/loss"))  # the model's eval output might carry losses: not known yet
    detection_trainer(checkpoint=dict(best="val/box_err", rule="min"), hooks=[EarlyStoppingHook(monitor="val/box_err",
                                                                                                 rule="less")])


@pytest.mark.parametrize("key, metrics, kind, ok", [
    ("val/acc", ["acc"], NONE, True), ("val/coco/bbox_mAP", ["coco"], NONE, True), ("val/cocox", ["coco"], ANY, True),
    ("val/cocox", ["coco"], LOSSES, False), ("val/loss_cls", [], LOSSES, True), ("val/loss", [], NONE, False),
    ("acc", ["acc"], ANY, False), ("val/acc", [], ANY, True),
])
def test_what_validation_may_produce(key, metrics, kind, ok):
    assert may_produce(key, metrics, kind) is ok
