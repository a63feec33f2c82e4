"""The checks ``treadle train|validate|test`` make before torch is imported, so that the
commonest config errors appear as fast as ``--help`` answers (well under a second), not
after the seconds that importing torch and building the run take.

Only what can be told without torch, for a YAML config: a missing or unreadable file, a
YAML syntax error, a bad ``_base_``, a bad ``--set``, and a top-level name spelt close to a
Trainer argument (``max_epoch``) or one MMEngine has that treadle does not translate. The
full check (:func:`treadle.config.load_config`) comes after, unchanged: it finds the rest.
A Python config is code that may import torch itself: it is left to the full check.

The Trainer's argument names are read from :class:`treadle.engine.spec.TrainerArgs`'s
source, where they are defined, without importing it (it imports torch).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

from treadle.components.errors import ConfigError
from treadle.config.loader import apply_overrides, blamed_on, has_variables, load_file
from treadle.openmmlab.keys import MMENGINE_KEYS, NOT_TRANSLATED, PROJECT_KEYS
from treadle.config.unused import split_unused

SPEC_FILE = Path(__file__).resolve().parent.parent / "engine" / "spec.py"


@functools.cache
def trainer_argument_names() -> tuple[str, ...]:
    """The fields of ``TrainerArgs``, in order, read from its source file."""
    tree = ast.parse(SPEC_FILE.read_text(encoding="utf-8"))
    spec = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TrainerArgs")
    return tuple(node.target.id for node in spec.body
                 if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name))


def check_early(path: str | Path, overrides: Iterable[str] = (), *, safe: bool = False) -> None:
    """Raise the :class:`~treadle.config.ConfigError` that the full check would raise
    first, for the problems listed in this module's docstring; nothing else."""
    if Path(path).suffix not in (".yaml", ".yml"):
        return
    try:
        overrides = list(overrides)
        cfg = apply_overrides(load_file(path, safe=safe), overrides)
        split_unused(cfg, [*trainer_argument_names(), *MMENGINE_KEYS, *(k.name for k in PROJECT_KEYS)], NOT_TRANSLATED,
                     variables=has_variables(path))
    except ConfigError as e:
        raise e.with_source(blamed_on(e.path, str(path), overrides)) from e.__cause__


__all__ = ["check_early", "trainer_argument_names"]
