"""MMEngine's ``train_cfg.val_begin`` and ``dynamic_intervals`` as a treadle ``workflow``.

MMEngine's epoch loop validates after epoch ``e`` (counted from 1) when ``e >= val_begin``
and ``e`` is a multiple of the interval in force, or ``e`` is the last epoch. The interval
is ``val_interval`` until the first milestone of ``dynamic_intervals`` (a list of
``(milestone, interval)``) and that milestone's interval from the epoch after it on.
When that differs from validating every ``val_interval`` epochs, the translation
writes those epochs out as a workflow: ``[("train", e1), ("val", 1), ("train", e2 - e1),
("val", 1), ...]``, one pass per validation, as the run does them.

An iteration-based loop validates the same way by iteration, but a treadle workflow's
``("val", k)`` runs k validation iterations there, not a pass: its ``val_begin`` and
``dynamic_intervals`` are refused unless they change nothing.
"""

from __future__ import annotations

import bisect
from typing import Any

from treadle.components.errors import ConfigError, join_path


def _int(value: Any, path: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(path, "not an int", value=value, expected=f"an int >= {low}")
    return value


def _milestones(value: Any, path: str) -> list[tuple[int, int]]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise ConfigError(path, "not a list of (milestone, interval) pairs", value=value, expected="e.g. [(280, 1)]")
    pairs = [(_int(m, join_path(path, i), 0), _int(k, join_path(path, i), 1)) for i, (m, k) in enumerate(value)]
    if [m for m, _ in pairs] != sorted(m for m, _ in pairs):
        raise ConfigError(path, "milestones must increase", value=value)
    return pairs


def validation_points(val_begin: int, pairs: list[tuple[int, int]], val_interval: int, total: int) -> list[int]:
    """The epochs (from 1) after which MMEngine's loop validates."""
    milestones = [0] + [m for m, _ in pairs]
    intervals = [val_interval] + [k for _, k in pairs]
    out = []
    for e in range(1, total + 1):
        interval = intervals[bisect.bisect(milestones, e) - 1]  # MMEngine: bisect on the epoch about to run
        if e >= val_begin and (e % interval == 0 or e == total):
            out.append(e)
    return out


def val_schedule(val_begin: Any, dynamic: Any, val_interval: Any, total: Any, by_epoch: bool,
                 path: str) -> list[tuple[str, int]] | None:
    """The workflow that validates when MMEngine's loop does, or None when the default
    (every ``val_interval`` and after the last) already does."""
    val_begin = _int(val_begin, join_path(path, "val_begin"), 1)
    pairs = _milestones(dynamic, join_path(path, "dynamic_intervals")) if dynamic is not None else []
    if (val_begin <= 1 or (isinstance(val_interval, int) and val_begin <= val_interval)) and not pairs:
        return None  # the first validation is at val_interval anyway
    key = "val_begin" if val_begin > 1 and not pairs else "dynamic_intervals"
    if not by_epoch:
        raise ConfigError(join_path(path, key), "has no treadle equivalent in an iteration-based loop",
                          value=val_begin if key == "val_begin" else dynamic,
                          expected="an epoch-based loop (train_cfg.by_epoch=True), or no " + key)
    interval = _int(val_interval, join_path(path, "val_interval"), 1)
    epochs = _int(total, join_path(path, "max_epochs"), 1)
    workflow: list[tuple[str, int]] = []
    done = 0
    for e in validation_points(val_begin, pairs, interval, epochs):
        workflow += [("train", e - done), ("val", 1)]
        done = e
    if done < epochs:
        workflow.append(("train", epochs - done))
    return workflow


__all__ = ["val_schedule", "validation_points"]
