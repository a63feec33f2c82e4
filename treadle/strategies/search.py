"""Finding the checkpoint ``Strategy.load_or_resume(resume=True)`` continues from."""

from __future__ import annotations

import os
from pathlib import Path

from treadle.checkpoint.io import MANIFEST_NAME, CheckpointError, read_manifest, verify_checkpoint
from treadle.logging.writers import get_logger


def find_latest_saved(work_dir: str | os.PathLike[str], kind: str = "strategy") -> Path | None:
    """The newest verified checkpoint under ``work_dir`` (at any depth) whose manifest
    says it was saved by ``Strategy.save_checkpoint`` (``meta["kind"] == kind``), by
    creation time; None when there is none. Hidden entries (scratch dirs of saves in
    progress) and symlinks are not followed. A candidate that fails verification is
    skipped with a warning; if every candidate fails, a CheckpointError says so rather
    than starting over."""
    root = Path(work_dir)
    found: list[tuple[float, Path]] = []
    failed = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not os.path.islink(os.path.join(dirpath, d))]
        if MANIFEST_NAME not in filenames:
            continue
        path = Path(dirpath)
        dirnames[:] = []  # a checkpoint's own files are not searched further
        try:
            manifest = read_manifest(path)
        except (CheckpointError, OSError):
            continue
        if manifest.get("meta", {}).get("kind") != kind:
            continue
        try:
            verify_checkpoint(path)
        except (CheckpointError, OSError) as e:
            failed += 1
            get_logger().warning(f"skipping {path}: {e}")
            continue
        found.append((float(manifest.get("created", 0.0)), path))
    if not found and failed:
        raise CheckpointError(f"resume=True: none of the {failed} checkpoint(s) under {root} passed verification "
                              "(the warnings above say why); pass resume=<path> of one elsewhere, or move them "
                              "away to start from scratch")
    return max(found, key=lambda cp: (cp[0], str(cp[1])))[1] if found else None


__all__ = ["find_latest_saved"]
