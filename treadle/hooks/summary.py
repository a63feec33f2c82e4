"""ModelSummaryHook and ``model_summary``: parameters per module, as a table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


def _numel(p: nn.Parameter) -> int:
    # Lazy modules' parameters have no size until the first forward: count them as 0.
    if isinstance(p, nn.parameter.UninitializedParameter):
        return 0
    whole = getattr(p, "ds_numel", None)  # a DeepSpeed ZeRO-3 partition: its local tensor is a placeholder
    return int(whole) if isinstance(whole, int) else p.numel()


def _counts(module: nn.Module) -> tuple[int, int]:
    """(all, trainable) parameters of ``module`` and its children; shared ones once."""
    total = trainable = 0
    for p in module.parameters():  # parameters() already yields a shared tensor once
        n = _numel(p)
        total += n
        if p.requires_grad:
            trainable += n
    return total, trainable


def model_summary(module: nn.Module, max_depth: int = 2) -> str:
    """A table of the submodules up to ``max_depth`` levels deep (name, type,
    parameters including their children's, trainable ones) and the totals.

    ``max_depth=0`` gives the totals only. Lazy parameters not yet materialised
    count as 0.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be an int >= 0, got {max_depth!r}")
    rows: list[tuple[str, str, str, str]] = []
    for name, sub in module.named_modules():
        depth = name.count(".") + 1 if name else 0
        if 1 <= depth <= max_depth:
            total, trainable = _counts(sub)
            label = "  " * (depth - 1) + name  # indented by depth, full name kept for grep
            rows.append((label, type(sub).__name__, f"{total:,}", f"{trainable:,}"))
    total, trainable = _counts(module)
    size_mb = sum(_numel(p) * p.element_size() for p in module.parameters()) / 2**20
    header = ("name", "type", "params", "trainable")
    lines: list[str] = []
    if rows:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]

        def fmt(r: tuple[str, str, str, str]) -> str:
            return f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"

        lines += [fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows), ""]
    lines += [f"{type(module).__name__}: {total:,} parameters ({trainable:,} trainable, "
              f"{total - trainable:,} frozen), {size_mb:.2f} MiB"]
    return "\n".join(lines)


class ModelSummaryHook(Hook):
    """Log :func:`model_summary` of the trainer's model once, at the first run.

    Args:
        max_depth: module levels shown (1: the model's direct children).
    """

    priority = Priority.LOW

    def __init__(self, max_depth: int = 2) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
            raise ValueError(f"max_depth must be an int >= 0, got {max_depth!r}")
        self.max_depth = max_depth
        self._done = False

    def before_run(self, trainer: "RunView") -> None:
        if self._done or not trainer.is_main:
            return
        self._done = True
        # trainer.module: the user's model, not a DDP or compiled wrapper.
        get_logger().info("model summary:\n" + model_summary(trainer.module, self.max_depth))


__all__ = ["ModelSummaryHook", "model_summary"]
