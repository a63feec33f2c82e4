"""The config schema: every ``treadle.Trainer`` argument, its type, range and meaning.

The table, :data:`TRAINER_KEYS`, is derived from the Trainer's argument definitions
(``TrainerArgs`` in ``treadle/engine/spec.py``, which ``Trainer.__init__`` checks its
arguments with): every argument that a config file may set, in the signature's order,
with its default (:func:`trainer_defaults`). ``--set KEY=VALUE`` on the command line
and ``docs/config.md`` use the same table. Components (``model``, loaders, ``loss_fn``,
``metrics``, ``hooks``) are checked here for shape and built by
:mod:`treadle.components.build`, which checks their arguments. :class:`Key`, its checks and
the keys of a dataloader spec are in :mod:`treadle.components.keys`.
"""

from __future__ import annotations

from typing import Any

from treadle.components.keys import (DATALOADER_KEYS, DATALOADER_SCHEMA, Key, check_keys, check_table,
                                 check_value)
from treadle.openmmlab.keys import PROJECT_KEYS
from treadle.engine.argspec import config_defaults, params
from treadle.engine.spec import LOG_WRITERS, TRAINER_KEYS, TrainerArgs  # the definitions: beside the Trainer

SCHEMA: dict[str, Key] = {k.name: k for k in (*TRAINER_KEYS, *PROJECT_KEYS)}


#: Trainer arguments that are not config keys (their ``Arg`` has no ``config`` types):
#: ``safe`` is how far the caller trusts the config, so the config itself must not set it.
NOT_CONFIG_KEYS: tuple[str, ...] = tuple(p.name for p in params(TrainerArgs) if p.key is None)


#: Keys only training reads (``Arg.training_only``): ``treadle validate|test`` leave them out.
TRAINING_ONLY: tuple[str, ...] = tuple(p.name for p in params(TrainerArgs) if p.arg.training_only)


def required_keys(command: str) -> list[tuple[str, str]]:
    """``(key, what it should be)`` for each key a config must give for ``command``
    ("train", "validate", "test"): the arguments whose ``Arg.required_by`` names it."""
    return [(p.name, p.arg.expected.removesuffix(", or null")) for p in params(TrainerArgs)
            if command in p.arg.required_by]


def trainer_defaults() -> dict[str, Any]:
    """Each config key's default, from the argument definitions (tuples as lists, None
    for the required ``model``), in the signature's order."""
    return config_defaults(TrainerArgs)


__all__ = ["DATALOADER_KEYS", "DATALOADER_SCHEMA", "Key", "LOG_WRITERS", "NOT_CONFIG_KEYS", "PROJECT_KEYS", "SCHEMA",
           "TRAINER_KEYS",
           "TRAINING_ONLY", "check_keys", "check_table", "check_value", "required_keys", "trainer_defaults"]
