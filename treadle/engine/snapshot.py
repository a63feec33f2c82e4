"""What a Trainer checkpoint holds: one entry per owner of training state.

``Trainer.checkpoint_states()`` hands the checkpointer (treadle/checkpoint/checkpointer.py)
these Statefuls; ``state.pt`` (format 2) holds each one's ``state_dict()``::

    model     ModelState      the module's state, as the strategy gives it (FSDP: sharded)
    optim     OptimStates     {name: OptimWrapper state}: optimizer, GradScaler, accumulation
    hooks     HookStates      {key: hook.state_dict()}: schedulers, EMA, best-K, early stop, ...
    loop      TrainLoop       the iteration boundary: epoch, iter, inner_iter; the data
                              position (batch_idx, open, shuffle seed, batch_size); the
                              workflow phase and val_due; the world size that saved
    results   TrainState      the last validation/test results
    strategy  RunState        the run's id (a resume carries it on), world size, version

and each ``rng_rank<r>.pt`` that rank's RNGs and, under ``rank_state``, what differs
from one process to the next::

    log_windows  MetricStore     the values the next log line averages
    train_metrics  TrainMetrics  the train metrics' counts so far (with train_metrics=)
    optim        OptimStates.local  an open accumulation window's gradients, clipping's norms
    val          EvalLoop        the validation feed's place (each rank reads its shard)

The loop position is that of an iteration boundary: saved from ``after_train_iter`` it
already counts the running iteration (its step is done), from ``after_train_epoch`` the
epoch. Checkpoints of format 1 are migrated when read (treadle/checkpoint/migrate.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from treadle.checkpoint.checkpointer import Checkpointer, rng_file
from treadle.checkpoint.io import CheckpointError
from treadle.checkpoint.manifest import STATE_FILE
from treadle.hooks.base import HookStates
from treadle.logging.writers import get_logger
from treadle.engine.loops import LoopCounters
from treadle.strategies.states import ModelState, OptimStates, RunState

if TYPE_CHECKING:
    from treadle.engine.trainer import Trainer

#: The entries of a Trainer checkpoint's ``state.pt``.
ENTRIES = ("model", "optim", "hooks", "loop", "results", "strategy")

_HINT = ("a weights-only checkpoint (e.g. checkpoints/best/...) or a state dict restores weights with load_from=, "
         "not resume=")


def check_training_checkpoint(state: Any) -> None:
    """Raise CheckpointError, saying how to load it instead, unless ``state`` has every
    entry of a Trainer checkpoint (each owner then checks its own part)."""
    if not isinstance(state, dict):
        raise CheckpointError(f"not a training checkpoint: it has no {STATE_FILE} dict of the training state; {_HINT}")
    if "param_schedulers" in state and "extra" in state and "loop" not in state:
        raise CheckpointError("a checkpoint saved by Strategy.save_checkpoint (your own loop), not by a Trainer: "
                              "resume it with strategy.resume(), or take its weights with load_from=")
    for part in ENTRIES:
        if not isinstance(state.get(part), dict):
            raise CheckpointError(f"not a complete training checkpoint: {STATE_FILE} has no {part!r} dict "
                                  f"(it has {sorted(state)}); {_HINT}")


def finished(pos: dict[str, Any], max_epochs: int | None, max_iters: int | None, by_epoch: bool) -> bool:
    """A checkpoint at loop position ``pos`` is of a finished run: every iteration (or
    epoch) done, and no open epoch or due validation left."""
    done = (max_iters is not None and pos["iter"] >= max_iters) or (
        by_epoch and max_epochs is not None and pos["epoch"] >= max_epochs)
    return bool(done and not (pos["open"] or pos.get("val_due")))


def trainer_states(trainer: "Trainer") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(states, rank_states)``: the owners of ``trainer``'s training state, by name."""
    strategy = trainer.strategy
    optim = OptimStates(strategy, trainer.module, trainer.optim_wrappers)
    loop = trainer.train_loop if trainer.train_loop is not None else LoopCounters(
        trainer.state, strategy.data_seed, strategy.world_size)
    states = {"model": ModelState(strategy, trainer.module), "optim": optim,
              "hooks": HookStates(lambda: trainer.hooks), "loop": loop, "results": trainer.state,
              "strategy": RunState(strategy)}
    rank_states: dict[str, Any] = {"log_windows": trainer.store, "optim": optim.local}
    if trainer.val_loop is not None:
        rank_states["val"] = trainer.val_loop
    if trainer.train_metrics is not None:
        rank_states["train_metrics"] = trainer.train_metrics
    return states, rank_states


def save(trainer: "Trainer", path: str | Path, writer: Callable[..., Path] | None = None) -> Path:
    """``Trainer.save_checkpoint``: the owners handed to the strategy's checkpointer, the
    manifest's meta (position, finished), the ``before_save_checkpoint`` hooks."""
    states, rank_states = trainer_states(trainer)
    pos, s = states["loop"].state_dict(), trainer.state
    meta = {"epoch": pos["epoch"], "iter": pos["iter"], "finished": finished(pos, s.max_epochs, s.max_iters, s.by_epoch)}
    # Checked on every rank (FSDP: each its shards), agreed on, raised everywhere alike.
    return trainer.checkpointer.save(
        path, states, rank_states=rank_states, meta=meta, run=trainer.run_id, writer=writer,
        callback=functools.partial(trainer.call_hook, "before_save_checkpoint"),
        describe=states["optim"].describe_nonfinite,
        hint=" (a non-finite gradient with a finite loss does this); nan_guard='skip' skips such steps, "
             "clip_grad or a lower lr may avoid them")


def load(trainer: "Trainer", path: str | Path) -> None:
    """``Trainer.load_checkpoint``: every owner checks its part, then all load; the train
    loop takes this rank's RNG to set where the interrupted run took its next batch."""
    strategy = trainer.strategy
    states, rank_states = trainer_states(trainer)
    state, own = trainer.checkpointer.load(path, states)
    check_training_checkpoint(state)
    saved_world = int(state["loop"].get("world_size") or 1)
    if own is None and strategy.distributed and saved_world == strategy.world_size:
        raise FileNotFoundError(f"the checkpoint has no {rng_file(strategy.rank)}; it was not saved by this job")
    Checkpointer.restore(states, state, where=str(path))
    local = own.get("rank_state") if own is not None else None
    if isinstance(local, dict):  # another world size: this rank may have none
        Checkpointer.restore(rank_states, local, where=f"{path} ({rng_file(strategy.rank)})", optional=rank_states)
    if trainer.train_loop is not None:
        trainer.train_loop.resume_rng(own)
    trainer.call_hook("after_load_checkpoint", state)
    get_logger().info(f"resumed from {path}: {trainer.state.iter} iterations done, training goes on in epoch "
                      f"{trainer.state.epoch + 1}")  # 1-based, as the log lines (README: Epochs and iterations)


__all__ = ["ENTRIES", "check_training_checkpoint", "finished", "load", "save", "trainer_states"]
