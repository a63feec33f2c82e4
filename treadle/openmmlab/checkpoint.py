"""MMEngine's ``CheckpointHook`` options about the best checkpoint and where checkpoints go.

=======================================  ===================================================
MMEngine                                 treadle
=======================================  ===================================================
``save_best: coco/bbox_mAP``             ``best: val/coco/bbox_mAP``: MMEngine names an
                                         evaluator's result, treadle the validation result
                                         (``val/<metric name>[/<key>]``); a name already
                                         starting with ``val/`` is kept. A name that none of
                                         the config's ``metrics`` (the evaluators' stand-ins)
                                         produces, nor a loss, is refused when the config
                                         loads. A list of one name: that name; of several:
                                         refused (treadle keeps the best of one result)
``save_best: auto``                      ``best: auto``
``rule`` absent                          ``rule`` as MMEngine infers it: the name (case
                                         ignored) equal to, then holding, one of
                                         ``greater_keys`` (greater), then of ``less_keys``
                                         (less); MMEngine 0.10.7's lists by default; a name
                                         neither decides: refused, as MMEngine does
``greater_keys`` / ``less_keys``         used for that inference, then dropped; with
                                         ``save_best: auto`` and no ``rule``: refused
                                         (MMEngine applies them to the metric it picks at
                                         the first validation, treadle infers from its name)
``out_dir`` (not null)                   refused: treadle writes checkpoints to
                                         ``work_dir/checkpoints``
=======================================  ===================================================
"""

from __future__ import annotations

from typing import Any

from treadle.components.errors import ConfigError, did_you_mean, join_path
from treadle.engine.monitored import LOSSES, may_produce

#: MMEngine 0.10.7's ``CheckpointHook._default_greater_keys`` and ``_default_less_keys``.
MMENGINE_GREATER_KEYS = ("acc", "top", "AR@", "auc", "precision", "mAP", "mDice", "mIoU", "mAcc", "aAcc")
MMENGINE_LESS_KEYS = ("loss",)


def mmengine_rule(name: str, greater: tuple[str, ...], less: tuple[str, ...]) -> str | None:
    """``"greater"`` / ``"less"`` as MMEngine's CheckpointHook infers it for ``name``, or None."""
    low = name.lower()
    greater_lc, less_lc = {k.lower() for k in greater}, {k.lower() for k in less}
    if low in greater_lc:
        return "greater"
    if low in less_lc:
        return "less"
    if any(k in low for k in greater_lc):
        return "greater"
    if any(k in low for k in less_lc):
        return "less"
    return None


def _keys(value: Any, path: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(k, str) for k in value):
        raise ConfigError(path, "not a list of metric name parts", value=value, expected="e.g. [acc, mAP]")
    return tuple(value)


def _one(value: Any, path: str, what: str) -> Any:
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ConfigError(path, f"treadle keeps the best checkpoints of one {what}", value=value,
                              expected=f"one {what}")
        return value[0]
    return value


def translate_best(ck: dict[str, Any], path: str, cfg: dict[str, Any]) -> None:
    """Edit ``ck`` (the CheckpointHook's options, renamed: ``best``, ``rule`` as written,
    ``out_dir``, ``greater_keys``, ``less_keys``) into treadle's ``checkpoint`` (see the
    module's table); ``cfg`` is the config being translated (its ``metrics`` and
    ``val_dataloader``); ``path`` the hook's key in the file."""
    out_dir = ck.pop("out_dir", None)
    if out_dir is not None:
        raise ConfigError(join_path(path, "out_dir"), "option has no treadle equivalent", value=out_dir,
                          expected="no out_dir: treadle writes checkpoints to work_dir/checkpoints (set work_dir to "
                                   "move the whole run, logs included)")
    greater = _keys(ck.pop("greater_keys", None), join_path(path, "greater_keys"))
    less = _keys(ck.pop("less_keys", None), join_path(path, "less_keys"))
    best = _one(ck.get("best"), join_path(path, "save_best"), "metric")
    rule = _one(ck.get("rule"), join_path(path, "rule"), "rule")
    if best is None:
        ck.pop("best", None)
        return
    if not isinstance(best, str) or not best:
        raise ConfigError(join_path(path, "save_best"), "not a metric name", value=best, expected="e.g. accuracy/top1")
    if best == "auto":
        if rule is None and (greater is not None or less is not None):
            which = "greater_keys" if greater is not None else "less_keys"
            raise ConfigError(join_path(path, which), "decides the rule of the result save_best: auto picks at the "
                              "first validation, which treadle infers from that result's name", value=greater or less,
                              expected="rule: greater or less, or save_best naming the metric")
        ck["best"] = best
        return
    if rule is None:
        rule = mmengine_rule(best, greater or MMENGINE_GREATER_KEYS, less or MMENGINE_LESS_KEYS)
        if rule is None:
            raise ConfigError(join_path(path, "save_best"), "cannot infer whether higher or lower is better (as "
                              "MMEngine cannot)", value=best, expected="a rule: greater or less")
    key = best if best.startswith("val/") else f"val/{best}"
    ck["best"], ck["rule"] = key, rule
    if cfg.get("val_dataloader") is not None and cfg.get("val_evaluator") is None:  # an evaluator's: once built
        metrics = list(cfg.get("metrics") or {})
        if not may_produce(key, metrics, LOSSES):
            gives = [f"val/{m}" for m in metrics]
            raise ConfigError(join_path(path, "save_best"), f"no evaluator produces this result ({key})", value=best,
                              expected=f"a result of the config's metrics ({', '.join(gives) or 'none'}: save_best "
                                       "names `acc` for val/acc, or `coco/bbox_mAP` for val/coco/bbox_mAP from a "
                                       "metric `coco` whose compute() returns a dict), a loss, or auto",
                              hint=did_you_mean(key, gives))


__all__ = ["MMENGINE_GREATER_KEYS", "MMENGINE_LESS_KEYS", "mmengine_rule", "translate_best"]
