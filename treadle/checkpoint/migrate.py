"""Checkpoints of an earlier format, read as the current one.

Format 1 (the Trainer's checkpoints before each piece of state had one owner) kept the
counters and the data position in ``trainer`` and ``data`` entries; format 2 has one
entry per owner (treadle/engine/snapshot.py lists them). :func:`migrate` rewrites a format-1
state, and its rank file's ``rank_state``, into format 2; anything else passes through
unchanged. Sharded (FSDP) checkpoints of format 1 store the optimizer shards under other
DCP keys and are refused by the strategy with one line (their weights still load).
"""

from __future__ import annotations

from typing import Any


def is_format_1(state: dict[str, Any]) -> bool:
    """A Trainer checkpoint of format 1: ``trainer`` and ``data`` entries, no ``loop``."""
    return "loop" not in state and isinstance(state.get("trainer"), dict) and isinstance(state.get("data"), dict)


def migrate(state: dict[str, Any], own: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(state, own)`` in format 2 (``own``: this rank's RNG file, its ``rank_state``
    rewritten too). Nothing in the arguments is changed."""
    if not is_format_1(state):
        local = own.get("rank_state") if own is not None else None
        if "extra" in state and isinstance(local, dict) and isinstance(local.get("grads"), list):
            # Strategy.save_checkpoint of format 1: the open window's gradients at the top
            return state, {**own, "rank_state": {"optim": {"default": {"grads": local["grads"]}}}}  # type: ignore[dict-item]
        return state, own
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


__all__ = ["is_format_1", "migrate"]
