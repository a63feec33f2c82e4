"""A tensor-parallel plan of the user's that contradicts the model's own: a module the
model's plan (a Hugging Face model's ``tp_plan``) gives one style and the user's
``tp_plan=`` another. Both may run, and train wrong without a word: Phi-3's fused
``mlp.gate_up_proj`` under plain ``colwise`` keeps its output split, while the model
chunks it as if whole (its own plan says ``colwise_gather_output``). Said in one warning,
naming the modules and both styles; the user's plan is applied as given."""

from __future__ import annotations

import re
from typing import Any

from torch import nn

#: Style names that mean the same layout (treadle/strategies/tensor_parallel.py STYLES).
_SAME = {"colwise_rep": "colwise_gather_output", "rowwise_rep": "rowwise_split_input", "local": "replicate"}


def _by_module(model: nn.Module, plan: dict[str, Any]) -> dict[str, str]:
    """The style name each module of ``model`` gets from ``plan`` (styles given as objects left out)."""
    names = [name for name, _ in model.named_modules() if name]
    out: dict[str, str] = {}
    for pattern, style in plan.items():
        if not isinstance(pattern, str) or not isinstance(style, str):
            continue
        rx = re.compile(r"[^.]+".join(re.escape(part) for part in pattern.split("*")))
        for name in names:
            if rx.fullmatch(name):
                out[name] = _SAME.get(style, style)
    return out


def contradictions(model: nn.Module, plan: dict[str, Any], own: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(module pattern, the user's style, the model's style)`` where ``plan`` and the
    model's ``own`` plan differ, one per module name with its layer numbers as ``*``."""
    mine, theirs = _by_module(model, plan), _by_module(model, own)
    found: dict[str, tuple[str, str, str]] = {}
    for name, style in mine.items():
        if name in theirs and theirs[name] != style:
            generic = re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", name)
            found.setdefault(generic, (generic, style, theirs[name]))
    return list(found.values())


def warn_if_contradicting(model: nn.Module, plan: dict[str, Any]) -> str | None:
    """Warn (once, on rank 0) when the user's ``plan`` gives a module a style other than the
    model's own plan does; the warning's text, or None."""
    from treadle.strategies.tensor_parallel import model_plan

    try:
        own = model_plan(model)
    except ValueError:  # the model has no plan of its own: nothing to contradict
        return None
    found = contradictions(model, plan, own)
    if not found:
        return None
    shown = "; ".join(f"{name}: {mine!r} where the model's plan says {theirs!r}" for name, mine, theirs in found[:4])
    more = f" (and {len(found) - 4} more)" if len(found) > 4 else ""
    text = (f"tp_plan contradicts {type(model).__name__}'s own tensor-parallel plan: {shown}{more}; applied as given, "
            "but a fused projection split without its output gathered trains wrong without an error (tp_plan='auto' "
            "takes the model's plan)")
    from treadle.distributed import comm
    from treadle.logging.writers import get_logger

    if comm.get_rank() == 0:
        get_logger().warning(text)
    return text


__all__ = ["contradictions", "warn_if_contradicting"]
