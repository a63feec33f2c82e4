"""CheckpointHook: periodic, last-N, best-K and final checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.checkpoint.io import prune_checkpoints, remove_checkpoint, save_checkpoint
from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.trainer import Trainer


class CheckpointHook(Hook):
    """Save the complete training state so a run can resume exactly.

    Args:
        interval: save every ``interval`` epochs (``by_epoch=True``) or iterations;
            None: no periodic saves (the default hook: only the final save).
        by_epoch: epochs or iterations. Epoch checkpoints are taken in
            ``after_train_epoch`` (after the epoch's scheduler steps), iteration ones
            in ``after_train_iter``; both resume exactly (see treadle/snapshot.py).
        keep: keep the last ``keep`` periodic checkpoints (None or 0: keep all).
        best: a validation metric such as "val/acc": also keep the ``keep_best`` best
            weights (model and EMA, not the full state) under ``checkpoints/best/``.
        rule: "max" or "min" for ``best``; default: "min" when the name contains
            "loss", else "max".
        save_last: save when training ends.
    Checkpoints go to ``work_dir/checkpoints/{epoch_0003,iter_00000120}/``.
    Priority VERY_LOW: hooks with a larger number run after the save.
    """

    priority = Priority.VERY_LOW

    def __init__(self, interval: int | None = 1, by_epoch: bool = True, keep: int | None = 3, best: str | None = None,
                 rule: str | None = None, keep_best: int = 1, save_last: bool = True) -> None:
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
            raise ValueError(f"checkpoint interval must be an int >= 1 or None, got {interval!r}")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            raise ValueError(f"checkpoint keep must be an int >= 0 or None, got {keep!r}")
        if rule not in (None, "max", "min"):
            raise ValueError(f"checkpoint rule must be 'max' or 'min', got {rule!r}")
        if isinstance(keep_best, bool) or not isinstance(keep_best, int) or keep_best < 1:
            raise ValueError(f"checkpoint keep_best must be an int >= 1, got {keep_best!r}")
        self.interval = interval
        self.by_epoch = by_epoch
        self.keep = keep
        self.best = best
        self.rule = rule or ("min" if best and "loss" in best else "max")
        self.keep_best = keep_best
        self.save_last = save_last
        if by_epoch or not interval:  # nothing to do per iteration: not even a call
            self.disabled_points = frozenset({"after_train_iter"})
        if best is None:
            self.disabled_points = self.disabled_points | {"after_val_epoch"}
        self.best_records: list[tuple[float, str]] = []  # (value, path), best first
        self.last_saved: str | None = None

    # -- when ------------------------------------------------------------------------
    def after_train_iter(self, trainer: "Trainer", batch: Any, outputs: Any) -> None:
        if not self.by_epoch and self.interval and (trainer.state.iter + 1) % self.interval == 0:
            self._save_periodic(trainer, f"iter_{trainer.state.iter + 1:08d}")

    def after_train_epoch(self, trainer: "Trainer") -> None:
        if self.by_epoch and self.interval and (trainer.state.epoch + 1) % self.interval == 0:
            self._save_periodic(trainer, f"epoch_{trainer.state.epoch + 1:04d}")

    def after_train(self, trainer: "Trainer") -> None:
        if self.save_last and not trainer.state.preempted:
            s = trainer.state
            name = f"epoch_{s.epoch:04d}" if self.by_epoch and s.by_epoch else f"iter_{s.iter:08d}"
            self._save_periodic(trainer, name)

    def after_val_epoch(self, trainer: "Trainer", metrics: dict[str, Any]) -> None:
        if self.best is None or trainer.state.mode != "val" or trainer.work_dir is None:
            return
        if self.best not in metrics:
            raise KeyError(f"checkpoint best={self.best!r} is not among the validation results {sorted(metrics)}")
        value = float(metrics[self.best])
        if math.isnan(value):
            return
        sign = -1.0 if self.rule == "max" else 1.0
        ranked = sorted([*self.best_records, (value, "")], key=lambda r: sign * r[0])
        if ranked.index((value, "")) >= self.keep_best:
            return
        s = trainer.state
        metric = self.best.replace("/", "_")
        path = trainer.work_dir / "checkpoints" / "best" / f"best_{metric}_{s.iter:08d}"
        if trainer.is_main:
            weights = {"model": trainer.module.state_dict()}
            if trainer.ema is not None:
                weights["ema"] = trainer.ema.state_dict()
            save_checkpoint(path, {"state.pt": weights}, meta={"iter": s.iter, "epoch": s.epoch, self.best: value})
        self.best_records = sorted([*self.best_records, (value, str(path))], key=lambda r: sign * r[0])
        for _, old in self.best_records[self.keep_best:]:
            if trainer.is_main and Path(old).exists():
                remove_checkpoint(old)
        self.best_records = self.best_records[: self.keep_best]
        get_logger().info(f"best {self.best} = {value:.6g}: saved {path}")

    # -- how -------------------------------------------------------------------------
    def _save_periodic(self, trainer: "Trainer", name: str) -> None:
        if trainer.work_dir is None:
            return
        if self.last_saved == name:  # e.g. the final save right after a periodic one
            return
        self.last_saved = name  # before saving: the hook state goes into the checkpoint
        path = trainer.save_checkpoint(trainer.work_dir / "checkpoints" / name)
        if trainer.is_main and self.keep:
            prune_checkpoints(trainer.work_dir / "checkpoints", keep_last=self.keep)
        get_logger().info(f"saved checkpoint {path}")

    def state_dict(self) -> dict[str, Any]:
        return {"best_records": [list(r) for r in self.best_records], "last_saved": self.last_saved}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_records = [(float(v), str(p)) for v, p in state.get("best_records", [])]
        self.last_saved = state.get("last_saved")
