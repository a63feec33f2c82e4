"""ParamSchedulerHook: step the parameter schedulers at the right moments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority
from treadle.optim.scheduler_builder import steps_by_updates

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class ParamSchedulerHook(Hook):
    """Steps the schedulers (built by the Trainer, ``{optimizer name: [schedulers]}``): iteration-based ones after
    every iteration whose optimizer step was not skipped by the fp16 GradScaler, ``by_epoch`` ones after every training
    epoch, and ReduceOnPlateau ones with the metrics after every validation (and without,
    after every training epoch, which counts the epochs of their begin/end window).

    With accumulation, iteration-based
    schedulers still step every iteration (MMEngine's rule).

    Schedulers of timm's protocol (``step_update``/``step``: every ``timm.scheduler``
    class) are stepped as timm's training script steps them: ``step_update(num_updates=n)``
    after each iteration that closed an accumulation window, ``n`` the optimizer updates so
    far (the wrapper's steps, those the fp16 GradScaler skipped included, as timm counts
    them), and ``step(epoch + 1)`` after each training epoch that ran all its batches; the scheduler's
    ``t_in_epochs`` decides which of the two moves its value. ``n`` is part of the
    optimizer wrapper's checkpointed state, so a resumed run goes on with the same values.

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
        self._by_updates: list[tuple[Any, Any]] = []  # (optim wrapper, scheduler of timm's protocol)
        self._skipped: dict[Any, int] = {}  # optim wrapper -> skipped steps seen so far
        self._updates: dict[Any, int] = {}  # optim wrapper -> optimizer updates seen so far

    def before_train(self, trainer: "RunView") -> None:
        self._iter_based, self._epoch_based, self._on_val, self._by_updates = [], [], [], []
        for name, scheds in self.schedulers.items():
            ow = trainer.optim_wrappers[name]
            for sch in scheds:
                if steps_by_updates(sch):
                    self._by_updates.append((ow, sch))
                elif getattr(sch, "need_val_args", False):
                    self._on_val.append(sch)
                elif getattr(sch, "by_epoch", False):
                    self._epoch_based.append(sch)
                else:
                    self._iter_based.append((ow, sch))
        self._skipped = {ow: ow.skipped_steps for ow in trainer.optim_wrappers.values()}
        self._updates = {ow: _updates(ow) for ow, _ in self._by_updates}

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        seen = self._skipped
        for ow, sch in self._iter_based:
            if ow.skipped_steps == seen[ow]:  # the optimizer did not skip this step
                sch.step()
        for ow in seen:
            seen[ow] = ow.skipped_steps
        if self._by_updates:
            updates = self._updates
            for ow, sch in self._by_updates:
                n = _updates(ow)
                if n != updates[ow]:  # a window closed: timm's `num_updates += 1; step_update(num_updates)`
                    sch.step_update(num_updates=n)
            for ow in updates:
                updates[ow] = _updates(ow)

    def after_train_epoch(self, trainer: "RunView") -> None:
        for sch in self._epoch_based:
            sch.step()
        loop = trainer.train_loop
        if loop is None or loop.closing_complete:  # not for an epoch a stop closed early: a resume goes on in it
            for _, sch in self._by_updates:  # timm: `step(epoch + 1)` at the end of each epoch
                sch.step(trainer.state.epoch + 1)
        for sch in self._on_val:  # counts the epoch for its begin/end window (MMEngine does the same)
            sch.step()

    def after_val_epoch(self, trainer: "RunView", metrics: dict[str, Any]) -> None:
        if not self._on_val:
            return
        # Both "val/acc" and "acc" work as monitor names (MMEngine configs use the latter).
        flat = {**{k.split("/", 1)[-1]: v for k, v in metrics.items()}, **metrics}
        for sch in self._on_val:
            sch.step(flat)


def _updates(ow: Any) -> int:
    """The optimizer updates of a wrapper so far, as timm's training script counts them:
    one per closed accumulation window, a step the fp16 GradScaler skipped included."""
    return ow.step_count + ow.skipped_steps
