"""LoggerHook: console lines and ``log.jsonl`` records at the log interval."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import JsonlWriter, add_file_handler, get_logger, remove_handler

if TYPE_CHECKING:
    from treadle.trainer import Trainer


class LoggerHook(Hook):
    """Every ``interval`` iterations, reduce the metric store's windows (one host
    transfer) and write a console line and a ``log.jsonl`` record; also write one
    record per validation and test. Per iteration it only appends the step's outputs.

    JSONL fields: ``mode``, ``epoch`` (1-based running epoch), ``iter`` (iterations
    done), ``lr`` (and ``lr/<optimizer>``, ``.../pg<i>`` for more optimizers or param
    groups), the window means of losses and timers, ``eta_s``; for val/test, the
    metrics under ``val/...`` or ``test/...``.
    """

    priority = Priority.BELOW_NORMAL

    def __init__(self, interval: int = 50, jsonl: bool = True, text_log: bool = True) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"log interval must be an int >= 1, got {interval!r}")
        self.interval = interval
        self.jsonl = jsonl
        self.text_log = text_log
        self._writer: JsonlWriter | None = None
        self._handler: Any = None

    def before_run(self, trainer: "Trainer") -> None:
        if trainer.work_dir is None or not trainer.is_main:
            return
        work_dir = Path(trainer.work_dir)
        if self.text_log:
            self._handler = add_file_handler(work_dir / "log.txt")
        if self.jsonl:
            self._writer = JsonlWriter(work_dir / "log.jsonl")

    def after_run(self, trainer: "Trainer") -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._handler is not None:
            remove_handler(self._handler)
            self._handler = None

    def after_train_iter(self, trainer: "Trainer", batch: Any, outputs: Any) -> None:
        pending = trainer.store.pending
        for k, v in outputs.items():
            pending[k].append(v)
        state = trainer.state
        done = state.iter + 1
        if done % self.interval == 0 or done == state.max_iters:
            self._log_train(trainer, done)

    def _log_train(self, trainer: "Trainer", done: int) -> None:
        state = trainer.state
        record: dict[str, Any] = {"mode": "train", "epoch": state.epoch + 1, "iter": done}
        record.update(trainer.learning_rates())
        record.update(self._optim_values(trainer))
        values = trainer.store.flush()  # after the grad norms joined the store: one transfer
        record.update(values)
        per_iter = values.get("data_time", 0.0) + values.get("step_time", 0.0)
        if state.max_iters and per_iter:
            record["eta_s"] = round(per_iter * (state.max_iters - done), 1)
        if self._writer is not None:
            self._writer.write(record)
        if trainer.is_main:
            get_logger().info(_format_train_line(record, state))

    @staticmethod
    def _optim_values(trainer: "Trainer") -> dict[str, Any]:
        """Grad norms (into the store, reduced with the rest) and fp16 scaler figures."""
        out: dict[str, Any] = {}
        single = len(trainer.optim_wrappers) == 1
        for name, ow in trainer.optim_wrappers.items():
            suffix = "" if single else f"/{name}"
            if ow.grad_norms:
                trainer.store.pending["grad_norm" + suffix].extend(ow.grad_norms)
                ow.grad_norms.clear()
            if ow.scaler is not None:
                out["loss_scale" + suffix] = ow.scaler.get_scale()
                out["skipped_steps" + suffix] = ow.skipped_steps
        return out

    def after_val(self, trainer: "Trainer", metrics: dict[str, Any]) -> None:
        self._log_eval(trainer, "val", metrics)

    def after_test(self, trainer: "Trainer", metrics: dict[str, Any]) -> None:
        self._log_eval(trainer, "test", metrics)

    def _log_eval(self, trainer: "Trainer", mode: str, metrics: dict[str, Any]) -> None:
        state = trainer.state
        record = {"mode": mode, "epoch": state.epoch, "iter": state.iter, **metrics}
        if self._writer is not None:
            self._writer.write(record)
        if trainer.is_main:
            shown = "  ".join(f"{k} {_fmt(v)}" for k, v in metrics.items())
            get_logger().info(f"{mode} (epoch {state.epoch}, iter {state.iter})  {shown}")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e-3 or abs(v) >= 1e4 else f"{v:.4f}"
    return str(v)


def _format_train_line(record: dict[str, Any], state: Any) -> str:
    head = f"epoch {record['epoch']}"
    if state.max_epochs:
        head += f"/{state.max_epochs}"
    head += f"  iter {record['iter']}"
    if state.max_iters:
        head += f"/{state.max_iters}"
    skip = {"mode", "epoch", "iter", "eta_s"}
    parts = [f"{k} {_fmt(v)}" for k, v in record.items() if k not in skip]
    if "eta_s" in record:
        parts.append(f"eta {datetime.timedelta(seconds=int(record['eta_s']))}")
    return head + "  " + "  ".join(parts)
