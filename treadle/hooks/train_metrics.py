"""Training-time metrics: ``Trainer(train_metrics={name: metric})``.

The metrics follow the protocol of ``metrics=`` (``update(outputs, targets)``,
``compute()``, ``reset()``; torchmetrics objects as they are, see treadle/metrics.py).
Three parts, each with one job:

* the train step feeds them: the default step (treadle/engine/step.py, chosen once when
  ``train_metrics`` is given) calls :meth:`TrainMetrics.update` with each batch's
  outputs and targets, detached, as float32 and outside autocast; a custom step calls
  ``trainer.update_train_metrics(outputs, targets)``. An update stays on the device:
  no host read, no sync.
* :class:`TrainMetricsHook` gives ``compute()`` of each one to the LoggerHook's train
  record as ``train/<name>`` (its ``sources``), so the values are read at the log
  interval only, on every rank at once (``compute()`` of ``treadle.Accuracy`` or of a
  torchmetrics object sums over the ranks itself); and it resets them: after each
  record (``reset="interval"``, the default: a record's value covers the iterations of
  its window, as the loss beside it) or when an epoch starts (``reset="epoch"``: a
  running value over the epoch so far).
* :class:`TrainMetrics` owns their accumulated state in checkpoints, per rank (each rank
  counts its own samples: ``rank_states["train_metrics"]`` in treadle/engine/snapshot.py), so a
  run resumed inside an interval logs what the uninterrupted run logs. A metric is saved
  through its ``state_dict()`` / ``load_state_dict()``; a torchmetrics object's states
  are not in its ``state_dict()`` by default, so :class:`TrainMetrics` calls its
  ``persistent(True)``. A metric with neither starts over after a resume (said once at
  construction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import torch
from torch import nn

from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger
from treadle.metrics import compute, flatten_results, update_metrics

if TYPE_CHECKING:
    from treadle.hooks.view import RunView

#: When train metrics start over: after each log record, or when an epoch starts.
RESETS = ("interval", "epoch")


def check_reset(reset: Any) -> str:
    """``train_metrics_reset``: one of :data:`RESETS`."""
    if reset not in RESETS:
        raise ValueError(f"train_metrics_reset={reset!r}; expected 'interval' (start over after each log record) "
                         "or 'epoch' (start over when an epoch starts)")
    return reset


def _stateful(metric: Any) -> bool:
    return callable(getattr(metric, "state_dict", None)) and callable(getattr(metric, "load_state_dict", None))


def _copied(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return type(value)((k, _copied(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(v) for v in value)
    return value


class TrainMetrics:
    """The training metrics by name, fed each iteration and owning their state per rank.

    Args:
        metrics: ``{name: metric}`` (checked by the Trainer).
        reset: "interval" or "epoch" (see the module docstring).
    """

    def __init__(self, metrics: Mapping[str, Any], reset: str = "interval") -> None:
        self.metrics = dict(metrics)
        self.reset_every = check_reset(reset)
        self.updates = 0  # update() calls since the last reset: a Python int, no device read
        self.unsaved: list[str] = []  # metrics without state_dict/load_state_dict
        for name, m in self.metrics.items():
            persistent = getattr(m, "persistent", None)
            if isinstance(m, nn.Module) and callable(persistent):
                persistent(True)  # torchmetrics: the states join state_dict()
            if not _stateful(m):
                self.unsaved.append(name)
        if self.unsaved:
            get_logger().warning(f"train_metrics {self.unsaved} have no state_dict()/load_state_dict(): their "
                                 "counts are not checkpointed, so after a resume they cover only the iterations "
                                 "run since")

    def to(self, device: torch.device) -> "TrainMetrics":
        """Metrics that are modules (torchmetrics) go to the training device."""
        for m in self.metrics.values():
            if isinstance(m, nn.Module):
                m.to(device)
        return self

    def update(self, outputs: Any, targets: Any) -> None:
        """Feed every metric one batch: 16-bit float outputs as float32, without autograd;
        a metric's error says which one and what it was given (treadle/hints.py)."""
        with torch.no_grad():
            update_metrics(self.metrics, outputs, targets, "train", "train_metrics")
        self.updates += 1

    def compute(self, group: Any = None) -> dict[str, Any]:
        """``{"train/<name>": value}`` (a dict result gives ``train/<name>/<key>``); reads
        the device, and with several processes each metric reduces over the ranks: call
        it on every rank at once. ``group``: the ranks that read different batches (the
        layout's ``data_object_group``), for metrics that reduce with ``sum_over_ranks``."""
        out: dict[str, Any] = {}
        for name, m in self.metrics.items():
            out.update(flatten_results(f"train/{name}", compute(m, group)))
        return out

    def reset(self) -> None:
        for m in self.metrics.values():
            m.reset()
        self.updates = 0

    # -- Stateful: this rank's accumulated state (treadle/engine/snapshot.py) ------------------
    def state_dict(self) -> dict[str, Any]:
        """Each metric's ``state_dict()``, its tensors copied: a metric that resets in place
        cannot change a checkpoint still being written."""
        return {"updates": self.updates, "reset": self.reset_every,
                "metrics": {name: _copied(m.state_dict()) for name, m in self.metrics.items()
                            if name not in self.unsaved}}

    def check_state_dict(self, state: Any) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("metrics"), dict):
            from treadle.checkpoint.io import CheckpointError

            raise CheckpointError(f"the checkpoint's train_metrics state is {type(state).__name__}, not a dict "
                                  "with a 'metrics' dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each metric takes its saved state; one the checkpoint lacks (added since)
        starts empty, and says so."""
        saved = state["metrics"]
        fresh = []
        for name, m in self.metrics.items():
            if name in self.unsaved:
                m.reset()
            elif name in saved:
                m.load_state_dict(saved[name])
            else:
                m.reset()
                fresh.append(name)
        if fresh:
            get_logger().warning(f"train_metrics {fresh}: not in the checkpoint; they start empty")
        self.updates = int(state.get("updates", 0))


class TrainMetricsHook(Hook):
    """Logs the train metrics with each train record and resets them (see the module
    docstring). Added by the Trainer when ``train_metrics`` is given."""

    priority = Priority.NORMAL

    def __init__(self, metrics: TrainMetrics) -> None:
        self.metrics = metrics
        self._resumed = False
        self._warned = False

    def before_run(self, trainer: "RunView") -> None:
        from treadle.hooks.logger import LoggerHook

        loggers = [h for h in trainer.hooks if isinstance(h, LoggerHook)]
        if not loggers:
            get_logger().warning("train_metrics: there is no LoggerHook, so they are never logged")
        for logger in loggers:
            logger.add_source(self.log_values)

    def after_load_checkpoint(self, trainer: "RunView", checkpoint: dict[str, Any]) -> None:
        self._resumed = True  # the state loaded with it goes on

    def before_train(self, trainer: "RunView") -> None:
        resumed, self._resumed = self._resumed, False
        if not resumed:
            self.metrics.reset()

    def before_train_epoch(self, trainer: "RunView") -> None:
        # A resumed open epoch is reopened with its batches done counted in inner_iter.
        if self.metrics.reset_every == "epoch" and trainer.state.inner_iter == 0:
            self.metrics.reset()

    def log_values(self, trainer: "RunView") -> dict[str, Any]:
        """The LoggerHook's source: the values for this train record (every rank)."""
        m = self.metrics
        if m.updates == 0 and not self._warned and trainer.is_main:
            self._warned = True
            get_logger().warning("train_metrics were not updated since they last started over: a model.train_step "
                                 "(or Trainer.train_step override) feeds them with "
                                 "trainer.update_train_metrics(outputs, targets)")
        values = m.compute(trainer.strategy.layout.data_object_group)
        if m.reset_every == "interval":
            m.reset()
        return values


__all__ = ["RESETS", "TrainMetrics", "TrainMetricsHook", "check_reset"]
