"""A WORKAROUND OF THIS TEST ENVIRONMENT, NOT OF TREADLE (tests/vision/conftest.py and the
scripts of this folder that run in their own process call :func:`load_torchvision`).

The torchvision wheel PyPI serves for torch 2.13.0 is a CUDA build: beside the CPU torch
build its compiled ops do not load, and ``import torchvision`` fails ("operator
torchvision::nms does not exist"), taking timm with it. When (and only when) that happens,
``torchvision::nms`` (and ``qnms``, which torchvision also registers at import) is defined in
Python for the CPU and torchvision imported again: its detection models then run on
torchvision's own pure-Python fallbacks (roi_align taken eagerly, not through its lazily
compiled wrapper, which compiles for minutes on a CPU). A torchvision whose compiled ops
load is left alone.
"""


from __future__ import annotations

import importlib.util
import sys

import torch


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression: indices of the kept boxes, best score first."""
    order = torch.argsort(scores.detach().float(), descending=True, stable=True)
    b = boxes.detach().float()
    keep = []
    while order.numel():
        first, rest = order[0], order[1:]
        keep.append(first)
        lt = torch.max(b[first, :2], b[rest, :2])
        rb = torch.min(b[first, 2:], b[rest, 2:])
        inter = (rb - lt).clamp(min=0).prod(dim=1)
        area = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(dim=1)
        iou = inter / (area[first] + area[rest] - inter)
        order = rest[iou <= iou_threshold]
    return torch.stack(keep) if keep else torch.empty(0, dtype=torch.long)


def load_torchvision() -> None:
    """Import torchvision, with the stand-ins above when its compiled ops do not load."""
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision
        return
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the failed import's half-made modules
    lib = torch.library.Library("torchvision", "DEF")  # kept alive below: the ops live as long as it does
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.impl("nms", nms, "CPU")
    import torchvision
    import torchvision.ops.boxes

    torchvision.ops.boxes._assert_has_ops = lambda: None  # nms: the op above
    roi_align = sys.modules["torchvision.ops.roi_align"]
    roi_align._roi_align = getattr(roi_align._roi_align, "__wrapped__", roi_align._roi_align)
    _LIBRARIES.append(lib)


_LIBRARIES: list[torch.library.Library] = []
