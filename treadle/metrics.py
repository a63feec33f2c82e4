"""Small built-in metrics with the ``update(outputs, targets) / compute() / reset()``
protocol (torchmetrics objects follow the same protocol and work unchanged).

The protocol: ``update(outputs, targets)`` is called once per evaluation batch with the
model's outputs first and the batch's targets second (torchmetrics' ``update(preds,
target)``), ``compute()`` once per pass, ``reset()`` before each pass. Outputs in a
16-bit float type (the model under ``precision="bf16"`` or ``"16"``) are given as
float32: a metric never loses precision to the autocast dtype (:func:`update_metrics`).
"""

from __future__ import annotations

import re
import sys
from contextvars import ContextVar
from typing import Any, Iterable

import torch
from torch import Tensor, nn

from treadle.hints import metric_error


class Accuracy:
    """Top-k classification accuracy over everything seen since ``reset()``.

    ``outputs`` are logits or scores of shape (N, C); ``targets`` are class indices
    (N,) or one-hot/soft labels (N, C), reduced with argmax. A single output per
    sample, (N,) or (N, 1), is a binary classifier: probabilities in [0, 1] count as 1
    from 0.5, other values as logits (1 from 0), as torchmetrics' BinaryAccuracy does;
    targets are 0/1 of the same number of samples. Counts stay on the device until
    ``compute()``.
    """

    def __init__(self, topk: int = 1) -> None:
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk must be an int >= 1, got {topk!r}")
        self.topk = topk
        self.group: Any = None  # the ranks that read different data (sync_over); None: every process
        self.reset()

    def sync_over(self, layout: Any) -> None:
        """Sum over the data-parallel ranks of ``layout`` (each batch once under tensor
        parallelism): :func:`sync_over` calls it, as the Trainer does for its metrics."""
        self.group = layout.data_object_group

    def reset(self) -> None:
        self.correct: Tensor | int = 0
        self.total = 0

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        if outputs.dim() == 1 or outputs.shape[-1] == 1:
            self._update_binary(outputs.reshape(-1), targets)
            return
        if targets.dim() == outputs.dim():
            targets = targets.argmax(dim=-1)
        if targets.shape != outputs.shape[:-1]:
            raise ValueError(f"Accuracy: outputs of shape {tuple(outputs.shape)} (N, C) need targets of shape "
                             f"{tuple(outputs.shape[:-1])} (class indices) or {tuple(outputs.shape)} (one-hot), "
                             f"got {tuple(targets.shape)}")
        k = min(self.topk, outputs.shape[-1])
        if k == 1:  # argmax: two ops fewer than topk (3 of 8.5 us per update on CPU); ties go to the first class
            hits = outputs.argmax(dim=-1) == targets
        else:
            hits = (outputs.topk(k, dim=-1).indices == targets.unsqueeze(-1)).any(dim=-1)
        self.correct = self.correct + hits.sum()
        self.total += targets.numel()

    def _update_binary(self, scores: Tensor, targets: Tensor) -> None:
        if targets.numel() != scores.numel():
            raise ValueError(f"Accuracy: a binary output of {scores.numel()} values needs as many 0/1 targets, "
                             f"got shape {tuple(targets.shape)}")
        probabilities = ((scores >= 0) & (scores <= 1)).all()  # a tensor: no host read
        predicted = torch.where(probabilities, scores >= 0.5, scores >= 0)
        self.correct = self.correct + (predicted == targets.reshape(-1).bool()).sum()
        self.total += scores.numel()

    def compute(self) -> float:
        """Accuracy over everything seen; with several processes, over every rank's
        samples (each rank evaluates its own share, see treadle/data/distributed.py)."""
        correct = self.correct.item() if isinstance(self.correct, Tensor) else self.correct
        correct, total = sum_over_ranks(correct, self.total, group=self.group)
        if total == 0:
            return float("nan")
        return correct / total

    def state_dict(self) -> dict[str, Any]:
        """The counts so far (read to the host: call it at checkpoints, not per step), so
        that an accumulation interrupted by a checkpoint goes on exactly after a resume."""
        correct = self.correct.detach().cpu() if isinstance(self.correct, Tensor) else torch.tensor(self.correct)
        return {"topk": self.topk, "correct": correct, "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; the counts of an Accuracy with another ``topk`` are refused."""
        if not isinstance(state, dict) or not {"topk", "correct", "total"} <= set(state):
            raise ValueError(f"Accuracy.load_state_dict: expected a dict with topk, correct and total, got {state!r}")
        if state["topk"] != self.topk:
            raise ValueError(f"Accuracy.load_state_dict: the counts are of topk={state['topk']}, this Accuracy has "
                             f"topk={self.topk}")
        self.correct, self.total = state["correct"], int(state["total"])

    def __repr__(self) -> str:
        return f"Accuracy(topk={self.topk})"


# Words in a metric's name that say which way is better (MMEngine infers the same way,
# and refuses to guess for other names). Lower: losses and errors; higher: scores.
_LOWER = {"loss", "err", "error", "errors", "mae", "mse", "rmse", "wer", "cer", "ppl", "perplexity", "nll", "fid",
          "lpips", "eer", "distance"}
_HIGHER = {"acc", "accuracy", "top", "auc", "auroc", "ap", "map", "ar", "iou", "miou", "dice", "mdice", "macc", "aacc",
           "precision", "recall", "f", "fscore", "psnr", "ssim", "bleu", "rouge", "r", "score"}


def higher_is_better(name: str) -> bool | None:
    """Whether a larger value of the metric ``name`` is better, from the words in its
    name (``val/top1_err``: no; ``val/mAP``: yes); None when the name does not say.

    treadle's one rule for this: CheckpointHook's ``best=``, EarlyStoppingHook and
    ``treadle report`` (treadle/report.py) all ask it when no rule is given."""
    words = re.findall(r"[a-z]+", name.lower().rsplit("/", 1)[-1])
    if "loss" in name.lower() or any(w in _LOWER for w in words):
        return False
    if any(w in _HIGHER for w in words):
        return True
    return None


def as_float32(value: Any) -> Any:
    """``value`` with every bfloat16/float16 tensor in it (also inside tuples, lists and
    dicts) as float32; anything else as it is. Reads only dtypes: no device sync."""
    if isinstance(value, Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(as_float32(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(as_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: as_float32(v) for k, v in value.items()}
    return value


def update_metrics(metrics: dict[str, Any], outputs: Any, targets: Any, mode: str, arg: str = "metrics") -> None:
    """``metric.update(outputs, targets)`` for each metric, with 16-bit float outputs as
    float32; a metric's exception leaves with a line saying which metric, what it was
    given and the protocol's argument order (treadle/hints.py). ``mode``: "val", "test",
    "train"; ``arg``: the Trainer argument that holds them ("metrics", "train_metrics")."""
    if not metrics:
        return
    outputs = as_float32(outputs)
    for name, m in metrics.items():
        try:
            m.update(outputs, targets)
        except Exception as e:
            raise metric_error(e, name, outputs, targets, mode, arg)


#: The ranks a metric's compute() reduces over when it names none (:func:`compute`).
_COMPUTING_OVER: ContextVar[Any] = ContextVar("treadle_metrics_group", default=None)


def sum_over_ranks(*values: float, group: Any = None) -> list[float]:
    """Each value summed over the processes (as given, in one process). For metrics whose
    state is counts: call it in ``compute()`` so results cover the whole dataset.

    ``group``: the ranks that saw different data, a layout's ``data_object_group``; under
    tensor parallelism the ranks of one tensor-parallel group see the same batches and
    count once. Without it, inside :func:`compute` (how the Trainer computes every metric)
    the group handed there, else every process. torchmetrics objects reduce by themselves
    (:func:`sync_over` gives them the group)."""
    from treadle.distributed.comm import all_gather_object, is_distributed

    if not is_distributed():
        return list(values)
    per_rank = all_gather_object(values, group=computing_group(group))
    return [sum(r[i] for r in per_rank) for i in range(len(values))]


def computing_group(group: Any = None) -> Any:
    """``group``, or when None the ranks :func:`compute` is reducing over now (None: every
    process): the group a metric's ``compute()`` gathers over when it names none."""
    return group if group is not None else _COMPUTING_OVER.get()


def compute(metric: Any, group: Any = None) -> Any:
    """``metric.compute()``, during which :func:`sum_over_ranks` without a group of its
    own reduces over ``group`` (the layout's ``data_object_group``: a metric of yours
    counts each batch once under tensor parallelism without being told the layout)."""
    token = _COMPUTING_OVER.set(group)
    try:
        return metric.compute()
    finally:
        _COMPUTING_OVER.reset(token)


def sync_over(metric: Any, layout: Any) -> None:
    """Have ``metric`` reduce over the data-parallel ranks of ``layout`` (a
    :class:`~treadle.distributed.layout.ParallelLayout`: ``strategy.layout``) instead of
    every process: a torchmetrics object (and those inside it, e.g. a MetricCollection's)
    through its public ``process_group``, which torchmetrics takes as a constructor
    argument; any other metric through its own ``sync_over(layout)`` when it has one
    (treadle's :class:`Accuracy`; write one for a metric of yours that calls
    :func:`sum_over_ranks`). Others are left as they are."""
    own = getattr(metric, "sync_over", None)
    if callable(own):
        own(layout)
        return
    torchmetrics = sys.modules.get("torchmetrics")  # a torchmetrics object: the package is loaded
    if torchmetrics is None:
        return
    modules = metric.modules() if isinstance(metric, nn.Module) else [metric]
    for m in modules:
        if isinstance(m, torchmetrics.Metric):
            m.process_group = layout.data_group


def place_metrics(metrics: Iterable[Any], device: torch.device, layout: Any) -> None:
    """Metrics where the run's outputs are: torchmetrics objects (modules) moved to
    ``device``; under tensor parallelism (``layout.data_group`` set) each reduces over the
    data-parallel ranks only (:func:`sync_over`), so a batch every tp rank saw counts once."""
    metrics = list(metrics)
    for m in metrics:
        if isinstance(m, nn.Module):
            m.to(device)
    if layout.data_group is not None:
        for m in metrics:
            sync_over(m, layout)


def to_python(value: Any) -> Any:
    """A result as a float (or list): read once per evaluation, never per step."""
    if isinstance(value, Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def result_prefix(prefix: str, name: str, metric: Any) -> str:
    """Where a metric's results are logged: ``<prefix>/<name>`` (``val/acc``), or ``<prefix>``
    alone for a metric whose ``compute()`` names its results itself (``named_results = True``:
    an MMEngine evaluator's ``accuracy/top1`` is logged as ``val/accuracy/top1``)."""
    return prefix if getattr(metric, "named_results", False) is True else f"{prefix}/{name}"


def flatten_results(key: str, value: Any) -> dict[str, Any]:
    """``compute()``'s result under ``key``; a dict (e.g. a torchmetrics
    MetricCollection) becomes ``key/sub`` entries."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten_results(f"{key}/{k}", v))
        return out
    return {key: to_python(value)}


__all__ = ["Accuracy", "as_float32", "compute", "computing_group", "flatten_results", "higher_is_better", "place_metrics",
           "result_prefix", "sum_over_ranks", "sync_over", "to_python", "update_metrics"]
