"""ParamSchedulerHook: step the parameter schedulers at the right moments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class ParamSchedulerHook(Hook):
    """Steps the schedulers (built by the Trainer, ``{optimizer name: [schedulers]}``): iteration-based ones after
    every iteration whose optimizer step was not skipped by the fp16 GradScaler, ``by_epoch`` ones after every training
    epoch, and ReduceOnPlateau ones with the metrics after every validation (and without,
    after every training epoch, which counts the epochs of their begin/end window).

    With accumulation, iteration-based
    schedulers still step every iteration (MMEngine's rule).

    The hook keeps no state of its own: the schedulers' states are the strategy's, saved
    in the checkpoint's ``param_schedulers`` entry (treadle/strategies/states.py
    SchedulerStates), their one owner.
    """

    priority = Priority.LOW

    def __init__(self, schedulers: dict[str, list[Any]]) -> None:
        self.schedulers = schedulers
        for scheds in schedulers.values():
            for sch in scheds:  # the order is this hook's: no "step before optimizer" warning
                if hasattr(sch, "check_order"):
                    sch.check_order = False
        self._iter_based: list[tuple[Any, Any]] = []  # (optim wrapper, scheduler)
        self._epoch_based: list[Any] = []
        self._on_val: list[Any] = []
        self._skipped: dict[Any, int] = {}  # optim wrapper -> skipped steps seen so far

    def before_train(self, trainer: "RunView") -> None:
        self._iter_based, self._epoch_based, self._on_val = [], [], []
        for name, scheds in self.schedulers.items():
            ow = trainer.optim_wrappers[name]
            for sch in scheds:
                if getattr(sch, "need_val_args", False):
                    self._on_val.append(sch)
                elif getattr(sch, "by_epoch", False):
                    self._epoch_based.append(sch)
                else:
                    self._iter_based.append((ow, sch))
        self._skipped = {ow: ow.skipped_steps for ow in trainer.optim_wrappers.values()}

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        seen = self._skipped
        for ow, sch in self._iter_based:
            if ow.skipped_steps == seen[ow]:  # the optimizer did not skip this step
                sch.step()
        for ow in seen:
            seen[ow] = ow.skipped_steps

    def after_train_epoch(self, trainer: "RunView") -> None:
        for sch in self._epoch_based:
            sch.step()
        for sch in self._on_val:  # counts the epoch for its begin/end window (MMEngine does the same)
            sch.step()

    def after_val_epoch(self, trainer: "RunView", metrics: dict[str, Any]) -> None:
        if not self._on_val:
            return
        # Both "val/acc" and "acc" work as monitor names (MMEngine configs use the latter).
        flat = {**{k.split("/", 1)[-1]: v for k, v in metrics.items()}, **metrics}
        for sch in self._on_val:
            sch.step(flat)
