"""A griffe extension for the documentation site (mkdocs.yml): the Trainer's arguments.

mkdocstrings reads treadle's source without importing it, but the Trainer's signature and
the Args section of its docstring are not written in its source: they are derived, when
treadle is imported, from the one definition of its arguments (``TrainerArgs`` in
treadle/engine/spec.py). For that one class this extension imports treadle (and torch)
and gives the page what ``inspect.signature`` and ``help()`` show.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe

TRAINER = "treadle.engine.trainer.Trainer"


def _annotation(annotation: Any) -> str:
    """``int | None``, ``Module | Mapping[str, Any]``: the type without module paths."""
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", inspect.formatannotation(annotation))


class TrainerArgs(griffe.Extension):
    """The imported Trainer's signature and docstring in place of the source's."""

    def on_class(self, *, cls: griffe.Class, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if cls.path != TRAINER:
            return
        from treadle.engine.trainer import Trainer

        old = cls.docstring
        cls.docstring = griffe.Docstring(inspect.getdoc(Trainer) or "", lineno=old.lineno if old else None,
                                         endlineno=old.endlineno if old else None, parent=cls,
                                         parser=old.parser if old else None,
                                         parser_options=old.parser_options if old else None)
        init = cls.members["__init__"]
        params = []
        for p in inspect.signature(Trainer.__init__).parameters.values():
            params.append(griffe.Parameter(
                p.name, kind=griffe.ParameterKind.positional_or_keyword,
                annotation=None if p.annotation is p.empty else _annotation(p.annotation),
                default=None if p.default is p.empty else repr(p.default)))
        init.parameters = griffe.Parameters(*params)  # type: ignore[union-attr]  # a Function
