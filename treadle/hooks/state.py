"""The small state object every hook and step can read: counters and last results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TrainState:
    """Where training stands.

    Counters follow detectron2/MMEngine: while an iteration's hooks run, ``iter`` is
    that iteration's 0-based index and ``inner_iter`` its index inside the epoch; they
    are incremented after ``after_train_iter``. ``epoch`` likewise is the index of the
    running epoch and becomes the number of finished epochs after ``after_train_epoch``.
    After ``fit()``, ``iter == max_iters`` and (epoch-based) ``epoch == max_epochs``.
    """

    epoch: int = 0
    iter: int = 0
    inner_iter: int = 0
    max_epochs: int | None = None
    max_iters: int | None = None
    iters_per_epoch: int | None = None  # None for loaders without a length
    by_epoch: bool = True
    mode: str = "idle"  # "train" | "val" | "test" | "idle"
    metrics: dict[str, Any] = field(default_factory=dict)  # last validation/test results
    should_stop: bool = False
    stop_reason: str = ""
    preempted: bool = False  # set with should_stop by a preemption signal
    interrupted: bool = False  # the stop came from Ctrl-C: save, exit 130, no requeue
    # Several processes: a signal only asks; the ranks agree at the iteration boundary.
    preempt_requested: bool = False
    # Host timestamps of the running iteration, set by the loop (perf_counter seconds).
    data_time: float = 0.0
    iter_start_time: float = 0.0

    @property
    def where(self) -> float:
        """Fraction of training done, in [0, 1] (VISSL's ``where``)."""
        if self.max_iters:
            return min(self.iter / self.max_iters, 1.0)
        if self.max_epochs:
            return min(self.epoch / self.max_epochs, 1.0)
        return 0.0

    def position(self) -> str:
        """Where the run is, as messages say it (1-based, see docs/logging.md, "Epochs and
        iterations in messages"): "in epoch 3, iteration 91" is the 91st iteration, in the 3rd epoch."""
        if self.mode == "train":
            return f"in epoch {self.epoch + 1}, iteration {self.iter + 1}"
        what = {"val": "validation", "test": "the test"}.get(self.mode, "the run")
        return f"in {what} (after {self.iter} training iterations)" if self.iter else f"in {what}"

    def set_epoch_length(self, iters_per_epoch: int | None) -> None:
        """Iterations per epoch (None: a loader without a length), and from it ``max_iters``
        (epoch-based) or ``max_epochs`` (iteration-based)."""
        self.iters_per_epoch = iters_per_epoch
        if iters_per_epoch:
            if self.by_epoch:
                self.max_iters = self.max_epochs * iters_per_epoch  # type: ignore[operator]  # by epoch: max_epochs is set
            else:
                self.max_epochs = -(-self.max_iters // iters_per_epoch)  # type: ignore[operator]  # by iteration: max_iters is set

    def request_stop(self, reason: str = "") -> None:
        """Ask the loop to stop cleanly at the next iteration boundary."""
        self.should_stop = True
        self.stop_reason = reason

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of this object: the last validation/test results (the
        counters are the train loop's, saved at an iteration boundary; see treadle/engine/loops.py)."""
        return {"metrics": dict(self.metrics)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.metrics = dict(state.get("metrics") or {})
