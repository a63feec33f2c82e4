"""Checkpoints of an earlier format, read as the current one.

Format 1 (the Trainer's checkpoints before each piece of state had one owner) kept the
counters and the data position in ``trainer`` and ``data`` entries; format 2 has one
entry per owner, in two layouts: the Trainer's (model, optim, hooks, loop, results,
strategy) and the Strategy API's (model, optim, param_schedulers, data, extra, strategy).
Format 3 is the one layout: the Strategy API's, with the Trainer's loop, hooks and
results as named parts beside it (treadle/engine/snapshot.py lists them). :func:`migrate`
rewrites a format-1 state, and its rank file's ``rank_state``, into format 2, and a
format-2 Trainer state into format 3 (the schedulers' states, which its hooks entry
held, become ``param_schedulers``; the loop's data place becomes ``data``); anything else
passes through unchanged. Sharded (FSDP) checkpoints of format 1 store the optimizer
shards under other DCP keys and are refused by the strategy with one line (their weights
still load).
"""

from __future__ import annotations

from typing import Any

from treadle.data.resumable import place_of


def is_format_1(state: dict[str, Any]) -> bool:
    """A Trainer checkpoint of format 1: ``trainer`` and ``data`` entries, no ``loop``."""
    return "loop" not in state and isinstance(state.get("trainer"), dict) and isinstance(state.get("data"), dict)


def is_format_2_trainer(state: dict[str, Any]) -> bool:
    """A Trainer checkpoint of format 2: a ``loop`` entry, no ``extra``."""
    return isinstance(state.get("loop"), dict) and "extra" not in state


def migrate(state: dict[str, Any], own: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(state, own)`` in format 3 (``own``: this rank's RNG file, its ``rank_state``
    rewritten too). Nothing in the arguments is changed."""
    if is_format_1(state):
        state, own = format_1_to_2(state, own)
    if is_format_2_trainer(state):
        return trainer_2_to_3(state), own
    return _strategy_1_to_2(state, own)


#: The key of ParamSchedulerHook's state in a format-2 ``hooks`` entry.
SCHEDULER_HOOK = "ParamSchedulerHook"


def trainer_2_to_3(state: dict[str, Any]) -> dict[str, Any]:
    """The strategy's entries added: ``param_schedulers`` (moved from the scheduler hook's
    state: one owner), ``data`` (the loop's place), ``extra``."""
    hooks = dict(state.get("hooks") or {})
    scheds = (hooks.get(SCHEDULER_HOOK) or {}).get("schedulers")
    if isinstance(scheds, dict):
        param_schedulers: Any = scheds["default"] if set(scheds) == {"default"} else dict(scheds)
    else:
        param_schedulers = []
    if SCHEDULER_HOOK in hooks:  # one owner: the strategy's entry
        hooks[SCHEDULER_HOOK] = {k: v for k, v in hooks[SCHEDULER_HOOK].items() if k != "schedulers"}
    loop = state["loop"]
    data = [place_of(loop)] if isinstance(loop.get("seed"), int) else []
    new = {"model": state.get("model"), "optim": state.get("optim"), "param_schedulers": param_schedulers,
           "data": data, "extra": {}, "strategy": state.get("strategy"), "hooks": hooks}
    new.update({k: v for k, v in state.items() if k not in new})
    return new


def _strategy_1_to_2(state: dict[str, Any], own: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    local = own.get("rank_state") if own is not None else None
    if "extra" in state and isinstance(local, dict) and isinstance(local.get("grads"), list):
        # Strategy.save_checkpoint of format 1: the open window's gradients at the top
        return state, {**own, "rank_state": {"optim": {"default": {"grads": local["grads"]}}}}  # type: ignore[dict-item]  # local came from own: not None
    return state, own


def format_1_to_2(state: dict[str, Any], own: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A format-1 Trainer state (and its rank file) in format 2's Trainer layout."""
    trainer, data = state["trainer"], state["data"]
    loop = {"epoch": trainer.get("epoch"), "iter": trainer.get("iter"), "inner_iter": trainer.get("inner_iter"),
            "batch_idx": data.get("batch_idx", 0), "open": bool(data.get("open", False)), "seed": data.get("seed"),
            "batch_size": data.get("batch_size"), "phase": data.get("phase"), "val_due": bool(data.get("val_due")),
            "world_size": int(data.get("world_size", 1))}
    optim, grads = {}, {}
    for name, ow_state in (state.get("optim") or {}).items():
        ow_state = dict(ow_state)
        if "grads" in ow_state:  # the oldest checkpoints kept them here
            grads[name] = ow_state.pop("grads")
        optim[name] = ow_state
    new = {"model": state.get("model"), "optim": optim, "hooks": state.get("hooks", {}), "loop": loop,
           "results": {"metrics": dict(trainer.get("metrics") or {})},
           "strategy": {"run": trainer.get("run"), "world_size": loop["world_size"], "treadle": state.get("treadle")}}
    local = own.get("rank_state") if own is not None else None
    if not isinstance(local, dict):  # before rank files held it: rank 0's copy in state.pt
        local = {"log_windows": trainer.get("log_windows"), "val": data.get("val")}
    per_optim: dict[str, dict[str, Any]] = {}
    for key, short in (("grads", "grads"), ("grad_norms", "grad_norms")):
        for name, value in (local.get(key) or {}).items():
            per_optim.setdefault(name, {})[short] = value
    for name, value in grads.items():  # the oldest: in state.pt
        per_optim.setdefault(name, {}).setdefault("grads", value)
    rank_state = {k: v for k, v in (("log_windows", local.get("log_windows")), ("val", local.get("val")))
                  if isinstance(v, dict)}
    rank_state["optim"] = per_optim
    return new, ({**own, "rank_state": rank_state} if own is not None else None)


__all__ = ["format_1_to_2", "is_format_1", "is_format_2_trainer", "migrate", "trainer_2_to_3"]
