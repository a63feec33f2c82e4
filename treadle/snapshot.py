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
    optim        OptimStates.local  an open accumulation window's gradients, clipping's norms
    val          EvalLoop        the validation feed's place (each rank reads its shard)

The loop position is that of an iteration boundary: saved from ``after_train_iter`` it
already counts the running iteration (its step is done), from ``after_train_epoch`` the
epoch. Checkpoints of format 1 are migrated when read (treadle/checkpoint/migrate.py).
"""

from __future__ import annotations

from typing import Any

from treadle.checkpoint.io import CheckpointError
from treadle.checkpoint.manifest import STATE_FILE

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


__all__ = ["ENTRIES", "check_training_checkpoint", "finished"]
