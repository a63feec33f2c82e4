"""What ``resume=`` resumes from: the checks and the search, before anything is loaded.

The Trainer (treadle/trainer.py) calls these; restoring a checkpoint into it is
treadle/snapshot.py.
"""

from __future__ import annotations

from pathlib import Path

from treadle.checkpoint.directory import cleanup_stale_tmp, find_latest_checkpoint, list_checkpoints
from treadle.checkpoint.io import MANIFEST_NAME, CheckpointError
from treadle.distributed import comm
from treadle.logging.writers import get_logger


def latest_to_resume(ckpt_dir: Path, is_main: bool) -> Path | None:
    """``resume=True``: the last saved verified checkpoint in ``ckpt_dir`` (rank 0 looks,
    every rank gets its choice), or None when there is none.

    The last *saved*, not the highest iteration: a new run in the same directory, or
    one started again from an earlier point, continues from its own newest save. When
    checkpoints exist but none verifies, this raises instead of starting over, which
    would silently throw the run away.
    """
    path, invalid = None, 0
    if is_main and ckpt_dir.is_dir():
        cleanup_stale_tmp(ckpt_dir)
        path = find_latest_checkpoint(ckpt_dir, order="created")
        invalid = 0 if path is not None else len(list_checkpoints(ckpt_dir))
    path, invalid = comm.broadcast_object((path, invalid))
    if invalid:
        raise CheckpointError(f"resume=True: none of the {invalid} checkpoint(s) in {ckpt_dir} passed "
                              "verification (the warnings above say why); move them away to start "
                              "from scratch, or pass resume=<path> of a checkpoint elsewhere")
    if path is None:
        get_logger().info(f"resume=True: no checkpoint in {ckpt_dir}; starting from scratch")
    return path


def check_resume_dir(path: Path) -> None:
    """A directory given as ``resume=`` must be one checkpoint, not a run or a checkpoints dir."""
    if not path.is_dir() or (path / MANIFEST_NAME).is_file():
        return
    inside = [*list_checkpoints(path, order="created"), *list_checkpoints(path / "checkpoints", order="created")]
    hint = (f"; it holds checkpoints: pass one (the last saved is {inside[-1]}), or resume=True with the run's "
            "work_dir" if inside else "")
    raise FileNotFoundError(f"resume={str(path)!r} is a directory but not a checkpoint (it has no {MANIFEST_NAME})"
                            f"{hint}")


def note_other_runs(ckpt_dir: Path) -> None:
    """A new run in a directory that holds another run's checkpoints: say what happens to them."""
    others = list_checkpoints(ckpt_dir, order="created")
    if others:
        get_logger().warning(f"{ckpt_dir} already holds {len(others)} checkpoint(s) of another run (the last saved: "
                             f"{others[-1].name}); this run starts from scratch and never removes or replaces "
                             "them (a name they hold gets -v1, -v2, ...); resume=True will continue from "
                             "whichever run saved last")



__all__ = ["check_resume_dir", "latest_to_resume", "note_other_runs"]
