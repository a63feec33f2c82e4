"""What a resume changed: the settings where this run's arguments and the checkpoint's
run differ, each with the value the resumed run goes on with and why.

An exact resume restores the optimizers' state (their hyperparameters with it) and the
data order, so the checkpoint's learning rate, weight decay, betas... and seed are kept
whatever the arguments say; the run's length (``max_epochs``/``max_iters``) and the
loader's batch size are this run's own. The Trainer (treadle/engine/trainer.py) takes
:func:`settings` before it loads a checkpoint and :func:`compare` after, logs one line per
change, and keeps them in ``Trainer.resume_changes``; ``treadle train`` writes the values
used into the run's ``config.yaml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Mapping

# Optimizer options that choose an implementation, not a value the run trains with.
_IMPLEMENTATION = {"params", "param_names", "foreach", "fused", "capturable", "differentiable"}

_KEPT = "an exact resume keeps the optimizer's state; load_from= takes the weights alone"
_SEED = "an exact resume keeps the checkpoint's data order and random states"


@dataclass(frozen=True)
class ResumeChange:
    """One setting that differs: ``key`` as the arguments (and a config file) name it,
    e.g. "optimizer.lr"; ``config``: this run's value; ``saved``: the checkpoint's run's;
    ``used``: the value training goes on with; ``why``: the reason, for a person."""

    key: str
    config: Any
    saved: Any
    used: Any
    why: str

    @property
    def kept_from_checkpoint(self) -> bool:
        """The checkpoint's value is used, not this run's argument."""
        return self.used == self.saved and self.used != self.config

    def line(self) -> str:
        """The log line: the value used first, then the other one, then why."""
        if self.kept_from_checkpoint:
            return (f"resume: {self.key} = {_show(self.used)} from the checkpoint, not {_show(self.config)} "
                    f"as configured: {self.why}")
        return f"resume: {self.key} = {_show(self.used)} as configured (the checkpoint's run had " \
               f"{_show(self.saved)}): {self.why}"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _plain(value: Any) -> Any:
    """A hyperparameter as a comparable plain value (a tensor lr as a float), or None
    for anything that is not a number, a flag or a tuple of numbers."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, Real):
        return float(value) if isinstance(value, float) else value
    if isinstance(value, (list, tuple)) and all(isinstance(v, Real) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def _differ(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) != len(b) or any(_differ(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return not math.isclose(a, float(b), rel_tol=1e-9, abs_tol=0.0)
    return a != b


def optimizer_settings(optim_wrappers: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``{argument prefix: [per param group {name: value}]}``: the hyperparameters each
    optimizer trains with, the optimizer's defaults (its arguments) last. A scheduler's
    ``initial_<name>`` (its base value) stands for ``<name>``, whose current value the
    schedule moves."""
    out = {}
    for name, ow in optim_wrappers.items():
        prefix = "optimizer" if len(optim_wrappers) == 1 else f"optimizer.{name}"
        groups = []
        for group in [*ow.optimizer.param_groups, ow.optimizer.defaults]:
            values = {}
            for k, v in group.items():
                if k in _IMPLEMENTATION or f"initial_{k}" in group:
                    continue
                shown = k[len("initial_"):] if k.startswith("initial_") else k
                plain = _plain(v)
                if plain is not None:
                    values[shown] = plain
            groups.append(values)
        out[prefix] = groups
    return out


def settings(optim_wrappers: Mapping[str, Any], state: Any, batch_size: int | None, seed: int | None) -> dict[str, Any]:
    """This run's settings before a checkpoint is loaded: the optimizers' hyperparameters,
    the run's length, the training loader's batch size and the seed (None: not given)."""
    return {"optim": optimizer_settings(optim_wrappers),
            "max_epochs": state.max_epochs if state.by_epoch else None,
            "max_iters": None if state.by_epoch else state.max_iters,
            "batch_size": batch_size, "seed": seed}


def compare(before: dict[str, Any], optim_wrappers: Mapping[str, Any], position: Mapping[str, Any] | None
            ) -> list[ResumeChange]:
    """The changes between ``before`` (:func:`settings`) and the loaded checkpoint: the
    optimizers as loaded, and the train loop's saved ``position`` (its ``max_epochs``,
    ``max_iters``, ``batch_size`` and ``seed``; absent in older checkpoints: not compared)."""
    changes = []
    loaded = optimizer_settings(optim_wrappers)
    for prefix, (*groups, defaults) in before["optim"].items():
        saved_groups = loaded.get(prefix, [])[:-1]  # (the defaults are not saved: this run's again)
        if len(saved_groups) != len(groups):
            continue  # the checkpoint's own check refuses other group layouts
        found: dict[str, list[int]] = {}
        for i, (mine, saved) in enumerate(zip(groups, saved_groups)):
            for k, v in mine.items():
                if k in saved and _differ(v, saved[k]):
                    found.setdefault(k, []).append(i)
        for k, where in found.items():
            i = where[0]
            # The argument's own name where the group trains with the argument's value.
            as_argument = i == 0 and k in defaults and not _differ(groups[0][k], defaults[k])
            key = f"{prefix}.{k}" + ("" if as_argument else f" (param group {i})")
            more = f" (and {len(where) - 1} more param group(s))" if len(where) > 1 else ""
            saved_value = saved_groups[i][k]
            changes.append(ResumeChange(key, groups[i][k], saved_value, saved_value, _KEPT + more))
    pos = position or {}
    for key in ("max_epochs", "max_iters"):
        mine, saved = before[key], pos.get(key)
        if mine is not None and saved is not None and mine != saved:
            unit = "epoch" if key == "max_epochs" else "iteration"
            changes.append(ResumeChange(key, mine, saved, mine, f"training goes on to {unit} {mine}"))
    mine, saved = before["batch_size"], pos.get("batch_size")
    if isinstance(mine, int) and isinstance(saved, int) and mine != saved:
        why = ("the open epoch goes on after the samples already taken, rounded down to whole batches of "
               f"{mine}" if pos.get("open") else "the next epochs are batched by it")
        changes.append(ResumeChange("train_dataloader.batch_size", mine, saved, mine, why))
    mine, saved = before["seed"], pos.get("seed")
    if mine is not None and saved is not None and mine != saved:
        changes.append(ResumeChange("seed", mine, saved, saved, _SEED))
    return changes


def apply_changes(cfg: dict[str, Any], changes: list[ResumeChange]) -> dict[str, Any]:
    """A copy of the config ``cfg`` with the values a resume kept from the checkpoint
    (what the run uses), where ``cfg`` has the key's parent mapping."""
    import copy

    out = copy.deepcopy(cfg)
    for change in changes:
        if not change.kept_from_checkpoint or " " in change.key:  # "(param group i)": no config key
            continue
        *parents, leaf = change.key.split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[leaf] = list(change.used) if isinstance(change.used, tuple) else change.used
    return out


__all__ = ["ResumeChange", "apply_changes", "compare", "optimizer_settings", "settings"]
