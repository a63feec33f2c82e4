"""How a config key is described and checked (:class:`Key`, :func:`check_table`), and the
keys of a dataloader spec. :mod:`treadle.config.schema` (the Trainer's keys) re-exports
these; they are apart from it so that :mod:`treadle.components.build`, which builds the config
dicts that the Trainer and the strategies are given, need not import the schema, which
imports the Trainer's argument definitions (treadle/engine/spec.py) and, through them, the
strategies (to check ``strategy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from treadle.components.errors import ConfigError, did_you_mean, join_path

NoneType = type(None)
Check = Callable[[Any, str], None]  # raises ConfigError naming the path
SPEC = "a component spec such as {type: Name, arg: value}, or a registered name"


@dataclass(frozen=True)
class Key:
    """One config key: the Python types YAML may give it, a range check, the text
    shown when it is wrong, and the line of documentation."""

    name: str
    types: tuple[type, ...]
    expected: str
    doc: str
    check: Check | None = None
    #: Python objects the Trainer takes for this key besides the config's types (a
    #: module, a DataLoader, an Optimizer...): checked by their builders, not here.
    objects: tuple[type, ...] = ()


def _min(low: int, what: str = "an int") -> Check:
    def check(value: Any, path: str) -> None:
        if value is not None and value < low:
            raise ConfigError(path, "out of range", value=value, expected=f"{what} >= {low}")
    return check


def check_keys(value: dict[str, Any], allowed: list[str], path: str, what: str) -> None:
    """Every key of ``value`` must be in ``allowed``; the first stranger is reported."""
    for key in value:
        if key not in allowed:
            raise ConfigError(join_path(path, key), f"unknown key for {what}", value=value[key],
                              expected=f"one of {', '.join(allowed)}", hint=did_you_mean(str(key), allowed))


def check_value(key: Key, value: Any, path: str) -> None:
    """Type first (bools are not ints here), then the key's own check."""
    ok = any(isinstance(value, t) and not (t in (int, float) and isinstance(value, bool)) for t in key.types)
    if not ok:
        raise ConfigError(path, f"wrong type {type(value).__name__}", value=value, expected=key.expected)
    if key.check is not None and value is not None:
        key.check(value, path)


def check_table(cfg: dict[str, Any], table: dict[str, Key], path: str, what: str) -> None:
    """Unknown keys (with did-you-mean), then each value's type and range."""
    check_keys(cfg, list(table), path, what)
    for name, value in cfg.items():
        check_value(table[name], value, join_path(path, name))


#: Keys of a dataloader spec; everything but ``dataset`` goes to ``torch.utils.data.DataLoader``.
DATALOADER_KEYS: tuple[Key, ...] = (
    Key("dataset", (dict, str), SPEC, "The dataset: `{type: digits, split: train}` (registry name or dotted path)."),
    Key("batch_size", (int,), "an int >= 1", "Samples per batch (default 1).", _min(1)),
    Key("shuffle", (bool,), "true or false", "Reshuffle every epoch (default false)."),
    Key("num_workers", (int,), "an int >= 0", "Loader worker processes (default 0).", _min(0)),
    Key("drop_last", (bool,), "true or false", "Drop the last incomplete batch (default false)."),
    Key("pin_memory", (bool,), "true or false", "Page-locked host memory for faster copies to the GPU."),
    Key("persistent_workers", (bool,), "true or false", "Keep workers alive between epochs (needs num_workers > 0)."),
    Key("prefetch_factor", (int, NoneType), "an int >= 1, or null", "Batches loaded ahead by each worker.", _min(1)),
    Key("timeout", (int, float), "a number >= 0", "Seconds to wait for a batch from a worker.", _min(0, "a number")),
    Key("group_by_aspect_ratio", (bool,), "true or false",
        "Batches of one orientation, portrait or landscape, from the dataset's `get_data_info(index)` width and "
        "height (treadle.data.AspectRatioBatchSampler; default false)."),
    Key("sampler", (dict, NoneType), "{type: DefaultSampler | InfiniteSampler, shuffle: ..., seed: ...}, or null",
        "The sample order, by MMEngine's sampler names (treadle.data.samplers): `DefaultSampler` (`shuffle`, "
        "`seed` (default: the run's), `round_up`) or `InfiniteSampler` (`shuffle`, `seed`), sharded by the "
        "strategy; instead of `shuffle`. An OpenMMLab project's own sampler type is built through its registries."),
    Key("collate_fn", (str, dict, NoneType), "default_collate, pseudo_collate, a dotted path to a function, or null",
        "How samples become a batch: `default_collate` (torch's), `pseudo_collate` (lists, not stacked), or a "
        "dotted path whose module is imported (refused by `--safe`); `{type: name, ...}` for a function of an "
        "OpenMMLab project's registries."),
)

DATALOADER_SCHEMA: dict[str, Key] = {k.name: k for k in DATALOADER_KEYS}


__all__ = ["DATALOADER_KEYS", "DATALOADER_SCHEMA", "SPEC", "Check", "Key", "NoneType", "check_keys", "check_table",
           "check_value"]
