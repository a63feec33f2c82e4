"""What ``treadle train CONFIG --nproc N`` checks of a config before it starts any process:
what would otherwise fail in every process at once, after they started. The strategy is
built (its options checked, nothing set up), its device mesh is fitted to the ``N``
processes, and a ``tp`` must divide the attention heads the model's config names (its
``config:`` values, or the ``config.json`` of its ``pretrained:`` directory). Each
refusal is one :class:`~treadle.components.errors.ConfigError` line, status 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treadle.components.errors import ConfigError

#: The model config keys that count attention heads, which each tensor-parallel rank takes whole.
HEAD_KEYS = ("num_attention_heads", "num_key_value_heads")


def check_launch(cfg: dict[str, Any], nproc: int) -> None:
    """Refuse a config that cannot run on ``nproc`` processes (see the module docstring)."""
    spec = cfg.get("strategy")
    if spec is None or (isinstance(spec, str) and spec in ("auto", "single")):
        return
    from treadle.strategies.build import resolve_strategy

    try:
        strategy = resolve_strategy(spec)
    except (ValueError, TypeError, ModuleNotFoundError) as e:
        raise ConfigError("strategy", str(e)) from None
    shape = getattr(strategy, "shape", None)  # the FSDP strategy's mesh: replicas x shards x tp
    if shape is None:
        return
    try:
        shape = shape.resolve(nproc, nproc)
    except ValueError as e:
        raise ConfigError("strategy", f"{e} (--nproc {nproc})") from None
    if shape.tp > 1:
        for key, heads in named_heads(cfg.get("model")):
            if heads % shape.tp:
                raise ConfigError(key, f"strategy tp={shape.tp} does not divide it; each tensor-parallel rank "
                                  "computes whole heads", value=heads, expected="a tp that divides the heads")


def named_heads(model: Any) -> list[tuple[str, int]]:
    """``(where, count)`` of the attention heads a model spec names: its ``config:`` values,
    else its ``pretrained:`` directory's ``config.json`` (none for any other model)."""
    if not isinstance(model, dict):
        return []
    values = model.get("config")
    if isinstance(values, dict):
        found = [(f"model.config.{k}", values[k]) for k in HEAD_KEYS if _count(values.get(k))]
        if found:
            return found
    pretrained = model.get("pretrained")
    if isinstance(pretrained, (str, Path)):
        path = Path(pretrained) / "config.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        if isinstance(data, dict):
            return [(f"model.pretrained ({path}) {k}", data[k]) for k in HEAD_KEYS if _count(data.get(k))]
    return []


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


__all__ = ["HEAD_KEYS", "check_launch", "named_heads"]
