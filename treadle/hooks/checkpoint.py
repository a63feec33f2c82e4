"""CheckpointHook: periodic, last-N, best-K and final checkpoints."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.checkpoint.async_save import AsyncCheckpointer
from treadle.checkpoint.directory import prune_checkpoints, remove_own_checkpoint
from treadle.checkpoint.io import CheckpointError
from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger
from treadle.metrics import higher_is_better

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class CheckpointHook(Hook):
    """Save the complete training state so a run can resume exactly.

    Args:
        interval: save every ``interval`` epochs (``by_epoch=True``) or iterations;
            None: no periodic saves (the default hook: only the final save).
        by_epoch: epochs or iterations. Epoch checkpoints are taken in
            ``after_train_epoch`` (after the epoch's scheduler steps), iteration ones
            in ``after_train_iter``; both resume exactly (see treadle/engine/snapshot.py).
        keep: keep the last ``keep`` periodic checkpoints of this run (None or 0: keep
            all); an earlier run's checkpoints in the same directory are never removed.
        best: a validation metric such as "val/acc": also keep the ``keep_best`` best
            weights (model and EMA, not the full state) under ``checkpoints/best/``.
        rule: "max" or "min" for ``best``; default: inferred from the name ("min" for
            losses and errors such as ``val/loss`` or ``val/top1_err``, "max" for scores
            such as ``val/acc`` or ``val/mAP``, see treadle.metrics.higher_is_better),
            and an error when the name does not say. ``"auto"`` (MMEngine's
            ``save_best='auto'``): the first validation result that is not a loss,
            chosen at the first validation, its rule inferred then.
        save_last: save when training ends.
        async_save: periodic and final saves return once the state is copied to CPU
            memory (pinned buffers on CUDA) and are written by a background thread,
            atomically as a synchronous save is (treadle/checkpoint/async_save.py).
            One save at a time: the next save, any other save (e.g. on preemption)
            and the end of the run wait for it; its error is raised there. Pruning
            (``keep``) runs after the write, in that thread. Best-K saves stay synchronous.
        save_frozen: the parameters that do not train (``requires_grad=False``: a PEFT
            model's base, a frozen backbone) go into every checkpoint too, which is then
            self-contained (``Strategy.save_checkpoint(save_frozen=True)``). By default a
            checkpoint holds their digests only, and a resume needs the same frozen
            weights (another base is refused). Every save of the run follows it (a
            preemption's too).
    Checkpoints go to ``work_dir/checkpoints/{epoch_0003,iter_00000120}/``. A run never
    replaces or deletes what it did not save: a name that holds another run's checkpoint
    (or anything else) gets ``-v1``, ``-v2``... (see ``Trainer.checkpoint_path``); best-K
    records are kept relative to the work_dir, and one is deleted only when it lies in
    ``checkpoints/best/`` and its manifest names this run.
    Priority VERY_LOW: hooks with a larger number run after the save.
    """

    priority = Priority.VERY_LOW

    def __init__(self, interval: int | None = 1, by_epoch: bool = True, keep: int | None = 3, best: str | None = None,
                 rule: str | None = None, keep_best: int = 1, save_last: bool = True, async_save: bool = False,
                 save_frozen: bool = False) -> None:
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
            raise ValueError(f"checkpoint interval must be an int >= 1 or None, got {interval!r}")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            raise ValueError(f"checkpoint keep must be an int >= 0 or None, got {keep!r}")
        if rule not in (None, "max", "min"):
            raise ValueError(f"checkpoint rule must be 'max' or 'min', got {rule!r}")
        if isinstance(keep_best, bool) or not isinstance(keep_best, int) or keep_best < 1:
            raise ValueError(f"checkpoint keep_best must be an int >= 1, got {keep_best!r}")
        if best is not None and (not isinstance(best, str) or not best):
            raise TypeError(f"checkpoint best={best!r}; expected the name of a validation result such as 'val/acc', "
                            "or None")
        for name, flag in (("by_epoch", by_epoch), ("save_last", save_last), ("save_frozen", save_frozen)):
            if not isinstance(flag, bool):
                raise TypeError(f"checkpoint {name}={flag!r}; expected True or False")
        self.interval = interval
        self.by_epoch = by_epoch
        self.keep = keep
        self.best = best
        self._given_rule = rule
        if best is not None and best != "auto" and rule is None:
            higher = higher_is_better(best)
            if higher is None:
                raise ValueError(f"checkpoint best={best!r}: its name does not say whether higher or lower is "
                                 "better; give rule='max' or rule='min'")
            rule = "max" if higher else "min"
        self.rule = rule or "max"
        self.keep_best = keep_best
        self.save_last = save_last
        self.save_frozen = save_frozen
        if (by_epoch or not interval) and not async_save:  # nothing to do per iteration: not even a call
            self.disabled_points = frozenset({"after_train_iter"})
        if not isinstance(async_save, bool):
            raise TypeError(f"checkpoint async_save must be True or False, got {async_save!r}")
        self.async_save = async_save
        self._saver: AsyncCheckpointer | None = None  # built at the first asynchronous save
        self._reserve_pending = False  # async: reserve the saver's buffers after the first iteration
        if not async_save:  # nothing to wait for
            self.disabled_points = self.disabled_points | {"before_save_checkpoint", "after_run"}
        # (value, path relative to work_dir), best first; "" for a best this run does not
        # track (a record from an older checkpoint that points elsewhere): ranked, never deleted.
        self.best_records: list[tuple[float, str]] = []
        self.last_saved: str | None = None
        # What changed since the last save, which a final save of the same name then records:
        # None, "epoch" (an epoch closed) or "validation" (a validation ran: hook states too).
        self._moved: str | None = None

    # -- when ------------------------------------------------------------------------
    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        if self._reserve_pending:  # async saves: once, after the first step made the optimizer state
            self._reserve_pending = False
            self._reserve(trainer)
        if not self.by_epoch and self.interval and (trainer.state.iter + 1) % self.interval == 0 \
                and not self._final_save_follows(trainer):
            self._save_periodic(trainer, f"iter_{trainer.state.iter + 1:08d}")

    def _final_save_follows(self, trainer: "RunView") -> bool:
        """The run's last iteration, with no validation in the run: the final save of the
        same name follows once the epoch has closed, so the periodic one would be
        written twice."""
        s, loop = trainer.state, trainer.train_loop
        return bool(self.save_last and s.max_iters and s.iter + 1 == s.max_iters and loop is not None
                    and not any(mode == "val" for mode, _ in loop.workflow))

    def after_train_epoch(self, trainer: "RunView") -> None:
        self._moved = self._moved or "epoch"  # the state a final save records is no longer the last save's
        complete = trainer.train_loop is None or trainer.train_loop.closing_complete
        if complete and self.by_epoch and self.interval and (trainer.state.epoch + 1) % self.interval == 0:
            self._save_periodic(trainer, f"epoch_{trainer.state.epoch + 1:04d}")

    def after_train(self, trainer: "RunView") -> None:
        if self.save_last and not trainer.state.preempted:
            s = trainer.state
            inside = trainer.train_loop is not None and trainer.train_loop.stopped_inside_epoch  # a stop mid-epoch
            name = f"epoch_{s.epoch:04d}" if self.by_epoch and s.by_epoch and not inside else f"iter_{s.iter:08d}"
            self._save_periodic(trainer, name)

    def _choose_best(self, metrics: dict[str, Any]) -> None:
        """``best="auto"``: the first result that is not a loss (the first metric)."""
        chosen = next((k for k in metrics if "loss" not in k.rsplit("/", 1)[-1].lower()), None)
        if chosen is None:
            raise KeyError(f"checkpoint best='auto' needs a validation metric besides the losses; the validation "
                           f"results are {sorted(metrics)}")
        if self._given_rule is None:
            higher = higher_is_better(chosen)
            if higher is None:
                raise ValueError(f"checkpoint best='auto' chose {chosen!r}, whose name does not say whether higher "
                                 "or lower is better; give rule='max' or rule='min'")
            self.rule = "max" if higher else "min"
        self.best = chosen

    def after_val_epoch(self, trainer: "RunView", metrics: dict[str, Any]) -> None:
        if trainer.state.mode == "val":
            self._moved = "validation"  # hook states (best, plateau, early stopping) changed
        if self.best is None or trainer.state.mode != "val" or trainer.work_dir is None:
            return
        if self.best == "auto":
            self._choose_best(metrics)
        if self.best not in metrics:
            raise KeyError(f"checkpoint best={self.best!r} is not among the validation results {sorted(metrics)}")
        value = float(metrics[self.best])
        if math.isnan(value):
            return
        sign = -1.0 if self.rule == "max" else 1.0
        ranked = sorted([*self.best_records, (value, "")], key=lambda r: sign * r[0])
        if ranked.index((value, "")) >= self.keep_best:
            return
        s = trainer.state
        metric = self.best.replace("/", "_")
        path = trainer.checkpoint_path(f"best/best_{metric}_{s.iter:08d}")
        model = trainer.strategy.get_full_model_state(trainer.module)  # FSDP: a gather, on every rank
        weights = {"model": model}
        if trainer.ema is not None:
            weights["ema"] = trainer.ema.state_dict()
        try:  # the one checkpointer: its atomic write, its non-finite check (rank 0 holds the full weights)
            meta = {"iter": s.iter, "epoch": s.epoch, self.best: value, "model": trainer.strategy.model_info}
            trainer.checkpointer.save_weights(path, weights, meta=meta, run=trainer.run_id)
        except FloatingPointError as e:  # not a best worth keeping, whatever the metric says
            get_logger().warning(f"best {self.best} = {value:.6g}: not saved: {e}")
            return
        relative = path.relative_to(trainer.work_dir).as_posix()
        self.best_records = sorted([*self.best_records, (value, relative)], key=lambda r: sign * r[0])
        for _, old in self.best_records[self.keep_best:]:
            if trainer.is_main and old:
                _remove_best(trainer, old)
        self.best_records = self.best_records[: self.keep_best]
        get_logger().info(f"best {self.best} = {value:.6g}: saved {path}")

    # -- asynchronous saves: buffers reserved early, a wait before any other save and at the end
    def before_train(self, trainer: "RunView") -> None:
        self._reserve_pending = self.async_save and trainer.work_dir is not None

    def _reserve(self, trainer: "RunView") -> None:
        """Allocate the first save's CPU buffers in the background now, so that no save
        blocks on allocating and faulting in memory (see AsyncCheckpointer.reserve).
        Rank 0 writes everything but FSDP's shards, which DCP copies itself."""
        if not trainer.is_main or trainer.strategy.name == "fsdp":
            return
        if self._saver is None:
            self._saver = AsyncCheckpointer()
        states, rank_states = trainer.checkpoint_states()
        self._saver.reserve(trainer.checkpointer.payloads(states, rank_states))  # the states' own tensors: no copy

    def before_save_checkpoint(self, trainer: "RunView", checkpoint: dict[str, Any]) -> None:
        if self._saver is not None:  # e.g. a preemption save: never two writes at once
            self._saver.wait()

    def after_run(self, trainer: "RunView") -> None:
        if self._saver is not None:
            self._saver.wait()  # the run ends with its checkpoints on disk (or their error)

    # -- how -------------------------------------------------------------------------
    def _save_periodic(self, trainer: "RunView", name: str) -> None:
        if trainer.work_dir is None:
            return
        # The final save right after a periodic one of the same name is skipped, unless an
        # epoch closed or a validation ran in between: then it records that (finished) state.
        if self.last_saved == name and self._moved is None:
            return
        again = self._moved if self.last_saved == name else None  # the final save: same name, newer state
        self.last_saved = name  # before saving: the hook state goes into the checkpoint
        self._moved = None
        ckpt_dir = trainer.work_dir / "checkpoints"
        prune = self.keep if trainer.is_main else None
        if self._saver is not None:  # the name is claimed once the save before is on disk
            self._saver.wait()
        path = trainer.checkpoint_path(name)
        if not self.async_save or not trainer.strategy.async_saves:  # DeepSpeed: always synchronous
            path = trainer.save_checkpoint(path)
            _saved(path, ckpt_dir, prune, trainer.run_id, again)
            return
        if self._saver is None:
            self._saver = AsyncCheckpointer()
        path = trainer.save_checkpoint(path, writer=functools.partial(
            self._saver.save, on_done=functools.partial(_saved, checkpoints=ckpt_dir, keep=prune, run=trainer.run_id,
                                                        again=again)))
        if trainer.is_main:
            get_logger().info(f"checkpoint {path}: state copied, writing in the background")

    def state_dict(self) -> dict[str, Any]:
        return {"best_records": [list(r) for r in self.best_records], "last_saved": self.last_saved}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restored state is input: a best record is ``[value, "checkpoints/best/<name>"]``;
        anything else stays out of the records (with a warning), and so is never deleted."""
        records = []
        for record in state.get("best_records", []):
            value, path = record if isinstance(record, (list, tuple)) and len(record) == 2 else (None, None)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(path, str):
                get_logger().warning(f"ignoring a malformed best record in the checkpoint: {record!r}")
                continue
            if path and not _is_best_name(path):
                get_logger().warning(f"checkpoint best record {path!r} is not a name in {BEST_DIR}/: it still "
                                     "ranks, but this run will never delete it")
                path = ""
            records.append((float(value), path))
        self.best_records = records
        last = state.get("last_saved")
        self.last_saved = last if isinstance(last, str) else None


BEST_DIR = "checkpoints/best"


def _is_best_name(relative: str) -> bool:
    """``checkpoints/best/<one plain name>``: nothing else may be a record to delete."""
    head, _, name = relative.rpartition("/")
    return head == BEST_DIR and bool(name) and not name.startswith(".") and "\\" not in name and "\0" not in name


def _remove_best(trainer: "RunView", relative: str) -> None:
    """Delete a best checkpoint that fell out of the best K, if this run saved it."""
    path = Path(trainer.work_dir) / relative
    if not path.exists() and not path.is_symlink():
        return  # e.g. a record carried over from another work_dir (a resume from elsewhere)
    try:
        remove_own_checkpoint(path, trainer.run_id, within=Path(trainer.work_dir) / BEST_DIR)
    except CheckpointError as e:
        get_logger().warning(f"checkpoint best-K: {e}")


def _saved(path: Path, checkpoints: Path, keep: int | None, run: str, again: str | None = None) -> None:
    """After a save is complete: prune to the last ``keep`` and say so (in the writer
    thread for asynchronous saves); ``again``: the save replaced this run's checkpoint of
    the same name with the state after what followed it ("validation": the final
    validation; "epoch": the close of the epoch), which is said as such.

    Only this run's checkpoints are pruned, in the order they were saved: an earlier
    run's in the same directory are never deleted, and after a resume from an earlier
    point the new saves count as the newest.
    """
    if keep:
        prune_checkpoints(checkpoints, keep_last=keep, run=run, order="created")
    if again:
        after = "the last validation" if again == "validation" else "the end of its epoch"
        get_logger().info(f"updated checkpoint {path}: it now holds the state after {after}")
    else:
        get_logger().info(f"saved checkpoint {path}")
