"""LogHistory: logged values kept on the host beyond one log record, for statistics over
windows that do not follow the log interval (MMEngine's ``LogProcessor``: ``window_size``
and ``custom_cfg``).

Values arrive once per record, already read from the device in the store's one transfer
(:meth:`treadle.logging.store.MetricStore.flush_values`): nothing here reads a device.
Kept per key: the last ``n`` values (``n`` the largest int window asked for) and, for the
``"epoch"`` and ``"global"`` windows, running sums, counts, maxima and minima since the
epoch's and the run's start. A record's value of a key is a statistic of it:

* ``mean`` over a window: an int (the last that many values, fewer at the start),
  ``"epoch"`` (the values of the epoch's iterations so far; iteration-based training:
  since the run began) or ``"global"`` (since the run began; ``None`` means the same);
* ``max``, ``min`` over a window, as ``mean``;
* ``current``: the last value.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

#: Statistics a key can be logged with.
METHODS = ("mean", "max", "min", "current")
#: Windows that are not a number of values.
NAMED_WINDOWS = ("epoch", "global")


def check_window(window: Any, what: str) -> int | str | None:
    """A window: an int >= 1, "epoch", "global" or None; else a ValueError naming ``what``."""
    if window is None or window in NAMED_WINDOWS:
        return window
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{what}={window!r}; expected an int >= 1 (the last that many values), 'epoch' or 'global'")
    return window


@dataclass(frozen=True)
class Statistic:
    """One extra (or replacing) value of a record: ``name`` = ``method`` of ``key`` over ``window``."""

    key: str
    name: str
    method: str = "mean"
    window: int | str | None = None

    @classmethod
    def parse(cls, spec: Any, where: str) -> "Statistic":
        """From ``{key, name?, method?, window?}`` (``name`` defaults to ``key``: the value replaces it)."""
        if not isinstance(spec, dict) or not isinstance(spec.get("key"), str):
            raise ValueError(f"{where}={spec!r}; expected a mapping such as "
                             "{key: loss, method: mean, window: global, name: loss_global}")
        unknown = sorted(set(spec) - {"key", "name", "method", "window"})
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; expected some of key, name, method, window")
        method = spec.get("method", "mean")
        if method not in METHODS:
            raise ValueError(f"{where}.method={method!r}; expected one of {', '.join(METHODS)}")
        name = spec.get("name", spec["key"])
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name={name!r}; expected a non-empty string")
        return cls(spec["key"], name, method, check_window(spec.get("window"), f"{where}.window"))


class _Running:
    """Sum, count, max and min of the values since a start."""

    __slots__ = ("total", "count", "high", "low")

    def __init__(self) -> None:
        self.total, self.count, self.high, self.low = 0.0, 0, -math.inf, math.inf

    def add(self, values: list[float]) -> None:
        self.total += math.fsum(values)
        self.count += len(values)
        self.high = max(self.high, *values)
        self.low = min(self.low, *values)

    def get(self, method: str) -> float:
        return {"mean": self.total / max(self.count, 1), "max": self.high, "min": self.low}[method]

    def state(self) -> list[float]:
        return [self.total, self.count, self.high, self.low]

    @classmethod
    def of(cls, state: list[float]) -> "_Running":
        r = cls()
        r.total, r.count, r.high, r.low = float(state[0]), int(state[1]), float(state[2]), float(state[3])
        return r


class LogHistory:
    """The values each record's statistics need (see the module docstring).

    Args:
        window: the window of every smoothed key: an int, "epoch", "global", or None (the
            values since the previous record: treadle's default, nothing kept here).
        statistics: :class:`Statistic` specs (dicts), each adding or replacing a value.
        mean_keys: a regular expression: keys it does not match are logged with their last
            value instead of smoothed (MMEngine's ``mean_pattern``); None: every key smoothed.
        by_epoch: whether "epoch" windows restart with each epoch (False: iteration-based
            training, where they run over the whole run, as MMEngine's do).
    """

    def __init__(self, window: int | str | None = None, statistics: list[Any] = (), mean_keys: str | None = None,
                 by_epoch: bool = True) -> None:
        self.window = check_window(window, "LoggerHook window")
        self.statistics = [Statistic.parse(s, f"LoggerHook statistics[{i}]") for i, s in enumerate(statistics)]
        names = [s.name for s in self.statistics]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"LoggerHook statistics name {twice} more than once; give each a different name")
        self.mean_keys = re.compile(mean_keys) if mean_keys is not None else None
        self.by_epoch = by_epoch
        ints = [w for w in [self.window, *(s.window for s in self.statistics)] if isinstance(w, int)]
        self.keep = max(ints, default=1)
        self._last: dict[str, deque[float]] = {}
        self._run: dict[str, _Running] = {}
        self._epoch: dict[str, _Running] = {}
        self._new_epoch = False  # an epoch began since the last add(): its first values may be the last one's

    def start_epoch(self) -> None:
        """An epoch begins: "epoch" windows start over (epoch-based training)."""
        if self.by_epoch:
            self._epoch.clear()
            self._new_epoch = True

    def add(self, values: dict[str, list[float]], epoch_iters: int | None = None) -> None:
        """The values of one record's interval, in order, by key. ``epoch_iters``: the
        epoch's iterations done; after an epoch began, only that many last values are the
        new epoch's (the values of the previous epoch's last iterations, logged only now,
        are not): MMEngine's ``epoch`` window, the last ``batch_idx + 1`` values."""
        for key, vals in values.items():
            if not vals:
                continue
            self._last.setdefault(key, deque(maxlen=self.keep)).extend(vals)
            self._run.setdefault(key, _Running()).add(vals)
            if self._new_epoch and epoch_iters is not None:
                vals = vals[-epoch_iters:]
            self._epoch.setdefault(key, _Running()).add(vals)
        self._new_epoch = False

    def _stat(self, key: str, method: str, window: int | str | None) -> float:
        last = self._last[key]
        if method == "current":
            return last[-1]
        if isinstance(window, int):
            vals = list(last)[-window:]
            return {"mean": math.fsum(vals) / len(vals), "max": max(vals), "min": min(vals)}[method]
        running = self._epoch if window == "epoch" and self.by_epoch else self._run
        return running[key].get(method)

    def values(self, fresh: dict[str, float], keys: list[str]) -> dict[str, float]:
        """A record's values: for each of ``keys`` (those with values this interval) its
        smoothed or last value (``fresh``: the interval's means, used for window None),
        then each statistic whose key has values."""
        out: dict[str, float] = {}
        for key in keys:
            if self.mean_keys is not None and not self.mean_keys.search(key):
                out[key] = self._last[key][-1]
            elif self.window is None:
                out[key] = fresh[key]
            else:
                out[key] = self._stat(key, "mean", self.window)
        for s in self.statistics:
            if s.key in self._last:
                out[s.name] = self._stat(s.key, s.method, "global" if s.window is None else s.window)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"last": {k: list(v) for k, v in self._last.items()},
                "run": {k: r.state() for k, r in self._run.items()},
                "epoch": {k: r.state() for k, r in self._epoch.items()}, "new_epoch": self._new_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last = {k: deque(v, maxlen=self.keep) for k, v in state.get("last", {}).items()}
        self._run = {k: _Running.of(v) for k, v in state.get("run", {}).items()}
        self._epoch = {k: _Running.of(v) for k, v in state.get("epoch", {}).items()}
        self._new_epoch = bool(state.get("new_epoch", False))


__all__ = ["METHODS", "NAMED_WINDOWS", "LogHistory", "Statistic", "check_window"]
