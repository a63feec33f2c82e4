"""What a Trainer checkpoint holds: the one layout (treadle/strategies/api.py), with the
Trainer's own parts handed to the strategy by name.

``Trainer.save_checkpoint`` is ``strategy.save_checkpoint(path, parts=..., rank_parts=...)``
and ``Trainer.load_checkpoint`` is ``strategy.resume(path, parts=..., rank_parts=...)``,
the calls a hand-written loop makes. ``state.pt`` (format 3) holds each owner's
``state_dict()``::

    model             ModelState      the module's state, as the strategy gives it (FSDP: sharded),
                                      less the frozen parameters unless checkpoint=dict(save_frozen=True)
    frozen            FrozenWeights   the digests of the frozen parameters (treadle/checkpoint/frozen.py)
    optim             OptimStates     {name: OptimWrapper state}: optimizer, GradScaler, accumulation
    param_schedulers  SchedulerStates the schedulers' states (a dict of lists by optimizer
                                      name for several); ParamSchedulerHook steps them
    data              LoaderPlaces    [the training loader's place]: epoch, batches taken,
                                      shuffle seed (what a hand-written loop's loader resumes)
    extra             {}              (a hand-written loop's extra_ckpt)
    strategy          RunState        the run's id (a resume carries it on), world size, version
  the Trainer's parts:
    loop              TrainLoop       the iteration boundary: epoch, iter, inner_iter; the data
                                      position (batch_idx, open, shuffle seed, batch_size); the
                                      workflow phase and val_due; the world size that saved
    hooks             HookStates      {key: hook.state_dict()}: EMA, best-K, early stop, ...
    results           TrainState      the last validation/test results

and each ``rng_rank<r>.pt`` that rank's RNGs and, under ``rank_state``, what differs
from one process to the next::

    optim        OptimStates.local  an open accumulation window's gradients, clipping's norms
    data         LoaderPlaces.local inside an epoch, the training stream's own position (a
                                    loader or dataset with state_dict: treadle/data/feed.py)
    log_windows  MetricStore        the values the next log line averages
    train_metrics  TrainMetrics     the train metrics' counts so far (with train_metrics=)
    val          EvalLoop           the validation feed's place (each rank reads its shard)

``strategy.resume(path)`` in a hand-written loop restores weights, optimizers,
schedulers, the loader's place and the RNG of a Trainer checkpoint, and hands ``loop``,
``hooks`` and ``results`` back in the dict it returns.

The loop position is that of an iteration boundary: saved from ``after_train_iter`` it
already counts the running iteration (its step is done), from ``after_train_epoch`` the
epoch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, TYPE_CHECKING, Protocol

from treadle.checkpoint.checkpointer import rng_file
from treadle.checkpoint.io import CheckpointError
from treadle.checkpoint.manifest import STATE_FILE
from treadle.data.resumable import place_of
from treadle.distributed.board import CHECKPOINT, PHASE, board
from treadle.hooks.base import HookStates
from treadle.hooks.checkpoint import CheckpointHook
from treadle.engine.loops import LoopCounters, TrainLoop

if TYPE_CHECKING:
    from treadle.engine.eval_loop import EvalLoop
    from treadle.hooks.base import Hook
    from treadle.hooks.state import TrainState
    from treadle.hooks.train_metrics import TrainMetrics
    from treadle.logging.store import MetricStore
    from treadle.strategies.base import Strategy


class Trainer(Protocol):
    """What this module reads of the Trainer (treadle/engine/trainer.py, which imports it):
    the owners of its training state and the hook call."""

    strategy: Strategy
    state: TrainState
    hooks: list[Hook]
    store: MetricStore
    train_loop: TrainLoop | None
    val_loop: EvalLoop | None
    train_metrics: TrainMetrics | None

    def call_hook(self, point: str, *args: Any) -> None: ...


#: The entries of a Trainer checkpoint's ``state.pt``: the strategy's, then the Trainer's parts.
ENTRIES = ("model", "frozen", "optim", "param_schedulers", "data", "extra", "strategy", "loop", "hooks", "results")
#: The Trainer's own parts (the rest are the strategy's).
PARTS = ("loop", "hooks", "results")

_HINT = ("a weights-only checkpoint (e.g. checkpoints/best/...) or a state dict restores weights with load_from=, "
         "not resume=")
_NONFINITE = (" (a non-finite gradient with a finite loss does this); nan_guard='skip' skips such steps, "
              "clip_grad or a lower lr may avoid them")


def check_training_checkpoint(state: Any) -> None:
    """Raise CheckpointError, saying how to load it instead, unless ``state`` has every
    entry of a Trainer checkpoint (each owner then checks its own part)."""
    if not isinstance(state, dict):
        raise CheckpointError(f"not a training checkpoint: it has no {STATE_FILE} dict of the training state; {_HINT}")
    if "extra" in state and "loop" not in state and isinstance(state.get("optim"), dict):
        raise CheckpointError("a checkpoint saved by Strategy.save_checkpoint in a hand-written loop, without the "
                              "Trainer's parts (loop, hooks, results): resume it with strategy.resume(), or take its "
                              "weights with load_from=")
    for part in ENTRIES:
        if part == "param_schedulers" and part not in state:
            continue  # saved with save_param_scheduler=False: the schedulers start afresh
        if part == "frozen" and part not in state:
            continue  # named by the strategy's resume, after what a weights-only checkpoint lacks
        kind = list if part == "data" else (dict, list) if part == "param_schedulers" else dict
        if not isinstance(state.get(part), kind):
            what = "list" if kind is list else "dict"
            raise CheckpointError(f"not a complete training checkpoint: {STATE_FILE} has no {part!r} {what} "
                                  f"(it has {sorted(state)}); {_HINT}")


def finished(pos: dict[str, Any], max_epochs: int | None, max_iters: int | None, by_epoch: bool) -> bool:
    """A checkpoint at loop position ``pos`` is of a finished run: every iteration (or
    epoch) done, and no open epoch or due validation left."""
    done = (max_iters is not None and pos["iter"] >= max_iters) or (
        by_epoch and max_epochs is not None and pos["epoch"] >= max_epochs)
    return bool(done and not (pos["open"] or pos.get("val_due")))


class LoopPlace:
    """The training loop's data place as a loader's (``ResumableLoader.state_dict``:
    epoch, batches taken in it, shuffle seed), for the checkpoint's ``data`` entry, where
    a hand-written loop's loader takes it. The Trainer resumes its place from the
    ``loop`` entry (which also knows the workflow phase and the world size that saved):
    loading this one is left to the loop."""

    def __init__(self, loop: TrainLoop) -> None:
        self.loop = loop

    def state_dict(self) -> dict[str, Any]:
        return place_of(self.loop.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: the ``loop`` entry holds the same place."""

    def stream_state_dict(self) -> Any:
        """The training stream's own position, for this rank's file (``TrainLoop.stream_state_dict``)."""
        return self.loop.stream_state_dict()

    def load_stream_state_dict(self, state: Any) -> None:
        """The reopened epoch goes on from it (``TrainLoop.resume_stream``)."""
        self.loop.resume_stream(state)


def trainer_parts(trainer: "Trainer") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(parts, rank_parts)``: the Trainer's own Statefuls, by name, beside the strategy's."""
    strategy = trainer.strategy
    loop = trainer.train_loop if trainer.train_loop is not None else LoopCounters(
        trainer.state, strategy.data_seed, strategy.world_size)
    parts = {"loop": loop, "hooks": HookStates(lambda: trainer.hooks), "results": trainer.state}
    rank_parts: dict[str, Any] = {"log_windows": trainer.store}
    if trainer.val_loop is not None:
        rank_parts["val"] = trainer.val_loop
    if trainer.train_metrics is not None:
        rank_parts["train_metrics"] = trainer.train_metrics
    return parts, rank_parts


def save_frozen(trainer: "Trainer") -> bool:
    """Whether the Trainer's checkpoints hold the frozen weights: ``checkpoint=dict(save_frozen=True)``,
    for every save of the run (the CheckpointHook's setting; a preemption's save follows it)."""
    return any(h.save_frozen for h in trainer.hooks if isinstance(h, CheckpointHook))


def trainer_states(trainer: "Trainer") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(states, rank_states)``: every owner of ``trainer``'s training state, by name, as
    the strategy hands them to its checkpointer."""
    return trainer.strategy.checkpoint_states(*trainer_parts(trainer), save_frozen=save_frozen(trainer))


def save(trainer: "Trainer", path: str | Path, writer: Callable[..., Path] | None = None) -> Path:
    """``Trainer.save_checkpoint``: the Trainer's parts handed to ``strategy.save_checkpoint``,
    the manifest's meta (position, finished), the ``before_save_checkpoint`` hooks."""
    parts, rank_parts = trainer_parts(trainer)
    pos, s = parts["loop"].state_dict(), trainer.state
    meta = {"epoch": pos["epoch"], "iter": pos["iter"], "finished": finished(pos, s.max_epochs, s.max_iters, s.by_epoch)}
    place = board()  # where this rank is, for the stall watch
    phase_before, place[PHASE] = place[PHASE], CHECKPOINT
    try:
        # Checked on every rank (FSDP: each its shards), agreed on, raised everywhere alike.
        return trainer.strategy.save_checkpoint(
            path, parts=parts, rank_parts=rank_parts, meta=meta, writer=writer, save_frozen=save_frozen(trainer),
            callback=functools.partial(trainer.call_hook, "before_save_checkpoint"), explain_nonfinite=_NONFINITE)
    finally:
        place[PHASE] = phase_before


def load(trainer: "Trainer", path: str | Path) -> None:
    """``Trainer.load_checkpoint``: ``strategy.resume`` with the Trainer's parts (every
    owner checks its part, then all load); the train loop takes this rank's RNG to set
    where the interrupted run took its next batch. The caller says what was resumed."""
    strategy = trainer.strategy
    parts, rank_parts = trainer_parts(trainer)
    seen: dict[str, Any] = {}

    def check(state: Any) -> None:
        check_training_checkpoint(state)
        seen["state"] = state

    def take_rng(own: dict[str, Any] | None) -> None:
        saved_world = int(seen["state"]["loop"].get("world_size") or 1)
        if own is None and strategy.distributed and saved_world == strategy.world_size:
            raise FileNotFoundError(f"the checkpoint has no {rng_file(strategy.rank)}; it was not saved by this job")
        seen["own"] = own

    strategy.resume(path, parts=parts, rank_parts=rank_parts, callback=check, rng=take_rng)
    if trainer.train_loop is not None:
        trainer.train_loop.resume_rng(seen["own"])
    trainer.call_hook("after_load_checkpoint", seen["state"])


__all__ = ["ENTRIES", "PARTS", "LoopPlace", "check_training_checkpoint", "finished", "load", "save", "save_frozen",
           "trainer_parts", "trainer_states"]
