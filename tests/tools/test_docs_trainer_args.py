"""The documentation site's Trainer page (mkdocs.yml, tools/docs_trainer_args.py): griffe
reads the source, where the Trainer's arguments are one dataclass (TrainerArgs); the
extension gives the page the signature and the Args section derived from it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import treadle
from treadle.engine.argspec import params
from treadle.engine.spec import TrainerArgs

griffe = pytest.importorskip("griffe")  # the docs extra

ROOT = Path(__file__).resolve().parents[2]


def _trainer(extensions):
    loader = griffe.GriffeLoader(extensions=extensions, search_paths=[str(ROOT)], docstring_parser="google")
    module = loader.load("treadle.engine.trainer")
    return module["Trainer"]


def test_the_page_gets_every_argument_with_its_doc_and_default():
    cls = _trainer(griffe.load_extensions(str(ROOT / "tools" / "docs_trainer_args.py")))
    init = cls.members["__init__"]
    assert [p.name for p in init.parameters] == ["self", *inspect.signature(treadle.Trainer).parameters]
    assert init.parameters["max_epochs"].annotation == "int | None" and init.parameters["max_epochs"].default == "None"
    assert init.parameters["model"].default is None  # required
    documented = next(s for s in cls.docstring.parsed if s.kind.value == "parameters").value
    assert [(p.name, " ".join(p.description.split())) for p in documented] == [
        (p.name, " ".join(p.arg.doc.split())) for p in params(TrainerArgs)]


def test_without_the_extension_the_source_shows_no_arguments():
    """What the extension is for: the source alone has ``__init__(self, args)``."""
    cls = _trainer(griffe.load_extensions())
    assert [p.name for p in cls.members["__init__"].parameters] == ["self", "args"]
