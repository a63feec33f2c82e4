"""The validation results hooks wait for, checked when the Trainer is built.

``checkpoint=dict(best=...)``, ``EarlyStoppingHook(monitor=...)`` and a
``ReduceOnPlateauLR(monitor=...)`` act on one validation result. What validation can produce
is known before anything runs, from the Trainer's parts:

* each metric ``m`` gives ``val/m`` (or ``val/m/<key>`` when its ``compute()`` returns a dict);
  one that names its results (an MMEngine evaluator) gives ``val/<prefix>/<key>`` for each
  of its metrics' prefixes (``val/accuracy/top1``);
* the evaluation step's losses: a torch loss module as ``loss_fn`` gives ``val/loss``; the
  default step without a ``loss_fn`` gives the entries of the model's output whose names hold
  "loss" (``val/loss``, ``val/loss_cls``...); a model that returns predictions in eval mode
  gives none (torchvision's detection models: their eval output is a list of detections);
* anything, from a ``loss_fn`` of one's own (it may return a dict of any values) or a custom
  evaluation step (``model.val_step(batch, trainer)``, a subclass's ``val_step``); an
  MMEngine model's ``val_step`` feeds the metrics only.

With several validation sets (``val_dataloader={name: loader}``) each of these is logged
under its set: ``val/<set>/acc``, ``val/<set>/loss``.

A key that none of these can produce is refused at once, in one line saying what validation
gives, instead of failing (or, for early stopping, doing nothing) after the first validation.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

from torch import nn

from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.hooks.scheduler import ParamSchedulerHook
from treadle.suggest import did_you_mean

#: What the evaluation step's own values (beside the metrics) can be named.
ANY, LOSSES, NONE = "any", "losses", "none"


def returns_predictions_in_eval(module: nn.Module) -> bool:
    """A model known to return predictions, not losses, in eval mode: torchvision's detection
    models (Faster/Mask/Keypoint R-CNN, RetinaNet, SSD, FCOS)."""
    return type(module).__module__.startswith("torchvision.models.detection.")


def eval_values(module: nn.Module, loss_fn: Any, custom_step: Callable[..., Any] | None,
                mmengine_model: bool) -> tuple[str, str]:
    """``(kind, why)``: which of the evaluation step's own values can come (:data:`ANY`,
    :data:`LOSSES`: names holding "loss", :data:`NONE`) and why, for the message."""
    if custom_step is not None:
        if mmengine_model:
            return NONE, f"{type(module).__name__}'s val_step (an MMEngine model's) feeds the metrics only"
        return ANY, "the custom val_step may log any value"
    if loss_fn is not None:
        if type(loss_fn).__module__ == "torch.nn.modules.loss":
            return LOSSES, f"loss_fn {type(loss_fn).__name__} gives val/loss"
        return ANY, "the loss_fn may return any values"
    if returns_predictions_in_eval(module):
        return NONE, f"without a loss_fn, {type(module).__name__} returns predictions in eval mode, not losses"
    return LOSSES, "without a loss_fn, validation logs the entries of the model's output named with 'loss'"


def may_produce(key: str, metrics: Iterable[str], kind: str, sets: Sequence[str] | None = None) -> bool:
    """Whether validation can produce the result ``key`` (see the module's docstring);
    ``sets``: the validation sets' names, or None for one loader."""
    if not key.startswith("val/"):
        return False
    name = key[len("val/"):]
    if sets is not None:
        head, _, name = name.partition("/")
        if head not in sets or not name:
            return False
    if any(name == m or name.startswith(m + "/") for m in metrics):
        return True
    return kind == ANY or (kind == LOSSES and "loss" in name.lower())


def result_names(metrics: Mapping[str, Any]) -> list[str] | None:
    """The names under ``val/`` that ``metrics`` give: each metric's name, or for a metric that
    names its results itself (``named_results``: an MMEngine evaluator) the prefixes in its
    ``prefixes`` (``accuracy`` for ``accuracy/top1``); None when such a metric may give any
    name (a metric of it without a prefix)."""
    names: list[str] = []
    for name, metric in metrics.items():
        if getattr(metric, "named_results", False) is not True:
            names.append(name)
            continue
        prefixes = getattr(metric, "prefixes", None)
        if not prefixes or any(not isinstance(p, str) or not p for p in prefixes):
            return None
        names += prefixes
    return names


def _watched(hooks: Iterable[Any]) -> list[tuple[str, str]]:
    """``(what, key)`` of every result a hook waits for, ``what`` as the message names it."""
    out = []
    for h in hooks:
        if isinstance(h, CheckpointHook) and h.best not in (None, "auto"):
            out.append((f"checkpoint best={h.best!r}", h.best))
        elif isinstance(h, EarlyStoppingHook):
            out.append((f"EarlyStoppingHook monitor={h.monitor!r}", h.monitor))
        elif isinstance(h, ParamSchedulerHook):
            for scheds in h.schedulers.values():
                for sch in scheds:
                    monitor = getattr(sch, "monitor", None)
                    if getattr(sch, "need_val_args", False) and isinstance(monitor, str):
                        key = monitor if monitor.startswith("val/") else f"val/{monitor}"  # it takes both names
                        out.append((f"{type(sch).__name__} monitor={monitor!r}", key))
    return out


def check_monitored(hooks: Iterable[Any], metrics: Iterable[str] | None, kind: str, why: str,
                    sets: Sequence[str] | None = None) -> None:
    """Refuse, in one line, a hook that waits for a validation result that validation
    never produces (``metrics``: :func:`result_names`, None when a metric may give any name;
    ``kind``, ``why``: :func:`eval_values`; ``sets``: the validation sets' names, or None for
    one loader)."""
    if metrics is None:
        return
    metrics = list(metrics)
    for what, key in _watched(hooks):
        if may_produce(key, metrics, kind, sets):
            continue
        own = [f"{m}" for m in metrics] + (["loss"] if kind == LOSSES else [])
        gives = [f"val/{n}" for n in own] if sets is None else [f"val/{s}/{n}" for s in sets for n in own]
        listed = ", ".join(gives) if gives else "no result"
        if not key.startswith("val/"):
            hint = did_you_mean(f"val/{key}", gives) or " Validation results are named val/<name>."
        else:
            hint = did_you_mean(key, gives)
        at = "val/" if sets is None else "val/<set>/"
        raise ValueError(f"{what}: validation never produces {key!r}: it can give {listed} (a metric as {at}<name>, "
                         f"or {at}<name>/<key> when its compute() returns a dict; {why}).{hint}")


__all__ = ["ANY", "LOSSES", "NONE", "check_monitored", "eval_values", "may_produce", "result_names",
           "returns_predictions_in_eval"]
