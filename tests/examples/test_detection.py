"""A detection-style model (torchvision's convention: lists of images and target dicts,
a loss dict in train mode, prediction dicts in eval mode) with the default step."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import treadle
from treadle.strategies.base import move_to
from support import DEVICE, FUSED

DIR = Path(__file__).resolve().parents[2] / "examples" / "detection"


def _load(name):
    sys.path.insert(0, str(DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"detection_{name}", DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(DIR))


det = _load("detector")


def test_training_equals_a_hand_loop_calling_the_detector_with_images_and_targets():
    torch.manual_seed(0)
    model = det.TinyDetector()
    reference = copy.deepcopy(model).to(DEVICE)  # the reference runs where the run does
    loader = DataLoader(det.Squares(32, seed=1), batch_size=8, collate_fn=det.collate)
    t = treadle.Trainer(model, train_dataloader=loader, optimizer=dict(type="SGD", lr=0.05), max_iters=4,
                        strategy="single", progress=False, checkpoint=False)
    t.fit()
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, **FUSED)
    for batch in loader:
        batch = move_to(batch, DEVICE)
        losses = reference(images=batch["images"], targets=batch["targets"])
        opt.zero_grad()
        sum(losses.values()).backward()
        opt.step()
    for a, b in zip(t.module.parameters(), reference.parameters()):
        if DEVICE.type == "cuda":  # cuDNN's convolution weight gradients are not bit-reproducible (atomics)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        else:
            assert torch.equal(a, b)


def test_evaluation_gives_the_metric_the_predictions_and_the_targets():
    torch.manual_seed(0)
    model = det.TinyDetector(score_threshold=0.0)
    data = det.Squares(24, seed=2)
    t = treadle.Trainer(model, val_dataloader=DataLoader(data, batch_size=8, collate_fn=det.collate),
                        metrics={"ap50": det.BoxAP()}, strategy="single")
    res = t.validate()
    model.eval()
    by_hand = det.BoxAP()
    with torch.no_grad():
        for i in range(0, 24, 8):
            images, targets = zip(*[data[j] for j in range(i, i + 8)])
            by_hand.update(model([x.to(DEVICE) for x in images]), move_to(list(targets), DEVICE))
    assert res["val/ap50"] == pytest.approx(by_hand.compute())
    assert set(res) == {"val/ap50"}  # eval mode returns predictions, no loss


def test_box_ap_closed_form():
    truth = [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0]]), "labels": torch.tensor([1])}]
    exact = [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0]]), "scores": torch.tensor([0.9]), "labels": torch.tensor([1])}]
    ap = det.BoxAP()
    ap.update(exact, truth)
    assert ap.compute() == 1.0
    # a false positive ranked above the true one: precision 1/2 at recall 1
    ranked = [{"boxes": torch.tensor([[20.0, 20.0, 24.0, 24.0], [0.0, 0.0, 4.0, 4.0]]),
               "scores": torch.tensor([0.9, 0.8]), "labels": torch.tensor([1, 1])}]
    ap.reset()
    ap.update(ranked, truth)
    assert ap.compute() == pytest.approx(0.5)
    ap.reset()
    ap.update([{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}],
              truth)
    assert ap.compute() == 0.0


@pytest.mark.slow  # 8 epochs, about 15 s
def test_the_example_learns_to_detect(tmp_path):
    result = _load("train").main(["--epochs", "8", "--work-dir", str(tmp_path / "run")])
    assert result["val/ap50"] > 0.4
