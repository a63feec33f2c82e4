"""What the MMEngine translations share: renaming a spec's keys, dropping the options
treadle honours by default, refusing the rest with the key as the user wrote it."""

from __future__ import annotations

from typing import Any

from treadle.components.errors import ConfigError, join_path


def take(spec: dict[str, Any], path: str, mapping: dict[str, str], dropped: dict[str, Any],
         why: dict[str, str] | None = None) -> dict[str, Any]:
    """Rename ``spec``'s keys by ``mapping``; keys in ``dropped`` must hold the given value
    (None: any) and are left out; anything else is an error. ``why`` explains, per
    dropped key, why treadle can honour only that value (the error's hint)."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key in mapping:
            out[mapping[key]] = value
        elif key in dropped and (dropped[key] is None or same(value, dropped[key])):
            continue
        elif key in dropped:  # a value treadle does not honour
            raise ConfigError(join_path(path, key), "option has no treadle equivalent for this value", value=value,
                              expected=f"{key}: {yaml_text(dropped[key])} (what treadle does), or no {key}",
                              hint=(why or {}).get(key, ""))
        else:
            supported = sorted(mapping) + sorted(k for k, v in dropped.items())
            raise ConfigError(join_path(path, key), "option has no treadle equivalent", value=value,
                              expected=f"options among {', '.join(supported)}")
    return out


def yaml_text(value: Any) -> str:
    """``value`` as a config file writes it (``true``, ``1``, ``'x'``)."""
    return {True: "true", False: "false"}[value] if isinstance(value, bool) else repr(value)


def same(value: Any, expected: Any) -> bool:
    """``value == expected``, but True and 1 (or False and 0) are not the same option value."""
    return value == expected and isinstance(value, bool) == isinstance(expected, bool)


__all__ = ["same", "take", "yaml_text"]
