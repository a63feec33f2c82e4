"""What a treadle checkpoint is, and checking one.

A checkpoint is a directory whose ``manifest.json`` (:data:`MANIFEST_NAME`, ``format``
:data:`FORMAT`) lists the size and sha256 of every payload file; a legacy checkpoint is a
single ``.pt``/``.pth`` file. Here: those constants, the base errors, the payload names a
checkpoint may hold, and reading and verifying a manifest. Writing and loading are
:mod:`treadle.checkpoint.io`, which re-exports all of this; :mod:`treadle.checkpoint.directory`
(listing, finding, pruning) uses it without importing io, which re-exports that module too.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .durable import _is_flat_dir, _sha256_file

FORMAT = "treadle-checkpoint"
# 3: one layout for the Trainer and the Strategy API (treadle/strategies/api.py): the
# strategy's entries and the caller's named parts. Another version (1 and 2: the layouts
# of treadle before its first release) is refused in one line.
FORMAT_VERSION = 3
MANIFEST_NAME = "manifest.json"
STATE_FILE = "state.pt"  # main payload; a legacy single-file checkpoint is returned under this name
LEGACY_SUFFIXES = (".pt", ".pth")


class CheckpointError(RuntimeError):
    """Base class of every checkpoint error raised by treadle."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint is incomplete, truncated or its bytes differ from its manifest."""


class CheckpointWarning(UserWarning):
    """Emitted when a checkpoint is skipped (e.g. a corrupt one while searching the latest)."""


# ----------------------------------------------------------------------------- payload names


# Hidden names that a checkpoint may still hold: torch.distributed.checkpoint's own
# metadata file, in the sharded checkpoints of treadle.checkpoint.sharded.
FOREIGN_FILE_NAMES = frozenset({".metadata"})


def _check_payload_name(name: Any) -> str:
    if name in FOREIGN_FILE_NAMES:
        return name
    if (
        not isinstance(name, str) or not name or name in (".", "..") or name.startswith(".")
        or "/" in name or "\\" in name or "\0" in name or name == MANIFEST_NAME
    ):
        raise ValueError(
            f"invalid checkpoint payload name {name!r}: use a plain file name such as "
            f"'state.pt' (no '/', '\\', '..', leading '.', or {MANIFEST_NAME!r})"
        )
    return name


def _not_a_checkpoint_reason(path: Path) -> str | None:
    """Why the existing ``path`` is not a treadle checkpoint dir (None when it is one).

    A checkpoint is what :func:`~treadle.checkpoint.io.save_checkpoint` (or a sharded save) leaves behind: a real
    directory, no sub-directories, and a ``manifest.json`` file whose ``format`` is treadle's.
    A manifest that is not JSON at all counts as a damaged checkpoint of ours (it is listed
    and reported as one); valid JSON of another format is someone else's file.
    """
    if path.is_symlink():
        return "it is a symbolic link"
    if not path.is_dir():
        return "it is a file"
    if not _is_flat_dir(path):
        return "it contains sub-directories"
    mpath = path / MANIFEST_NAME
    if mpath.is_symlink() or not mpath.is_file():
        return f"it has no {MANIFEST_NAME}"
    try:
        manifest = json.loads(mpath.read_bytes())
    except ValueError:
        return None  # a treadle checkpoint whose manifest was damaged: replaceable
    except OSError as e:
        return f"its {MANIFEST_NAME} is unreadable ({e.strerror or e})"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return f"its {MANIFEST_NAME} is not a treadle checkpoint manifest (no \"format\": {FORMAT!r})"
    return None


# ----------------------------------------------------------------------------- reading


def is_deepspeed_checkpoint(path: str | os.PathLike[str]) -> bool:
    """A directory ``engine.save_checkpoint`` wrote: ``latest`` or its copied
    ``zero_to_fp32.py``, or the per-rank ``*_model_states.pt`` / ``*_optim_states.pt`` of one tag."""
    p = Path(path)
    if (p / "latest").is_file() or (p / "zero_to_fp32.py").is_file():
        return True
    return p.is_dir() and (any(p.glob("*_model_states.pt")) or any(p.glob("*_optim_states.pt")))


def new_manifest(meta: dict[str, Any], files: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a checkpoint saved now: format, version, time, torch's version,
    ``meta`` (JSON) and ``files`` (each payload's size and sha256)."""
    import torch

    now = time.time()
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "created": now,
            "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
            "torch_version": torch.__version__, "meta": meta, "files": files}


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and sanity-check ``manifest.json`` of a checkpoint dir (no payload hashing)."""
    mpath = Path(path) / MANIFEST_NAME
    try:
        manifest = json.loads(mpath.read_bytes())
    except FileNotFoundError:
        if is_deepspeed_checkpoint(path):
            raise CheckpointError(
                f"{path} is a DeepSpeed checkpoint (engine.save_checkpoint), not treadle's: treadle never reads "
                "it, because DeepSpeed's files need a full unpickle (torch.load(weights_only=False)), which runs "
                "whatever code the files name. If you trust them, consolidate them with DeepSpeed's own "
                "zero_to_fp32.py (in that directory) and pass the result to load_from="
            ) from None
        raise CorruptCheckpointError(
            f"{mpath}: missing - incomplete checkpoint (a save that never finished?)"
        ) from None
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{mpath}: unreadable or invalid JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{mpath}: not a treadle checkpoint manifest")
    version = manifest.get("format_version")
    readable = f"format version {FORMAT_VERSION}"
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CorruptCheckpointError(
            f"{mpath}: invalid format_version {version!r}: expected a positive integer "
            f"(this treadle reads {readable})"
        )
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{mpath}: format_version {version} is not supported: this treadle reads {readable} "
            "(was the checkpoint written by a newer treadle?)"
        )
    if version < FORMAT_VERSION:
        raise CheckpointError(
            f"{mpath}: format_version {version} is not supported: this treadle reads {readable} "
            "(the checkpoint was written by an earlier treadle, in a layout this one no longer reads)"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("meta", {}), dict):
        raise CorruptCheckpointError(f"{mpath}: malformed 'files'/'meta' entries")
    for name, entry in files.items():
        try:
            _check_payload_name(name)  # never follow a path out of the checkpoint dir
        except ValueError as e:
            raise CorruptCheckpointError(f"{mpath}: {e}") from None
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            raise CorruptCheckpointError(f"{mpath}: malformed entry for {name!r}")
    return manifest


def refuse_link(fpath: Path) -> None:
    """Raise :class:`CorruptCheckpointError` when a checkpoint's payload ``fpath`` is a
    symbolic link: treadle never writes one inside a checkpoint, and following one would
    read whatever file it points to."""
    if fpath.is_symlink():
        try:
            target = f" to {os.readlink(fpath)}"
        except OSError:
            target = ""
        raise CorruptCheckpointError(f"{fpath} is a symbolic link{target}; a checkpoint's files are never links "
                                     "(treadle does not follow them)")


def _verify_file(directory: Path, name: str, entry: Mapping[str, Any]) -> None:
    fpath = directory / name
    refuse_link(fpath)
    try:
        size = fpath.stat().st_size
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{fpath}{link_note(fpath)}: listed in the manifest but missing") from None
    if not fpath.is_file():
        raise CorruptCheckpointError(f"{fpath}{link_note(fpath)}: not a file; the manifest lists a file of "
                                     f"{entry['size']} bytes")
    if size != entry["size"]:
        raise CorruptCheckpointError(
            f"{fpath}{link_note(fpath)}: size is {size} bytes but the manifest says {entry['size']} "
            "(truncated or overwritten)"
        )
    digest = _sha256_file(fpath)
    if digest != entry["sha256"]:
        raise CorruptCheckpointError(
            f"{fpath}: sha256 mismatch (bytes changed on disk): expected {entry['sha256']}, got {digest}"
        )


def link_note(path: Path) -> str:
    """`` (a symbolic link to <target>)`` when ``path`` is one, for an error message
    (treadle never writes one inside a checkpoint); else ``""``."""
    try:
        return f" (a symbolic link to {os.readlink(path)})" if path.is_symlink() else ""
    except OSError:
        return ""


def verify_checkpoint(path: str | os.PathLike[str]) -> None:
    """Check a checkpoint's manifest and every payload's size and sha256.

    For a legacy single file this checks the CRCs of its zip records, when it is one.
    Raises :class:`CorruptCheckpointError` (or :class:`CheckpointError`) on failure.
    """
    path = Path(path)
    if path.is_file():
        _verify_legacy_file(path)
        return
    if not path.is_dir():
        raise CorruptCheckpointError(f"{path}: no such checkpoint")
    manifest = read_manifest(path)
    for name, entry in manifest["files"].items():
        _verify_file(path, name, entry)


def _verify_legacy_file(path: Path) -> None:
    # torch's zip format stores a CRC32 per record: the best integrity check available
    # without a manifest. Old non-zip pickles cannot be checked.
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: damaged zip archive ({e})") from e
    if bad is not None:
        raise CorruptCheckpointError(f"{path}: CRC mismatch in record {bad!r}")


__all__ = [
    "is_deepspeed_checkpoint",
    "FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "STATE_FILE", "LEGACY_SUFFIXES", "FOREIGN_FILE_NAMES",
    "CheckpointError", "CorruptCheckpointError", "CheckpointWarning", "link_note", "refuse_link", "new_manifest", "read_manifest",
    "verify_checkpoint",
]
