"""What ``resume=`` resumes from, and what a path given where a checkpoint is expected
(``load_from=``, ``treadle validate/test --checkpoint``, ``treadle export``) names: the
checks and the search, before anything is loaded.

The Trainer (treadle/engine/trainer.py) and the command line (treadle/cli.py) call these;
restoring a checkpoint into the Trainer is treadle/engine/snapshot.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from treadle.checkpoint.directory import cleanup_stale_tmp, find_latest_checkpoint, list_checkpoints
from treadle.checkpoint.io import MANIFEST_NAME, CheckpointError, CheckpointWarning, UnreadableCheckpointError
from treadle.checkpoint.tensor_sources import is_hf_folder
from treadle.checkpoint.weights import load_weights
from treadle.distributed import comm
from treadle.logging.writers import get_logger

T = TypeVar("T")


def _say(message: str) -> None:
    """A skipped checkpoint, said once: by the log when it prints somewhere (a Trainer's
    run), else as a :class:`CheckpointWarning` (before any log is set up)."""
    logger = get_logger()
    if logger.hasHandlers():
        logger.warning(message)
    else:
        warnings.warn(message, CheckpointWarning, stacklevel=3)


def latest_to_resume(ckpt_dir: Path, is_main: bool, exclude: Iterable[Path] = ()) -> Path | None:
    """``resume=True``: the last saved verified checkpoint in ``ckpt_dir`` (rank 0 looks,
    every rank gets its choice), or None when there is none.

    The last *saved*, not the highest iteration: a new run in the same directory, or
    one started again from an earlier point, continues from its own newest save. When
    checkpoints exist but none verifies, this raises instead of starting over, which
    would silently throw the run away. ``exclude``: checkpoints found unloadable (see
    :func:`resume_latest`).
    """
    path, invalid = None, 0
    if is_main and ckpt_dir.is_dir():
        cleanup_stale_tmp(ckpt_dir)
        path = find_latest_checkpoint(ckpt_dir, order="created", exclude=exclude,
                                      warn=_say)
        invalid = 0 if path is not None or exclude else len(list_checkpoints(ckpt_dir))
    path, invalid = comm.broadcast_object((path, invalid))
    if invalid:
        raise CheckpointError(f"resume=True: none of the {invalid} checkpoint(s) in {ckpt_dir} passed "
                              "verification (the warnings above say why); move them away to start "
                              "from scratch, or pass resume=<path> of a checkpoint elsewhere")
    if path is None and not exclude:
        from treadle.distributed.env import restart_count

        if restart_count() > 0:  # an elastic restart before the first save: resume if any, as asked
            get_logger().info(f"resume=True: no checkpoint in {ckpt_dir} yet; starting from scratch")
        elif is_main:
            get_logger().warning(nothing_to_resume(ckpt_dir) + "; starting from scratch")
    return path


def nothing_to_resume(ckpt_dir: Path) -> str:
    """"resume=True: no checkpoint in DIR", and the run directory beside this one that holds
    checkpoints and whose name is closest (a mistyped ``--work-dir``)."""
    text = f"resume=True: no checkpoint in {ckpt_dir}"
    run = ckpt_dir.parent
    try:
        siblings = [d.name for d in run.resolve().parent.iterdir()
                    if d.name != run.name and d.is_dir() and list_checkpoints(d / "checkpoints")]
    except OSError:
        return text
    from treadle.suggest import closest

    near = closest(run.name, siblings, n=1)
    return text + (f" (did you mean {run.parent / near[0]}? it holds checkpoints)" if near else "")


def resume_latest(ckpt_dir: Path, is_main: bool, load: Callable[[Path], None]) -> Path | None:
    """``resume=True``: ``load`` the last saved verified checkpoint in ``ckpt_dir``; when
    its files verify but cannot be read (torch.load fails, or refuses what they hold), say
    so in one line and take the previous verified one. Every rank reads the same files, so
    every rank falls back alike; the ranks also agree on it. Returns the path loaded, or
    None when there is no checkpoint; raises the first error when none earlier loads."""
    tried: list[Path] = []
    path = latest_to_resume(ckpt_dir, is_main)
    while path is not None:
        error: UnreadableCheckpointError | None = None
        try:
            load(path)
        except UnreadableCheckpointError as e:
            error = e
        errors = [e for e in comm.all_gather_object(None if error is None else str(error)) if e is not None]
        if not errors:
            return path
        tried.append(path)
        previous = latest_to_resume(ckpt_dir, is_main, exclude=tried)
        if previous is None:
            raise CheckpointError(f"resume=True: {errors[0]}; and no earlier checkpoint in {ckpt_dir} verifies "
                                  "and loads")
        get_logger().warning(f"resume=True: {path} verifies but cannot be loaded ({errors[0]}); resuming from the "
                             f"previous verified checkpoint {previous.name} instead")
        path = previous
    return None


def weights_to_read(load_from: str | Path | None, module: Any, built_empty: bool, is_main: bool) -> Path | None:
    """``load_from=``: the weights read into ``module`` now (a run directory: its latest
    verified checkpoint), or, for a model built on the meta device (``built_empty``), the
    checkpoint returned for ``Strategy.prepare`` to read shard by shard."""
    if load_from is None:
        return None
    if built_empty:
        path, note = checkpoint_in(load_from, "load_from", is_main)
        if note:
            get_logger().info(note)
        return path

    def load(path: Path, note: str | None) -> None:
        if note:
            get_logger().info(note)
        get_logger().info(f"load_from: {load_weights(module, path, strict=True)}")

    use_latest(load_from, "load_from", load, is_main)  # a live run's pruning: the next newest
    return None


def use_latest(path: str | Path, what: str, use: Callable[[Path, str | None], T], is_main: bool = True,
               attempts: int = 5) -> T:
    """``use(checkpoint, note)`` for the checkpoint :func:`checkpoint_in` finds. When it was
    chosen by a search (a run directory) and a live run's pruning removed it before or
    while ``use`` read it, the next newest is taken: a reader of a running job never
    fails because of that (``treadle validate``/``export``, ``load_from=``)."""
    for attempt in range(attempts):
        checkpoint, note = checkpoint_in(path, what, is_main)
        try:
            return use(checkpoint, note)
        except (OSError, CheckpointError):
            if note is None or checkpoint.exists() or attempt == attempts - 1:
                raise
            get_logger().info(f"{checkpoint} was pruned while it was read; taking the next newest")
    raise AssertionError("unreachable")


def checkpoint_in(path: str | Path, what: str, is_main: bool = True) -> tuple[Path, str | None]:
    """The checkpoint that ``path``, given as ``what`` (e.g. "load_from" or
    "--checkpoint"), names, and a message to show when it is not ``path`` itself.

    A checkpoint directory, a weights file or anything else that is not a directory is
    ``path`` itself (loading it says what is wrong with it). ``what`` may be "". A run directory (one with
    ``checkpoints/``), or a directory of checkpoints, names the latest verified checkpoint
    saved there, as ``resume=True`` picks it; the message says which. Rank 0 looks, every
    rank gets its answer; every rank raises alike: FileNotFoundError when ``path`` does not
    exist, CheckpointError when a directory holds no checkpoint that verifies.
    """
    found = _checkpoint_in(Path(path), what) if is_main else None
    kind, value, note = comm.broadcast_object(found)
    if kind == "missing":
        raise FileNotFoundError(value)
    if kind == "error":
        raise CheckpointError(value)
    return Path(value), note


def _checkpoint_in(path: Path, what: str) -> tuple[str, str, str | None]:
    named = f"{what} {path}".strip()
    if not path.exists():
        return "missing", f"{named}: no such checkpoint (no such file or directory)", None
    if not path.is_dir() or (path / MANIFEST_NAME).is_file() or is_hf_folder(path):
        return "path", str(path), None  # a checkpoint, a file or a Hugging Face folder: loading it says what is wrong
    ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if ckpt_dir == path and any(f.suffix in (".pt", ".distcp") for f in path.iterdir()):
        return "path", str(path), None  # a checkpoint's payloads without a manifest: loading it says so
    cleanup_stale_tmp(ckpt_dir)
    latest = find_latest_checkpoint(ckpt_dir, order="created", warn=_say)
    if latest is not None:
        kind = "run directory" if ckpt_dir != path else "directory of checkpoints"
        return "path", str(latest), f"{named} is a {kind}: using its latest verified checkpoint {latest}"
    invalid = len(list_checkpoints(ckpt_dir))
    if invalid:
        return "error", (f"{named}: none of the {invalid} checkpoint(s) in {ckpt_dir} passed verification "
                         "(the warnings above say why); pass one checkpoint directory explicitly"), None
    return "error", (f"{named}: a directory with no checkpoint in it; expected a checkpoint directory (with "
                     f"{MANIFEST_NAME}), a run directory (with checkpoints/) or a weights file"), None


def note_other_runs(ckpt_dir: Path) -> None:
    """A new run in a directory that holds another run's checkpoints: say what happens to them."""
    others = list_checkpoints(ckpt_dir, order="created")
    if others:
        get_logger().warning(f"{ckpt_dir} already holds {len(others)} checkpoint(s) of another run (the last saved: "
                             f"{others[-1].name}); this run starts from scratch and never removes or replaces "
                             "them (a name they hold gets -v1, -v2, ...); resume=True will continue from "
                             "whichever run saved last")



__all__ = ["checkpoint_in", "latest_to_resume", "note_other_runs", "nothing_to_resume", "resume_latest", "use_latest",
           "weights_to_read"]
