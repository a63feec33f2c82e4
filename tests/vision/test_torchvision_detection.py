"""torchvision's own Faster R-CNN with its reference collate ``lambda b: tuple(zip(*b))`` and no
loss_fn: trained as ``model(images, targets)``, validated on its predictions (no val/loss), resumed
exactly; a best key validation never produces is refused when the Trainer is built."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import treadle

from faults import StopAt

detection = pytest.importorskip("torchvision.models.detection")


def boxes_data(n: int, seed: int) -> list:
    """Images of several sizes with one or two bright squares (labels 1, 2)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        h, w = (int(v) for v in torch.randint(48, 65, (2,), generator=g))
        img = torch.rand(3, h, w, generator=g) * 0.3
        boxes, labels = [], []
        for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
            x0, y0 = int(torch.randint(0, w - 20, (1,), generator=g)), int(torch.randint(0, h - 20, (1,), generator=g))
            c = int(torch.randint(1, 3, (1,), generator=g))
            img[c - 1, y0:y0 + 16, x0:x0 + 16] += 0.7
            boxes.append([x0, y0, x0 + 16, y0 + 16])
            labels.append(c)
        out.append((img, {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels)}))
    return out


def reference_collate(batch):
    return tuple(zip(*batch))  # torchvision's references/detection/utils.py collate_fn


class Detections:
    """Mean number of predicted boxes per image (eval outputs: torchvision's list of dicts)."""

    def reset(self):
        self.boxes, self.images = 0, 0

    def update(self, outputs, targets):
        assert len(outputs) == len(targets) and "boxes" in targets[0]  # the targets of the same batch
        self.boxes += sum(len(o["boxes"]) for o in outputs)
        self.images += len(outputs)

    def compute(self):
        return self.boxes / max(self.images, 1)


def detector():
    torch.manual_seed(0)
    return detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=80, rpn_pre_nms_top_n_train=100,
        rpn_post_nms_top_n_train=50, rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=20, box_batch_size_per_image=32)


def trainer(tmp_path, **kw):
    model = detector()
    return treadle.Trainer(
        model, work_dir=tmp_path,
        train_dataloader=DataLoader(boxes_data(8, 1), batch_size=2, shuffle=True, collate_fn=reference_collate),
        val_dataloader=DataLoader(boxes_data(4, 2), batch_size=2, collate_fn=reference_collate),
        optimizer=dict(type="SGD", lr=0.01, momentum=0.9), max_epochs=2, metrics={"dets": Detections()},
        progress=False, seed=0, log_interval=2, **kw), model


def test_faster_rcnn_trains_with_the_reference_collate_and_resumes_exactly(tmp_path):
    ref, ref_model = trainer(tmp_path / "ref")
    results = ref.fit()
    assert set(results) == {"val/dets"}  # predictions in eval mode: no val/loss
    records = (tmp_path / "ref" / "log.jsonl").read_text()
    assert '"loss_classifier"' in records and '"loss_rpn_box_reg"' in records  # its losses, by name
    stopped, _ = trainer(tmp_path / "run", hooks=[StopAt(5)])  # inside the second epoch
    stopped.fit()
    resumed, model = trainer(tmp_path / "run", resume=True)
    assert resumed.fit() == results
    for (name, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_best_on_a_loss_faster_rcnn_never_gives_in_eval_mode_is_refused_when_built(tmp_path):
    with pytest.raises(ValueError, match=r"^checkpoint best='val/loss': validation never produces 'val/loss': it can "
                                         r"give val/dets .*FasterRCNN returns predictions in eval mode"):
        trainer(tmp_path, checkpoint=dict(best="val/loss"))
    trainer(tmp_path, checkpoint=dict(best="val/dets", rule="max"))
