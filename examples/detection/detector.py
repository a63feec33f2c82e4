"""A detection-style model in plain torch, called as torchvision's detectors are.

``model(images, targets)`` in train mode returns a dict of losses; ``model(images)`` in
eval mode returns one dict of ``boxes``/``scores``/``labels`` per image. Images are a list
of tensors (sizes may differ; here they don't), targets a list of dicts with ``boxes``
(``[N, 4]``, x1 y1 x2 y2 in pixels) and ``labels`` (``[N]``, 1-based, 0 is background).

The data: bright squares of a few sizes on a noisy background; the class of a square is
its size. The detector: a small CNN whose every cell of a 4x4 grid predicts whether a
square's centre falls in it, its class and its box. ``BoxAP`` is the metric: average
precision at IoU 0.5, averaged over the classes (VOC's all-point rule).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

SIZE, GRID, CLASSES = 32, 4, 3  # image side, grid cells per side, square sizes (classes 1..3)
CELL = SIZE // GRID
# Each cell's top-left corner, twice (x1 y1 x2 y2 offsets): boxes are predicted from it.
_ORIGINS = torch.tensor([[x * CELL, y * CELL, x * CELL, y * CELL] for y in range(GRID) for x in range(GRID)],
                        dtype=torch.float32)


class Squares(Dataset):
    """``(image, target)`` pairs: 1 to 3 squares per image, one per grid cell at most."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            image = 0.1 * torch.randn(3, SIZE, SIZE, generator=g)
            cells = torch.randperm(GRID * GRID, generator=g)[: int(torch.randint(1, 4, (), generator=g))]
            boxes, labels = [], []
            for cell in cells.tolist():
                label = int(torch.randint(1, CLASSES + 1, (), generator=g))
                side = 2 + 2 * label  # 4, 6 or 8 pixels
                cy, cx = divmod(cell, GRID)
                x1 = cx * CELL + int(torch.randint(0, CELL - side + 1, (), generator=g)) if side < CELL else cx * CELL
                y1 = cy * CELL + int(torch.randint(0, CELL - side + 1, (), generator=g)) if side < CELL else cy * CELL
                image[:, y1:y1 + side, x1:x1 + side] += 1.0
                boxes.append([x1, y1, x1 + side, y1 + side])
                labels.append(label)
            self.items.append((image, {"boxes": torch.tensor(boxes, dtype=torch.float32),
                                       "labels": torch.tensor(labels)}))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        return self.items[i]


def collate(samples: list[tuple[Tensor, dict[str, Tensor]]]) -> dict[str, list[Any]]:
    """Lists, not stacked tensors (a detector takes images of any size): the batch is a
    dict named as the forward's arguments, so the Trainer calls ``model(**batch)``."""
    images, targets = zip(*samples)
    return {"images": list(images), "targets": list(targets)}


class TinyDetector(nn.Module):
    def __init__(self, width: int = 32, score_threshold: float = 0.3) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(GRID))
        self.head = nn.Conv2d(width, 1 + CLASSES + 4, 1)  # objectness, classes, box (cell offsets)
        self.score_threshold = score_threshold

    def forward(self, images: list[Tensor], targets: list[dict[str, Tensor]] | None = None) -> Any:
        out = self.head(self.backbone(torch.stack(images)))  # [B, 1 + C + 4, GRID, GRID]
        out = out.flatten(2).transpose(1, 2)  # [B, cells, 1 + C + 4]
        objectness, classes, boxes = out[..., 0], out[..., 1:1 + CLASSES], out[..., 1 + CLASSES:]
        if self.training:
            if targets is None:
                raise ValueError("TinyDetector in train mode needs targets")
            return self._losses(objectness, classes, boxes, targets)
        return self._predictions(objectness, classes, boxes)

    @staticmethod
    def _cell_targets(targets: list[dict[str, Tensor]], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        b = len(targets)
        obj = torch.zeros(b, GRID * GRID, device=device)
        cls = torch.zeros(b, GRID * GRID, dtype=torch.long, device=device)
        box = torch.zeros(b, GRID * GRID, 4, device=device)
        for i, t in enumerate(targets):
            centre = (t["boxes"][:, :2] + t["boxes"][:, 2:]) / 2
            cell = (centre[:, 1] // CELL).long() * GRID + (centre[:, 0] // CELL).long()
            obj[i, cell] = 1.0
            cls[i, cell] = t["labels"] - 1
            box[i, cell] = (t["boxes"] - _ORIGINS.to(device)[cell]) / CELL  # from the cell's corner, in cells
        return obj, cls, box

    def _losses(self, objectness: Tensor, classes: Tensor, boxes: Tensor,
                targets: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        obj, cls, box = self._cell_targets(targets, objectness.device)
        positive = obj > 0
        return {"loss_objectness": nn.functional.binary_cross_entropy_with_logits(objectness, obj),
                "loss_classifier": nn.functional.cross_entropy(classes[positive], cls[positive]),
                "loss_box_reg": nn.functional.smooth_l1_loss(boxes[positive], box[positive])}

    def _predictions(self, objectness: Tensor, classes: Tensor, boxes: Tensor) -> list[dict[str, Tensor]]:
        scores = objectness.sigmoid()
        out = []
        for s, c, b in zip(scores, classes, boxes):
            keep = s > self.score_threshold
            boxes = b[keep] * CELL + _ORIGINS.to(b.device)[keep]
            out.append({"boxes": boxes, "scores": s[keep], "labels": c[keep].argmax(-1) + 1})
        return out


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of every box of ``a`` ([N, 4]) with every box of ``b`` ([M, 4])."""
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (a[:, 2:] - a[:, :2]).prod(-1)[:, None] + (b[:, 2:] - b[:, :2]).prod(-1)[None, :]
    return inter / (area - inter).clamp(min=1e-9)


class BoxAP:
    """Average precision at IoU ``iou``, the mean over classes: ``update(predictions,
    targets)`` takes a batch's lists of dicts, ``compute()`` the AP (VOC's all-point
    interpolation; a class without ground truth is left out). One process: its state is
    the matched detections, kept on the host."""

    def __init__(self, iou: float = 0.5) -> None:
        self.iou = iou
        self.reset()

    def reset(self) -> None:
        self.detections: dict[int, list[tuple[float, bool]]] = {}
        self.truths: dict[int, int] = {}

    def update(self, predictions: list[dict[str, Tensor]], targets: list[dict[str, Tensor]]) -> None:
        for p, t in zip(predictions, targets):
            for label in t["labels"].tolist():
                self.truths[label] = self.truths.get(label, 0) + 1
            for label in set(p["labels"].tolist()):
                mine = p["labels"] == label
                truth = t["boxes"][t["labels"] == label]
                order = p["scores"][mine].argsort(descending=True)
                boxes, scores = p["boxes"][mine][order], p["scores"][mine][order]
                taken = torch.zeros(len(truth), dtype=torch.bool)
                ious = box_iou(boxes.float().cpu(), truth.float().cpu()) if len(truth) else None
                for j in range(len(boxes)):
                    hit = False
                    if ious is not None:
                        best = int(ious[j].argmax())
                        if ious[j, best] >= self.iou and not taken[best]:
                            taken[best] = hit = True
                    self.detections.setdefault(label, []).append((float(scores[j]), hit))

    def compute(self) -> float:
        aps = []
        for label, n in self.truths.items():
            found = sorted(self.detections.get(label, []), key=lambda d: -d[0])
            tp = torch.tensor([hit for _, hit in found], dtype=torch.float64).cumsum(0)
            precision = tp / torch.arange(1, len(found) + 1, dtype=torch.float64)
            recall = tp / n
            # all-point interpolation: the area under the precision envelope
            r = torch.cat([torch.zeros(1, dtype=torch.float64), recall, torch.ones(1, dtype=torch.float64)])
            pr = torch.cat([torch.zeros(1, dtype=torch.float64), precision, torch.zeros(1, dtype=torch.float64)])
            for i in range(len(pr) - 2, -1, -1):
                pr[i] = max(pr[i], pr[i + 1])
            aps.append(float(((r[1:] - r[:-1]) * pr[1:]).sum()))
        return sum(aps) / len(aps) if aps else 0.0
