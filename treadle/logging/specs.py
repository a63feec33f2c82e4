"""Log writers by name: ``"jsonl"``, ``"csv"``, ``"tensorboard"``, ``"mlflow"``,
``"wandb"``, or ``{"type": name, **options}`` with the writer's arguments after the
run directory. The writers' packages are imported when a writer is built."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from treadle.logging.writers import JsonlWriter


def _tensorboard(work_dir: Path, **options: Any) -> Any:
    from treadle.logging.backends import TensorBoardWriter  # imports tensorboard: only when used

    return TensorBoardWriter(work_dir / "tensorboard", **options)


def _csv(work_dir: Path, **options: Any) -> Any:
    from treadle.logging.backends import CsvWriter

    return CsvWriter(work_dir / "log.csv", **options)


def _jsonl(work_dir: Path, **options: Any) -> Any:
    return JsonlWriter(work_dir / "log.jsonl", **options)


def _tracker(name: str) -> Any:
    """The writer class of tracker ``name`` (its package is imported only when it writes)."""
    from treadle.logging import trackers

    return {"mlflow": trackers.MlflowWriter, "wandb": trackers.WandbWriter}[name]


#: Writer names and their factories ``(work_dir, **options) -> writer``.
WRITERS = {"jsonl": _jsonl, "csv": _csv, "tensorboard": _tensorboard,
           "mlflow": lambda d, **o: _tracker("mlflow")(d, **o), "wandb": lambda d, **o: _tracker("wandb")(d, **o)}

def _writer_class(name: str) -> Any:
    """The class whose arguments (after its path) a writer name's options are."""
    if name in ("mlflow", "wandb"):
        return _tracker(name)
    if name == "jsonl":
        return JsonlWriter
    from treadle.logging import backends

    return {"csv": backends.CsvWriter, "tensorboard": backends.TensorBoardWriter}[name]


def build_writer(spec: Any, work_dir: Path) -> Any:
    """A writer from a name, a ``{"type": name, **options}`` dict, or the object itself."""
    if isinstance(spec, str):
        return WRITERS[spec](work_dir)
    if isinstance(spec, dict):
        options = {k: v for k, v in spec.items() if k != "type"}
        return WRITERS[spec["type"]](work_dir, **options)
    return spec


def check_writers(name: str, writers: Any) -> None:
    """``writers``: a list of writer names (:data:`WRITERS`), ``{"type": name, **options}``
    dicts and objects with ``write(record)`` and ``close()``; ``name`` is the argument the
    messages name (e.g. ``log_writers``)."""
    expected = f"one of {sorted(WRITERS)}, a dict {{type: name, option: value}}, or an object with write(record) and close()"
    if not isinstance(writers, (list, tuple)):
        example = f"[{writers!r}]" if isinstance(writers, str) else "['jsonl', 'csv']"
        raise TypeError(f"{name}={writers!r}; expected a list of writers such as {example} ([] for none), each "
                        f"{expected}")
    for i, w in enumerate(writers):
        if isinstance(w, dict):
            _check_writer_options(f"{name}[{i}]", w, expected)
        elif isinstance(w, str):
            if w not in WRITERS:
                raise ValueError(f"{name}[{i}]={w!r} is not a known log writer; expected {expected}")
        elif not (callable(getattr(w, "write", None)) and callable(getattr(w, "close", None))):
            raise TypeError(f"{name}[{i}]={w!r} is neither a writer name nor a writer object; expected {expected}")


def _check_writer_options(where: str, spec: dict[str, Any], expected: str) -> None:
    kind = spec.get("type")
    if kind not in WRITERS:
        raise ValueError(f"{where}.type={kind!r} is not a known log writer; expected {expected}")
    options = {k: v for k, v in spec.items() if k != "type"}
    signature = inspect.signature(_writer_class(kind))
    params = signature.parameters
    path_arg = next(iter(params))
    try:
        signature.bind(None, **options)  # the path (the run directory's file) is never an option
    except TypeError as e:
        accepted = [p for p in params if p != path_arg and params[p].kind is not inspect.Parameter.VAR_KEYWORD]
        raise ValueError(f"{where}: bad options {sorted(options)} for the {kind} writer ({e}); expected some of "
                         f"{accepted}") from None


__all__ = ["WRITERS", "build_writer", "check_writers"]
