"""Weights-only loading into a model, and safetensors export.

Works on treadle checkpoint dirs (payload ``state.pt``, entry ``"model"`` or
``"ema"``), plain ``.pt``/``.pth`` files (an MMEngine checkpoint's ``state_dict`` too,
its other entries skipped: see :func:`_foreign_weights`), ``.safetensors`` files and
in-memory state dicts. Everything is read with ``weights_only=True`` (see :mod:`.io`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from treadle.checkpoint.safetensors_stream import TensorSpec, write_safetensors
from treadle.checkpoint.tensor_sources import FolderWeights, MappedWeights, ShardedWeights, ema_weights, is_hf_folder
from treadle.fsutil import fsync_dir

from .io import (
    FORMAT,
    FORMAT_VERSION,
    STATE_FILE,
    CheckpointError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    _scratch_name,
    load_checkpoint,
)

__all__ = ["LoadReport", "WeightsMismatchError", "load_weights", "export_safetensors", "read_safetensors",
           "read_weights", "read_weights_and_frozen"]

logger = logging.getLogger("treadle")

DEFAULT_REVISE_KEYS: tuple[tuple[str, str], ...] = ((r"^module\.", ""), (r"^_orig_mod\.", ""))
Source = str | os.PathLike | Mapping[str, Any]
_MAX_LISTED = 20


class WeightsMismatchError(CheckpointError):
    """Checkpoint keys/shapes do not match the model under ``strict=True``."""

    def __init__(self, report: LoadReport) -> None:
        details = "\n".join(str(report).splitlines()[1:])  # the lists, not "loaded 0 entries"
        where = f"the weights in {report.source}" if report.source else "the weights"
        super().__init__(f"{where} do not match the model; nothing was loaded:\n{details}")
        self.report = report


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _listing(items: list[str]) -> list[str]:
    lines = [f"    {k}" for k in items[:_MAX_LISTED]]
    if len(items) > _MAX_LISTED:
        lines.append(f"    ... and {len(items) - _MAX_LISTED} more")
    return lines


@dataclass
class LoadReport:
    """What :func:`load_weights` matched: missing/unexpected keys, shape mismatches, count loaded."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    loaded: int = 0
    source: str = ""
    #: Frozen weights the checkpoint left out, kept as the model has them (their digests match).
    frozen: int = 0

    @property
    def ok(self) -> bool:
        """True when every model key was found with the right shape and nothing was left over."""
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        src = f" from {self.source}" if self.source else ""
        lines = [f"loaded {self.loaded} entries{src}"]
        if self.frozen:
            lines[0] += f"; {self.frozen} frozen weights kept as the model has them (they match the checkpoint's digests)"
        if self.missing:
            lines.append(f"  missing in checkpoint ({len(self.missing)}):")
            lines += _listing(self.missing)
        if self.unexpected:
            lines.append(f"  unexpected in checkpoint ({len(self.unexpected)}):")
            lines += _listing(self.unexpected)
        if self.mismatched:
            lines.append(f"  shape mismatch ({len(self.mismatched)}), not loaded:")
            lines += _listing(
                [f"{k}: checkpoint {_fmt_shape(c)} vs model {_fmt_shape(m)}" for k, c, m in self.mismatched]
            )
        return "\n".join(lines)


def _pick_state_dict(obj: Any, key: str | None, where: str) -> dict[str, Any]:
    """Select ``obj[key]`` then descend through ``state_dict``/``model`` wrappers."""
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            have = sorted(map(str, obj)) if isinstance(obj, Mapping) else type(obj).__name__
            raise CheckpointError(f"{where}: no entry {key!r} (has {have})")
        obj = obj[key]
    for _ in range(3):  # e.g. {"state_dict": {...}} or an EMA entry {"model": {...}, "decay": ...}
        inner = next((obj[k] for k in ("state_dict", "model")
                      if isinstance(obj, Mapping) and isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
        raise CheckpointError(f"{where}: does not contain a state dict (got {type(obj).__name__})")
    if not obj:
        raise CheckpointError(f"{where}: holds no weights (an empty mapping); expected a model's state dict of tensors")
    return dict(obj)


def _read_source(source: Source, key: str | None) -> tuple[dict[str, Any], str]:
    sd, where, _ = _read_source_and_frozen(source, key)
    return sd, where


def _read_source_and_frozen(source: Source, key: str | None, *, stream: bool = False) -> tuple[Any, str, Any]:
    """``(state dict, where, frozen)``: as :func:`_read_source`, with a training checkpoint's
    ``frozen`` entry (treadle/checkpoint/frozen.py; None for anything else).

    ``stream``: the weights come as a tensor source read one tensor at a time
    (tensor_sources.py; see :func:`_exportable`): a sharded checkpoint's through DCP, a
    folder's or ``.safetensors`` file's from its files, a ``torch.save`` file's mapped from
    it (``torch.load(mmap=True)``); ``frozen`` is then None."""
    def result(sd: Mapping[str, Any], where: str, frozen: Any = None, mapped: bool = False) -> tuple[Any, str, Any]:
        return (_exportable(sd, where, mapped=mapped) if stream else sd), where, frozen

    if isinstance(source, Mapping):
        return result(_pick_state_dict(source, key, "state dict"), "<state dict>")
    path = Path(source)
    if path.is_dir() and (path / ".metadata").is_file():  # a sharded (FSDP, DCP) checkpoint
        from treadle.checkpoint.sharded import _read_sharded_manifest, consolidate  # loads DCP: only when needed

        if key not in (None, "model"):
            raise CheckpointError(f"{path}: a sharded checkpoint's weights are under 'model'; key={key!r} is not there")
        if stream:
            _read_sharded_manifest(path)
            sharded = ShardedWeights(path)
            _refuse_non_tensors(sharded.non_tensors, str(path))
            return sharded, str(path), None
        sd = consolidate(path, key="model")  # verifies every file first
        state = load_checkpoint(path, files=[STATE_FILE])[STATE_FILE] if (path / STATE_FILE).is_file() else {}
        return sd, str(path), state.get("frozen") if isinstance(state, dict) else None
    if path.is_dir() and is_hf_folder(path):  # save_pretrained's: model.safetensors, or shards and their index
        if key is not None:
            raise CheckpointError(f"{path}: a Hugging Face folder holds one state dict; key={key!r} does not apply")
        files = FolderWeights(path, "load_from")
        return (files if stream else {k: files.read(k) for k in files.specs}), str(path), None
    if path.is_dir():
        state = load_checkpoint(path, files=[STATE_FILE], mmap=stream)[STATE_FILE]
        frozen = state.get("frozen") if isinstance(state, dict) and key in (None, "model") else None
        ema = ema_weights(state) if key == "ema" and isinstance(state, Mapping) else None
        if ema is not None:  # a best-weights checkpoint's top-level entry, or a training checkpoint's EMAHook state
            state = {"ema": ema}
        return result(_pick_state_dict(state, key or "model", str(path / STATE_FILE)), str(path), frozen, stream)
    if path.suffix == ".safetensors":
        if key is not None:
            raise CheckpointError(f"{path}: a safetensors file holds one state dict; key={key!r} does not apply")
        if not stream:
            return read_safetensors(path), str(path), None
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        return FolderWeights(path, "checkpoint"), str(path), None
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    mapped = stream and zipfile.is_zipfile(path)  # torch.load maps only its zip format, not an old pickle
    try:
        state = load_checkpoint(path, mmap=mapped)[STATE_FILE]
    except UnsafeCheckpointError as refused:
        return result(_foreign_weights(path, key, refused), str(path))
    return result(_pick_state_dict(state, key, str(path)), str(path), None, mapped)


def _foreign_weights(path: Path, key: str | None, refused: UnsafeCheckpointError) -> dict[str, Any]:
    """The weights of a file that ``weights_only`` refused for objects beside them (an
    MMEngine ``.pth``: ``HistoryBuffer`` objects in its ``message_hub``): read again with
    those classes as inert placeholders (treadle/checkpoint/foreign.py: nothing named in
    the file is imported or run). Refused as before when a placeholder is inside the
    weights themselves, or when the objects are not what made the first read fail."""
    from treadle.checkpoint.foreign import entries_with_placeholders, holds_placeholder, load_with_placeholders

    try:
        obj, names = load_with_placeholders(path)
    except Exception:
        raise refused from None
    if not names:
        raise refused
    try:
        sd = _pick_state_dict(obj, key, str(path))
    except CheckpointError:
        raise refused from None
    if holds_placeholder(sd):
        raise refused
    skipped = entries_with_placeholders(obj)
    logger.info(f"{path}: took the weights; skipped {', '.join(skipped) or 'entries'} (they hold "
                f"{', '.join(sorted(names))}, read as inert placeholders: nothing in the file was imported or run)")
    return sd


def compare_weights(expected: Mapping[str, Any], given: Mapping[str, Any]) -> LoadReport:
    """Keys of ``expected`` missing from ``given``, keys of ``given`` not in ``expected``, and
    those whose shapes differ (values: tensors, or shapes); nothing is loaded."""
    def shape(v: Any) -> tuple[int, ...]:
        return tuple(v.shape if hasattr(v, "shape") else v)

    report = LoadReport()
    report.missing = [k for k in expected if k not in given]
    report.unexpected = [k for k in given if k not in expected]
    report.mismatched = [(k, shape(v), shape(expected[k])) for k, v in given.items()
                         if k in expected and shape(v) != shape(expected[k])]
    return report


def revise_state_keys(sd: Mapping[str, Any], revise_keys: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """``sd`` with each key rewritten by the ``(regex, replacement)`` pairs in turn."""
    return _revise(sd, revise_keys)


def read_weights(source: Source, key: str | None = None) -> dict[str, Any]:
    """The state dict in ``source`` (as :func:`load_weights` reads it: a checkpoint dir,
    sharded ones consolidated, ``.pt``/``.pth``, ``.safetensors``), always ``weights_only``."""
    return _read_source(source, key)[0]


def read_weights_and_frozen(source: Source) -> tuple[dict[str, Any], Any]:
    """``(weights, frozen)``: :func:`read_weights`'s, and the ``frozen`` entry of a training
    checkpoint (the digests of the frozen weights it may have left out,
    treadle/checkpoint/frozen.py), None for anything else."""
    sd, _, frozen = _read_source_and_frozen(source, None)
    return sd, frozen


def _revise(sd: Mapping[str, Any], revise_keys: Iterable[tuple[str, str]]) -> dict[str, Any]:
    rules = [(re.compile(p), r) for p, r in revise_keys]
    out: dict[str, Any] = {}
    for k, v in sd.items():
        new = k
        for pattern, repl in rules:
            new = pattern.sub(repl, new)
        if new in out:
            raise CheckpointError(f"key revision maps two checkpoint keys onto {new!r}")
        out[new] = v
    return out


def _alias_id(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.numel() > 0:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
    return object()  # never equal to anything: not an alias


def load_weights(
    model: nn.Module,
    source: Source,
    *,
    strict: bool = True,
    revise_keys: Iterable[tuple[str, str]] = DEFAULT_REVISE_KEYS,
    key: str | None = None,
    frozen: Any = None,
) -> LoadReport:
    """Load model weights from a checkpoint dir, ``.pt``/``.pth``, ``.safetensors`` or a state dict.

    Keys are rewritten with ``revise_keys`` (regex, replacement) pairs, by default
    stripping DDP ``module.`` and ``torch.compile`` ``_orig_mod.`` prefixes. Tensors
    whose shapes differ are never loaded. ``strict=True`` raises
    :class:`WeightsMismatchError` (before touching the model) on any difference;
    ``strict=False`` loads what matches, logs a warning and returns the report.
    ``key`` selects an entry such as ``"ema"`` (default ``"model"`` for checkpoint dirs).

    A training checkpoint that left out the frozen weights (treadle/checkpoint/frozen.py):
    the model's own weights of those names stay, once their digests match the
    checkpoint's; another base is refused (a CheckpointError naming the first tensor that
    differs) before anything is loaded. ``frozen``: that entry, for a ``source`` given as a
    state dict (:func:`read_weights_and_frozen`).
    """
    from treadle.checkpoint.frozen import describe, verify_left_out

    raw, where, own = _read_source_and_frozen(source, key)
    frozen = own if own is not None else frozen
    sd = _revise(raw, revise_keys)
    model_sd = model.state_dict()
    report = LoadReport(source=where)
    # A tied weight (e.g. head.weight is embed.weight) counts as present when any of its
    # aliases is in the checkpoint: exporters that de-duplicate keep only one name.
    present = {_alias_id(model_sd[k]) for k in sd if k in model_sd}
    report.missing = [k for k in model_sd if k not in sd and _alias_id(model_sd[k]) not in present]
    kept = verify_left_out(frozen, report.missing, where if own is not None else "the checkpoint",
                           lambda names: describe(model_sd, names))
    report.missing = [k for k in report.missing if k not in kept]
    report.frozen = len(kept)
    report.unexpected = [k for k in sd if k not in model_sd]
    to_load: dict[str, Any] = {}
    for k, v in sd.items():
        if k not in model_sd:
            continue
        target = model_sd[k]
        if isinstance(v, torch.Tensor) and isinstance(target, torch.Tensor) and v.shape != target.shape:
            report.mismatched.append((k, tuple(v.shape), tuple(target.shape)))
        else:
            to_load[k] = v
    if strict and not report.ok:
        raise WeightsMismatchError(report)
    result = model.load_state_dict(to_load, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys  # filtered above
    report.loaded = len(to_load)
    if not report.ok:
        logger.warning("partial weight load:\n%s", report)
    return report


def _refuse_non_tensors(names: Iterable[str], where: str) -> None:
    """A module's ``_extra_state`` (any object) is skipped, with a warning; any other entry
    that is not a tensor means the source is not weights (an RNG file: ``python``, ``numpy``...)."""
    names = list(names)
    foreign = [k for k in names if not k.endswith("_extra_state")]
    if foreign:
        shown = ", ".join(map(repr, foreign[:5])) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise CheckpointError(f"{where}: not a model's weights ({shown} not tensors); expected a state dict of "
                              "tensors: a treadle checkpoint, or a .pt/.pth/.safetensors file of a model's state_dict()")
    if names:
        logger.warning("export_safetensors: skipping non-tensor entries %s", names)


def _exportable(sd: Mapping[str, Any], where: str, *, mapped: bool) -> MappedWeights:
    """The tensors of ``sd``, to be written one at a time (:func:`_refuse_non_tensors` for the
    rest). ``mapped``: their storages are mapped from a file this module loaded, whose pages
    are given back once each tensor is written."""
    if not sd:
        raise CheckpointError(f"{where}: holds no weights (an empty mapping); expected a model's state dict of tensors")
    _refuse_non_tensors([k for k, v in sd.items() if not isinstance(v, torch.Tensor)], where)
    return MappedWeights(sd, where, mapped=mapped)


def export_safetensors(
    checkpoint: Source, out: str | os.PathLike[str], *, key: str = "model"
) -> Path:
    """Export a checkpoint's model (or ``key="ema"``) weights to a ``.safetensors`` file.

    ``module.``/``_orig_mod.`` prefixes are stripped; tensors that share storage (tied
    weights) are each written whole under their own key. The file is written one tensor
    at a time (treadle/checkpoint/safetensors_stream.py), whatever the model's size: a
    ``state.pt`` is mapped from disk and each tensor's pages given back once written, a
    sharded checkpoint read one whole tensor at a time. ``key="ema"`` of a training
    checkpoint takes its EMAHook's averaged weights. The file is written atomically: temp
    file in the same dir, fsync, rename, fsync of the dir. Its mode is what the umask
    gives any new file (0644 under the usual 022), as for checkpoints' files.
    """
    is_dir = not isinstance(checkpoint, Mapping) and Path(checkpoint).is_dir()
    # A dir's state.pt always has a "model" entry; a file or mapping may already be a
    # bare state dict, and _pick_state_dict finds a "model"/"state_dict" wrapper by itself.
    source, where, _ = _read_source_and_frozen(checkpoint, key if is_dir or key != "model" else None, stream=True)
    try:
        names = _revise({k: k for k in source.specs}, DEFAULT_REVISE_KEYS)  # exported key -> the source's
        specs = [TensorSpec(new, source.specs[old].dtype, source.specs[old].shape) for new, old in names.items()]
        metadata = {"format": "pt", "treadle_format": f"{FORMAT}-v{FORMAT_VERSION}", "source": where, "key": key}
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / _scratch_name(out.name, "tmp")
        try:
            try:  # created as open() creates any file: the umask decides its mode; fsynced before the rename
                write_safetensors(tmp, specs, lambda k: source.read(names[k]), metadata=metadata,
                                  done=lambda k: source.done(names[k]))
                os.replace(tmp, out)
                fsync_dir(out.parent)
            except OSError as e:  # e.g. a full disk: an OSError naming the file and its errno
                if e.errno is None or e.filename is not None:
                    raise
                raise OSError(e.errno, e.strerror, str(out)) from e
        except BaseException:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
            raise
    finally:
        source.close()
    return out


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read every tensor of a ``.safetensors`` file onto the CPU."""
    import safetensors
    import safetensors.torch

    try:
        return safetensors.torch.load_file(str(path), device="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except (safetensors.SafetensorError, OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: unreadable safetensors file ({e})") from e
