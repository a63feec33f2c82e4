"""NaNGuardHook: stop (or skip the step) when training produces non-finite numbers.

Two modes, with different costs:

``mode="raise"`` (default; detectron2's behaviour): a non-finite value among the
step's outputs (the logged losses) raises ``FloatingPointError`` naming the first bad
iteration and every value of that iteration. The hook keeps the (detached, on-device)
outputs of the last ``check_interval`` iterations and checks them all with one host
transfer every ``check_interval`` iterations, at the end of each epoch, before each
validation and at the end of training:

* ``check_interval=1`` (default) costs one host sync per iteration: it raises at the
  bad iteration itself, before any later hook (logger, EMA, checkpoint) sees it. On
  CPU a sync is free; on CUDA it stops the host from queueing the next iteration
  while the device works, which can cost a few percent on small, fast steps.
* ``check_interval=N > 1`` is sync-free between checks (per iteration it only keeps
  a reference to the output tensors). The error still names the first bad iteration
  and its values, read from the kept window, but arrives up to ``N - 1`` iterations
  later, after those further steps have run.
* ``check_interval`` equal to the ``LoggerHook``'s interval (the Trainer's default)
  costs no host transfer of its own: the guard checks the window means the logger
  has just read (already reduced over ranks, so every rank raises together), right
  after that record is written. Only when one of them is non-finite does it read its
  kept window to name the first bad iteration. That window is the step records the
  loop keeps in the metric store for the logger (``MetricStore.pending_steps``), so the
  hook is not called per iteration at all (``next_train_iter``: None).

``mode="skip"``: before each optimizer step, the gradients of ``trainer.module``'s
parameters are checked on the device (one inf-norm per tensor with
``torch._foreach_norm``: NaN and inf survive it and it cannot overflow); if any is
non-finite, every gradient is set to None, so ``optimizer.step()`` leaves every
parameter -- and its momentum or Adam state -- untouched; training goes on.
Deciding to skip is host control flow, so this costs one host sync per optimizer
step (not per micro-batch under accumulation, where a bad micro-batch drops the
whole window). ``self.skipped`` counts the skipped steps, and ``nan_skipped`` (the
running count) joins the log record at each log interval. Under fp16 the
GradScaler already skips non-finite steps (counted as ``skipped_steps``), so the hook
leaves those steps to it. With several optimizers the check covers the whole module.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from treadle.hooks.base import Hook, Priority, every_nth_iter, get_priority
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.hooks.view import RunView

MODES = ("raise", "skip")


class NaNGuardHook(Hook):
    """Raise on (``mode="raise"``) or skip (``mode="skip"``) non-finite training steps.

    Args:
        mode: "raise": ``FloatingPointError`` at the first non-finite loss; "skip":
            no optimizer step when a gradient is non-finite.
        check_interval: raise mode only: check every this many iterations (1: one
            host sync per iteration, exact timing; more: sync-free in between).
    """

    # Before the logger (60), EMA and checkpoint hooks: a bad step raises before
    # anything records it.
    priority = Priority.HIGH

    def __init__(self, mode: str = "raise", check_interval: int = 1) -> None:
        if mode not in MODES:
            raise ValueError(f"NaNGuardHook mode must be one of {MODES}, got {mode!r}")
        if isinstance(check_interval, bool) or not isinstance(check_interval, int) or check_interval < 1:
            raise ValueError(f"check_interval must be an int >= 1, got {check_interval!r}")
        self.mode = mode
        self.check_interval = check_interval
        self.skipped = 0  # optimizer steps skipped (skip mode)
        self._window: list[tuple[int, int, dict[str, Any]]] = []  # (iter, epoch, outputs)
        self._params: list[torch.nn.Parameter] = []
        self._defer_to_scaler = False
        self._log_interval = 50
        self._shared = False  # raise mode checks the logger's reads (see before_train)
        self._checked = -1
        if mode == "raise":  # nothing to do before optimizer steps: not even a call
            self.disabled_points = frozenset({"before_optimizer_step"})

    # -- raise mode ------------------------------------------------------------------
    def before_train(self, trainer: "RunView") -> None:
        from treadle.hooks.logger import LoggerHook

        self._window.clear()
        self._params = [p for p in trainer.module.parameters() if p.requires_grad]
        self._defer_to_scaler = any(ow.scaler is not None for ow in trainer.optim_wrappers.values())
        logger = next((h for h in trainer.hooks if isinstance(h, LoggerHook)), None)
        # nan_skipped must be in the store when the logger flushes it.
        self._log_interval = logger.interval if logger is not None else trainer.log_interval
        self._shared = False
        if (self.mode == "raise" and logger is not None and logger.interval == self.check_interval > 1
                and get_priority(self.priority) < get_priority(logger.priority)):
            # Share the logger's read: the window is the store's step records (the loop
            # records them), checked with the means each flush reads; nothing per iteration.
            logger.add_listener(self._on_log)
            trainer.store.record_outputs = True
            self._shared = True
            self._checked = trainer.state.iter - 1  # the last iteration checked

    def next_train_iter(self, state: Any) -> int | None:
        """Shared raise mode: none (the logger's flush checks); skip mode: the log
        iterations (``nan_skipped``); raise mode of its own: every iteration."""
        if self.mode == "skip":
            return every_nth_iter(state, self._log_interval)
        return None if self._shared else state.iter

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        state = trainer.state
        if self.mode == "raise":
            if self._shared:  # called because another hook is due: the logger's flush checks
                return
            window = self._window
            window.append((state.iter, state.epoch, outputs))
            if len(window) >= self.check_interval:
                self._check(trainer)
            return
        done = state.iter + 1
        if done % self._log_interval == 0 or done == state.max_iters:
            trainer.store.put("nan_skipped", float(self.skipped))

    def after_train_epoch(self, trainer: "RunView") -> None:
        self._check(trainer)

    def before_val(self, trainer: "RunView") -> None:
        self._check(trainer)

    def after_train(self, trainer: "RunView") -> None:
        self._check(trainer)

    def before_save_checkpoint(self, trainer: "RunView", checkpoint: dict[str, Any]) -> None:
        # A checkpoint must not keep weights a non-finite loss already spoiled: check the
        # window now (a save reads the state to the host anyway), and fail before writing.
        if self.mode == "raise":
            self._check(trainer)

    def _on_log(self, trainer: "RunView", values: dict[str, Any]) -> None:
        """The logger's listener: check the window means it read (no transfer of ours).

        The window holds the iterations since the last log or check, all of which the
        logger's flush covered (this hook runs before the logger in each iteration).
        """
        window = self._unchecked(trainer.store.flushed_steps)
        isfinite = math.isfinite
        if not window or all(isfinite(v) for v in values.values() if type(v) is float):
            return  # the usual case: a few floats looked at, nothing else
        keys = {k for _, _, outputs in window for k in outputs}
        bad_keys = sorted(k for k in keys if isinstance(values.get(k), float) and not isfinite(values[k]))
        if not bad_keys:  # e.g. a non-finite grad_norm: not the losses this hook guards
            return
        bad = _first_nonfinite(window)  # the failure path may read the device
        if bad is not None:
            self._raise(window, bad)
        # Every value here is finite, yet the logged mean is not: it was averaged with
        # another rank's non-finite value (or overflowed). Raise on every rank alike.
        shown = {k: values[k] for k in bad_keys}
        raise FloatingPointError(f"Loss became infinite or NaN between iterations {window[0][0] + 1} and "
                                 f"{window[-1][0] + 1} (epoch {window[-1][1] + 1}): the logged means {shown} are non-finite "
                                 "although every value of this process is finite (another process's values, or an overflow)")

    def _unchecked(self, steps: list[tuple[int, int, dict[str, Any]]]) -> list[tuple[int, int, dict[str, Any]]]:
        """Shared mode: the store's step records after the last one checked (marked checked)."""
        checked = self._checked
        window = steps if not steps or steps[0][0] > checked else [r for r in steps if r[0] > checked]
        if window:
            self._checked = window[-1][0]
        return window

    def _check(self, trainer: "RunView") -> None:
        """Raise for the first non-finite iteration in the window (one host transfer)."""
        if self.mode != "raise":
            return
        if self._shared:
            window = self._unchecked(trainer.store.pending_steps())
        else:
            window, self._window = self._window, []
        if not window:
            return
        bad = _first_nonfinite(window)
        if bad is not None:
            self._raise(window, bad)

    @staticmethod
    def _raise(window: list[tuple[int, int, dict[str, Any]]], bad: int) -> None:
        it, epoch, outputs = window[bad]
        values = {k: _to_host(v) for k, v in outputs.items()}
        # 1-based, as every message (the window holds 0-based indices): "iteration=6" is the 6th
        late = "" if window[-1][0] == it else f" (found at the check after iteration {window[-1][0] + 1})"
        raise FloatingPointError(f"Loss became infinite or NaN at iteration={it + 1} (epoch {epoch + 1}){late}!\n"
                                 f"loss_dict = {values}")

    # -- skip mode -----------------------------------------------------------------------
    def before_optimizer_step(self, trainer: "RunView") -> None:
        if self.mode != "skip" or self._defer_to_scaler:
            return
        params = self._params
        grads = [p.grad for p in params if p.grad is not None]
        if not grads or _all_finite(grads):  # the one host sync of skip mode
            return
        for p in params:
            p.grad = None  # a None grad: the optimizer skips the parameter entirely
        self.skipped += 1
        get_logger().warning(f"NaNGuardHook: non-finite gradients at iteration {trainer.state.iter + 1}; "
                             f"optimizer step skipped ({self.skipped} so far)")

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = int(state.get("skipped", 0))

    def __repr__(self) -> str:
        return f"NaNGuardHook(mode={self.mode!r}, check_interval={self.check_interval})"


def _first_nonfinite(window: list[tuple[int, int, dict[str, Any]]]) -> int | None:
    """Index in ``window`` of the first iteration with a non-finite value, or None."""
    tensors: list[Tensor] = []
    owners: list[int] = []
    first_host: int | None = None
    for i, (_, _, outputs) in enumerate(window):
        for v in outputs.values():
            if isinstance(v, Tensor):
                if v.is_floating_point() or v.is_complex():
                    tensors.append(v)
                    owners.append(i)
            elif isinstance(v, float) and not math.isfinite(v) and first_host is None:
                first_host = i
    if not tensors:
        return first_host
    if first_host is None:  # fast path: one small kernel and one transfer when all is well
        try:
            if torch.isfinite(torch.stack(tensors)).all().item():
                return None
        except RuntimeError:  # shapes or devices differ: the detailed path below
            pass
    try:
        if all(t.numel() == 1 for t in tensors):  # the usual case: two small kernels
            finite = torch.isfinite(torch.stack([t.reshape(()) for t in tensors])).tolist()
        else:
            finite = torch.stack([torch.isfinite(t).all() for t in tensors]).tolist()
    except RuntimeError:  # tensors on several devices: one transfer each
        finite = [bool(torch.isfinite(t).all()) for t in tensors]
    bad = [owners[j] for j, ok in enumerate(finite) if not ok]
    candidates = bad[:1] + ([first_host] if first_host is not None else [])
    return min(candidates) if candidates else None


def _to_host(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    return v


def _all_finite(grads: list[Tensor]) -> bool:
    """True when every gradient is finite: one inf-norm per tensor, one sync per device."""
    by_device: dict[torch.device, list[Tensor]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    for gs in by_device.values():
        try:
            norms = torch._foreach_norm(gs, math.inf)
        except (AttributeError, RuntimeError, TypeError):  # private API: keep a fallback
            norms = [torch.linalg.vector_norm(g, math.inf) for g in gs]
        if not bool(torch.isfinite(torch.stack(norms)).all()):
            return False
    return True


__all__ = ["NaNGuardHook"]
