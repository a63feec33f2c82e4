"""The config schema: every ``treadle.Trainer`` argument, its type, range and meaning.

The table itself, :data:`TRAINER_KEYS`, is the Trainer's own argument spec
(``treadle/engine/spec.py``, which ``Trainer.__init__`` checks its arguments with); a
test checks that it and the signature list the same names (but :data:`NOT_CONFIG_KEYS`),
and ``docs/config.md`` is generated from it.
Defaults are read from the signature itself, so they cannot drift. Components
(``model``, loaders, ``loss_fn``, ``metrics``, ``hooks``) are checked here for shape
and built by :mod:`treadle.config.build`, which checks their arguments. :class:`Key`,
its checks and the keys of a dataloader spec are in :mod:`treadle.config.keys`.
"""

from __future__ import annotations

import inspect
from typing import Any

from treadle.config.keys import (DATALOADER_KEYS, DATALOADER_SCHEMA, Key, check_keys, check_table,  # noqa: F401
                                 check_value)
from treadle.engine.spec import LOG_WRITERS, TRAINER_KEYS  # the table itself: beside the Trainer

SCHEMA: dict[str, Key] = {k.name: k for k in TRAINER_KEYS}


#: Trainer arguments that are not config keys. ``safe`` is how far the caller trusts the
#: config, so the config itself must not be able to set it.
NOT_CONFIG_KEYS = ("safe",)


def trainer_defaults() -> dict[str, Any]:
    """Each Trainer argument's default, from the signature (tuples as lists), less
    :data:`NOT_CONFIG_KEYS`."""
    from treadle.engine.trainer import Trainer  # here: the schema must not import the Trainer at load time

    out: dict[str, Any] = {}
    for name, p in inspect.signature(Trainer.__init__).parameters.items():
        if name != "self" and name not in NOT_CONFIG_KEYS:
            default = p.default
            out[name] = list(default) if isinstance(default, tuple) else (None if default is p.empty else default)
    return out


__all__ = ["DATALOADER_KEYS", "DATALOADER_SCHEMA", "Key", "LOG_WRITERS", "NOT_CONFIG_KEYS", "SCHEMA", "TRAINER_KEYS", "check_keys",
           "check_table", "check_value", "trainer_defaults"]
