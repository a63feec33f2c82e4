"""The loops: training by epochs or by iterations, validation and test.

This file is the whole training flow. ``trainer.fit()`` runs::

    before_run
    before_train
    for (mode, k) in workflow, repeated until training is done:
        "train": k epochs (EpochLoop) or k iterations (IterLoop), each epoch as
            before_train_epoch
            for batch in feed:                      # DataFeed: the only data path
                before_train_iter(batch)
                outputs = train_step(batch)         # after_backward and
                                                    # before_optimizer_step fire inside
                after_train_iter(batch, outputs)
                state.iter += 1
                [several processes: the ranks agree on stopping here]
            after_train_epoch
        "val": k validation passes (EpochLoop) or k validation iterations (IterLoop):
            before_val, before_val_epoch, (before_val_iter, after_val_iter)*,
            after_val_epoch(metrics), after_val(metrics)
    after_train
    after_run

The default workflow is ``[("train", val_interval), ("val", None)]`` when there is a
validation loader (``None``: one full pass), else ``[("train", everything)]``. This
gives MMEngine's rule for free: validate every ``val_interval`` epochs/iterations
and after the last one. A given workflow follows mmcv: ``[("train", 2), ("val", 1)]``
trains 2 epochs (iterations) then validates 1 pass (iteration), until training ends.
A hook that calls ``trainer.state.request_stop()`` ends training at the next
iteration boundary; the open epoch still gets its ``after_train_epoch`` (but counts as
unfinished: the final checkpoint resumes inside it). A preemption (``state.preempted``)
also stops at the boundary but leaves the epoch open, so the checkpoint taken there
resumes inside it.

Resuming: the loop starts from the counters in ``trainer.state`` and the position
``resume_pos``: epoch, batches taken, whether that epoch was open, and the workflow
phase with the units done in it (``phase``). It first finishes the interrupted cycle
from that phase, so a validation that was due right after the checkpoint still runs,
and an epoch left open in the very last iteration is still closed and validated. An
open epoch is reopened (``before_train_epoch`` runs again) with its first
``batch_idx`` batches skipped in the sampler.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, Mapping

from treadle.checkpoint.rng import set_rng_state
from treadle.data.feed import DataFeed
from treadle.distributed.board import (AFTER_TRAIN, BEFORE_TRAIN, COLLECTIVE, DATA, EPOCH_END, EPOCH_START, HOOKS, ITER,
                                       PHASE, RUN, STEP, board)
from treadle.distributed.voice import job_warning
from treadle.engine.eval_loop import EvalLoop
from treadle.hooks.base import HookDispatcher

if TYPE_CHECKING:
    from treadle.optim.wrapper import OptimWrapper
    from treadle.hooks.state import TrainState
    from treadle.logging.store import MetricStore

Workflow = list[tuple[str, "int | None"]]


@dataclass(frozen=True)
class LoopPosition:
    """Where training stands at an iteration boundary (what a checkpoint records).

    ``epoch``/``iter``: epochs and iterations done; ``inner_iter``/``batch_idx``: batches
    taken in the open epoch (``open``), whose shuffle ``seed`` and per-process
    ``batch_size`` a resume on another world size needs; ``phase``: the workflow phase
    and the units done in it; ``val_due``: a validation of this cycle has not run yet;
    ``max_epochs``/``max_iters``: the run's length as set (a resume says when it changed).
    ``world_size``: the processes that saved it, ``data_world`` the data shards they read
    (0: one per process, as in checkpoints before tensor parallelism) and ``tp`` the
    tensor-parallel ranks that shared each shard."""

    epoch: int
    iter: int
    inner_iter: int
    batch_idx: int
    open: bool
    seed: int
    batch_size: int | None
    phase: list[int]
    val_due: bool
    world_size: int = 1
    data_world: int = 0
    tp: int = 1
    # The run's length as its arguments set it (the other one None), for a resume to compare.
    max_epochs: int | None = None
    max_iters: int | None = None


class LoopCounters:
    """Where training stands when there is no train loop (a Trainer for validation or
    test only): the counters of ``state``, saved and restored as a loop's would be."""

    def __init__(self, state: "TrainState", seed: int, world_size: int) -> None:
        self.state, self.seed, self.world_size = state, seed, world_size

    def state_dict(self) -> dict[str, Any]:
        s = self.state
        return asdict(LoopPosition(epoch=s.epoch, iter=s.iter, inner_iter=0, batch_idx=0, open=False, seed=self.seed,
                                   batch_size=None, phase=[0, 0], val_due=False, world_size=self.world_size))

    def check_state_dict(self, state: Any) -> None:
        check_position(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.epoch, self.state.iter = int(state["epoch"]), int(state["iter"])


def _layout(pos: dict[str, Any]) -> tuple[int, int, int]:
    """``(processes, data shards, tp ranks per shard)`` of a saved position."""
    world = int(pos.get("world_size") or 1)
    return world, int(pos.get("data_world") or world), int(pos.get("tp") or 1)


def epochs_by_iterations(state: "TrainState", pos: dict[str, Any]) -> int | None:
    """An iteration-based run's ``max_epochs`` once resumed at ``pos``: the epochs done,
    the open one, and those the iterations left take at this run's epoch length. (From
    ``max_iters`` alone it would count the epochs done at another length as this one's:
    a run saved by 2 processes and resumed by 1 read ``epoch 3/2``.)"""
    length, max_iters = state.iters_per_epoch, state.max_iters
    if not length or max_iters is None:
        return state.max_epochs
    left = max(max_iters - int(pos["iter"]), 0)
    if pos.get("open"):
        in_open = max(length - int(pos["batch_idx"]), 0)
        return int(pos["epoch"]) + 1 + (-(-(left - in_open) // length) if left > in_open else 0)
    return int(pos["epoch"]) + -(-left // length)


def check_position(state: Any) -> None:
    """A saved loop position has the counters a resume needs (ints >= 0)."""
    from treadle.checkpoint.io import CheckpointError

    if not isinstance(state, dict):
        raise CheckpointError(f"the checkpoint's loop position is a {type(state).__name__}, not a dict")
    for key in ("epoch", "iter", "inner_iter", "batch_idx"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"the checkpoint's loop position has {key}={value!r}; expected an int >= 0")


class TrainLoop:
    """Shared by EpochLoop and IterLoop: the workflow driver and the batch loop."""

    by_epoch: bool

    def __init__(self, owner: Any, feed: DataFeed, workflow: Workflow, *, hooks: HookDispatcher,
                 state: TrainState, optim_wrappers: Mapping[str, OptimWrapper], step: Callable[[Any], Any],
                 store: MetricStore, val_loop: EvalLoop | None = None, agree: Callable[[], None] | None = None,
                 resume_pos: dict[str, Any] | None = None, world_size: int = 1, data_world: int | None = None,
                 tp: int = 1, accumulate_across_epochs: bool = False) -> None:
        self.owner = owner  # what the hooks receive (the Trainer)
        self.hooks, self.state, self.optim_wrappers, self.val_loop = hooks, state, optim_wrappers, val_loop
        self.step = step  # batch -> values to log (after_backward/before_optimizer_step fire inside)
        self.store = store  # records each step's outputs and times for the hooks that read them
        self.agree = agree  # None in one process; several: the ranks agree on stopping each iteration
        self.feed = feed
        self.workflow = workflow
        # The processes, the data shards they read and the tensor-parallel ranks per shard:
        # a resume from another layout keeps the samples taken, not the per-rank streams.
        self.world_size, self.data_world, self.tp = world_size, data_world or world_size, tp
        # Epoch-based: accumulation windows close at each epoch's end (False) or run on to the
        # end of training as in iteration-based training (True: MMEngine's rule).
        self.windows_span_epochs = accumulate_across_epochs or not self.by_epoch
        # Where a resumed run goes on (load_state_dict sets it; the first epoch opened takes it).
        self.resume_pos = resume_pos
        self._epoch_open = False
        self._closing_complete = False  # True while after_train_epoch runs for a complete epoch
        self._stopped_inside_epoch = False  # a stop closed the epoch early: a checkpoint resumes inside it
        # Where the workflow is: the phase running (or next, once a val phase is done) and
        # the units done before the train phase began; checkpoints record it (snapshot.py).
        self.phase = 0
        self.phase_base = 0
        self._fresh_seed = feed.seed

    def reset(self) -> None:
        """Before each ``fit()``: nothing open, nothing to resume (a resume then sets it)."""
        self.resume_pos = None
        self._epoch_open = self._closing_complete = self._stopped_inside_epoch = False
        self.phase = self.phase_base = 0
        self.feed.seed = self._fresh_seed

    def run(self) -> None:
        t, s = self.owner, self.state
        s.mode = "train"
        if self.windows_span_epochs and not (self.resume_pos and s.iter):  # windows run on to max_iters
            for ow in self.optim_wrappers.values():
                ow.start_run(s.max_iters - s.iter if s.max_iters else None)
        place = board()
        place[ITER], place[PHASE] = s.iter, BEFORE_TRAIN
        self.hooks.call("before_train", t)
        if self.resume_pos and not self.resume_pos["open"]:
            self._restore_rng(self.resume_pos)  # resuming between epochs: the next batch is near
        phase, done = self._start_point()
        # A resumed run first finishes the interrupted cycle (e.g. the validation that was
        # due right after the checkpoint), even when no training is left.
        pending = bool(phase or done)
        while pending or (not self._done() and not s.should_stop):
            pending = False
            for i in range(phase, len(self.workflow)):
                if s.should_stop:
                    break
                mode, k = self.workflow[i]
                self.phase, self.phase_base = i, self._units_done() - done
                if mode == "train":
                    self.train_phase(k - done)  # type: ignore[operator]  # only a val phase's count may be None
                else:
                    self.val_phase(k)
                    s.mode = "train"
                    self.phase, self.phase_base = i + 1, self._units_done()  # this validation is done
                done = 0
            phase = done = 0
        if s.preempted:  # leave the epoch open: the checkpoint resumes inside it
            return
        if self.resume_pos is not None and self.resume_pos["open"]:
            self._open_epoch()  # resumed inside the last epoch with nothing left to train: close it below
        if self._epoch_open:  # ended inside an epoch: keep epoch hooks paired
            feed = self.feed
            self._close_epoch(complete=feed.length is not None and feed.batch_idx >= feed.length)
        if self._done():  # nothing left but after_train (a stop keeps its place: a due validation stays due)
            self.phase, self.phase_base = len(self.workflow), self._units_done()
        place[PHASE] = AFTER_TRAIN
        self.hooks.call("after_train", t)
        place[PHASE] = RUN
        s.mode = "idle"

    def _start_point(self) -> tuple[int, int]:
        """``(phase, units done in it)`` to start from: the checkpoint's, or for a fresh run
        (and checkpoints older than the record) derived from the units done so far."""
        pos = self.resume_pos
        if pos is not None and pos.get("phase") is not None:
            phase, done = (int(v) for v in pos["phase"])
            if phase >= len(self.workflow):  # the cycle was complete
                return 0, 0
            return phase, done
        cycle = sum(k for m, k in self.workflow if m == "train")
        skip = self._units_done() % cycle if cycle else 0
        for i, (mode, k) in enumerate(self.workflow):
            if mode == "train":
                if skip >= k:  # this phase was finished before the interruption
                    skip -= k  # type: ignore[operator]  # only a val phase's count may be None
                    continue
                return i, skip
            if not skip:
                return i, 0
        return 0, 0

    @property
    def closing_complete(self) -> bool:
        """True while ``after_train_epoch`` runs for an epoch whose batches all ran."""
        return self._closing_complete

    @property
    def stopped_inside_epoch(self) -> bool:
        """A stop closed the epoch early: a checkpoint taken now resumes inside it."""
        return self._stopped_inside_epoch

    @property
    def epoch_open(self) -> bool:
        """An epoch has started and not closed (one a resume goes on in included, before it
        reopens): a validation now (iteration-based workflows) comes inside epoch
        ``state.epoch + 1``, as the train lines count it."""
        return self._epoch_open or bool(self.resume_pos is not None and self.resume_pos["open"])

    def position(self) -> "LoopPosition":
        """The iteration boundary a checkpoint taken now records. From ``after_train_iter``
        it already counts the running iteration (its step is done); from
        ``after_train_epoch`` of a complete epoch, that epoch."""
        s, feed = self.state, self.feed
        if self._epoch_open or self._stopped_inside_epoch:  # a stop that closed the epoch early resumes inside it
            pending = feed.batch_idx - s.inner_iter  # 1 while the iteration's after_train_iter runs
            epoch, it, inner, opened = s.epoch, s.iter + pending, feed.batch_idx, True
        else:
            epoch, it, inner, opened = s.epoch + (1 if self._closing_complete else 0), s.iter, 0, False
        phase, val_due = self.phase_position(epoch if self.by_epoch else it)
        return LoopPosition(epoch=epoch, iter=it, inner_iter=inner, batch_idx=inner, open=opened, seed=feed.seed,
                            batch_size=self.batch_size, phase=phase, val_due=val_due, world_size=self.world_size,
                            data_world=self.data_world, tp=self.tp,
                            max_epochs=s.max_epochs if s.by_epoch else None,
                            max_iters=None if s.by_epoch else s.max_iters)

    @property
    def batch_size(self) -> int | None:
        """The training loader's batch size (per process), None when it has none."""
        size = getattr(self.feed.loader, "batch_size", None)
        return size if isinstance(size, int) else None

    # -- Stateful: what a checkpoint holds of the loop ---------------------------------
    def state_dict(self) -> dict[str, Any]:
        """:meth:`position` as a dict."""
        return asdict(self.position())

    def check_state_dict(self, state: Any) -> None:
        check_position(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the counters and the place to resume from: :meth:`run` then goes on there
        (reopening an open epoch with its first ``batch_idx`` batches skipped). Saved by
        another number of processes, or with another batch size: the samples already taken
        are kept, counted in this run's batches. The RNG streams are set by :meth:`resume_rng`."""
        pos = dict(state)
        s = self.state
        s.epoch, s.iter, s.inner_iter = int(pos["epoch"]), int(pos["iter"]), int(pos["inner_iter"])
        saved_world, saved_data, saved_tp = _layout(pos)
        # Every rank finds it alike: said once, by rank 0 (treadle/distributed/voice.py).
        if saved_world != self.world_size:
            # The sampler splits the data differently: keep the number of samples taken.
            job_warning(f"resuming a run saved by {saved_world} process(es) on {self.world_size}: weights, optimizer "
                        "and counters are exact; the rest of the open epoch's order and the per-rank RNG streams "
                        "cannot be, so they restart from the same number of samples with fresh streams")
        elif (saved_data, saved_tp) != (self.data_world, self.tp):
            job_warning(f"resuming a run saved with {saved_data} data shard(s) x tp {saved_tp} on {self.data_world} x "
                        f"tp {self.tp}: weights, optimizer and counters are exact; the rest of the open epoch's "
                        "order and the per-rank RNG streams cannot be, so they restart from the same number of "
                        "samples with fresh streams")
        saved_batch, batch = pos.get("batch_size"), self.batch_size
        if not (isinstance(saved_batch, int) and isinstance(batch, int) and saved_batch > 0 and batch > 0):
            saved_batch = batch = 1  # unknown (older checkpoints): the per-process batch is assumed unchanged
        if (saved_data != self.data_world or saved_batch != batch) and pos.get("open"):
            # Other data shards or another batch size: the open epoch goes on after the samples already taken.
            pos["batch_idx"] = int(pos["batch_idx"]) * saved_data * saved_batch // (self.data_world * batch)
        if pos.get("seed") is not None:
            self.feed.seed = int(pos["seed"])
        pos["rng"] = None
        self.resume_pos = pos
        if not self.by_epoch:  # the epochs left, in this run's epoch length (another layout or batch size: another)
            s.max_epochs = epochs_by_iterations(s, pos)

    def resume_rng(self, rng: dict[str, Any] | None) -> None:
        """The RNG states (a rank file's) to set exactly where the interrupted run took its
        next batch; None: fresh streams. Not restored from a run of fewer processes than
        this one (there are ranks without a saved stream)."""
        if self.resume_pos is not None:
            saved_world, saved_data, saved_tp = _layout(self.resume_pos)
            same_split = saved_world != self.world_size or (saved_data, saved_tp) == (self.data_world, self.tp)
            self.resume_pos["rng"] = rng if self.world_size <= saved_world and same_split else None

    def stream_state_dict(self) -> Any:
        """Inside an epoch, the training stream's own position (``DataFeed.stream_state``:
        None for a loader that keeps none): this rank's, for its own checkpoint file."""
        return self.feed.stream_state() if self._epoch_open or self._stopped_inside_epoch else None

    def resume_stream(self, state: Any) -> None:
        """Go on from the stream's own position ``state`` when the open epoch is reopened
        (after :meth:`load_state_dict`), instead of reading its batches again: only when
        the same processes, shards and batch size saved it (else the place is counted in
        samples, and the stream is read up to it)."""
        pos = self.resume_pos
        if pos is None or not pos.get("open") or state is None:
            return
        same = _layout(pos) == (self.world_size, self.data_world, self.tp) and pos.get("batch_size") == self.batch_size
        if same:
            pos["stream"] = state

    def phase_position(self, units: int) -> tuple[list[int], bool]:
        """The workflow position a checkpoint taken now records (``units``: epochs or
        iterations done at that point), and whether a validation is still due in this cycle."""
        phase = self.phase
        val_due = any(m == "val" for m, _ in self.workflow[phase:])
        return [phase, units - self.phase_base], val_due

    def _done(self) -> bool:
        raise NotImplementedError

    def _units_done(self) -> int:
        raise NotImplementedError

    def train_phase(self, k: int) -> None:
        raise NotImplementedError

    def val_phase(self, k: int | None) -> None:
        raise NotImplementedError

    def _open_epoch(self) -> None:
        s = self.state
        pos, self.resume_pos = self.resume_pos, None
        self._stopped_inside_epoch = False
        board()[PHASE] = EPOCH_START
        skip = pos["batch_idx"] if pos and pos["open"] and pos["epoch"] == s.epoch else 0
        s.inner_iter = skip
        self.feed.start_epoch(s.epoch, skip=skip, stream=pos.get("stream") if skip else None)  # type: ignore[union-attr]  # skip > 0 only with a pos
        self._epoch_open = True
        if not self.windows_span_epochs and not skip:  # accumulation windows close at the end of each epoch
            for ow in self.optim_wrappers.values():  # (a resumed window keeps its count)
                ow.start_run(self.feed.length)
        self.hooks.call("before_train_epoch", self.owner)
        if pos and pos["open"]:
            self._restore_rng(pos)  # exactly where the interrupted run took its next batch

    @staticmethod
    def _restore_rng(pos: dict[str, Any]) -> None:
        if pos.get("rng") is not None:
            set_rng_state(pos["rng"])

    def _close_epoch(self, complete: bool) -> None:
        """after_train_epoch; the epoch counts as done only if all its batches ran."""
        self._epoch_open = False
        self._closing_complete = complete
        self._stopped_inside_epoch = not complete
        board()[PHASE] = EPOCH_END
        self.hooks.call("after_train_epoch", self.owner)
        self._closing_complete = False
        if complete:
            self.state.epoch += 1

    def _run_batches(self, limit: int | None) -> bool:
        """Train on the open epoch's batches, at most ``limit`` of them. Returns True
        when the epoch is exhausted. Everything here runs once per iteration.

        The store records each step's outputs and each iteration's times when its
        readers asked for them (the logger, the timer: ``MetricStore.recorders``): one
        list append each. Hooks that name the iterations they need
        (``Hook.next_train_iter``, e.g. the logger) are called only at those; the others
        at every iteration."""
        t, s = self.owner, self.state
        step, agree = self.step, self.agree
        before, after = self.hooks.table["before_train_iter"], self.hooks.table["after_train_iter"]
        every, due = self.hooks.after_train_iter_plan(s)
        next_due = self.hooks.next_due
        record, record_time = self.store.recorders()
        end = s.iter + limit if limit is not None else -1
        place = board()  # where this rank is, for the stall watch: one store per phase change
        place[ITER], place[PHASE] = s.iter, DATA
        clock = perf_counter
        tic = clock()
        for batch in self.feed:
            toc = clock()
            s.data_time = data_time = toc - tic
            s.iter_start_time = toc
            place[PHASE] = STEP
            for fn in before:
                fn(t, batch)
            outputs = step(batch)
            place[PHASE] = HOOKS
            if record is not None:
                record((s.iter, s.epoch, outputs))
            if s.iter == due:
                for fn in after:
                    fn(t, batch, outputs)
                s.iter += 1
                s.inner_iter += 1
                due = next_due(s)
            else:
                for fn in every:
                    fn(t, batch, outputs)
                s.iter += 1
                s.inner_iter += 1
            place[ITER] = s.iter
            if agree is not None:
                place[PHASE] = COLLECTIVE
                agree()
            place[PHASE] = DATA
            tic = clock()
            if record_time is not None:  # the whole iteration, its hooks included
                record_time((data_time, tic - toc))
            if s.iter == end or s.should_stop:
                return self.feed.batch_idx == self.feed.length
        return True


class EpochLoop(TrainLoop):
    """Train for ``max_epochs`` epochs; workflow counts are epochs."""

    by_epoch = True

    def _done(self) -> bool:
        s = self.state
        return s.epoch >= s.max_epochs  # type: ignore[operator]  # by epoch: max_epochs is set

    def _units_done(self) -> int:
        return self.state.epoch

    def train_phase(self, k: int) -> None:
        s = self.state
        for _ in range(k):
            resuming_inside = self.resume_pos is not None and self.resume_pos["open"]
            if (self._done() and not resuming_inside) or s.should_stop:
                return
            self._open_epoch()
            exhausted = self._run_batches(None)
            if s.preempted:
                return
            if self.feed.batch_idx == 0 and not s.should_stop:
                raise RuntimeError("the training loader yielded no batches in an epoch")
            self._close_epoch(complete=exhausted)

    def val_phase(self, k: int | None) -> None:
        for _ in range(k or 1):
            self.val_loop.run()  # type: ignore[union-attr]  # a val phase is in the workflow only with a val_loop


class IterLoop(TrainLoop):
    """Train for ``max_iters`` iterations over an endless loader (mmcv's IterLoader):
    the epoch counter advances each time the loader is exhausted; workflow counts
    are iterations."""

    by_epoch = False

    def _done(self) -> bool:
        s = self.state
        return s.iter >= s.max_iters  # type: ignore[operator]  # by iteration: max_iters is set

    def _units_done(self) -> int:
        return self.state.iter

    def train_phase(self, k: int) -> None:
        s = self.state
        pos = self.resume_pos
        if pos is not None and pos["open"] and self.feed.length is not None and pos["batch_idx"] >= self.feed.length:
            # Resumed right after an epoch's last batch (a preemption there): close that
            # epoch first, as the run would have before anything else.
            self._open_epoch()
            self._close_epoch(complete=True)
        remaining = min(k, s.max_iters - s.iter)  # type: ignore[operator]  # by iteration: max_iters is set
        while remaining > 0 and not s.should_stop:
            if not self._epoch_open:
                self._open_epoch()
            start = s.iter
            exhausted = self._run_batches(remaining)
            remaining -= s.iter - start
            if s.preempted:
                return
            if exhausted:
                if self.feed.batch_idx == 0:
                    raise RuntimeError("the training loader yielded no batches in an epoch")
                self._close_epoch(complete=True)

    def val_phase(self, k: int | None) -> None:
        self.val_loop.run(num_iters=k)  # type: ignore[union-attr]  # a val phase is in the workflow only with a val_loop


def default_workflow(by_epoch: bool, val_interval: int, has_val: bool, total: int) -> Workflow:
    """Train ``val_interval`` epochs/iterations then validate, or train throughout."""
    if has_val:
        return [("train", val_interval), ("val", None)]
    return [("train", total)]


def check_workflow(workflow: Any, has_val: bool) -> Workflow:
    """Validate a user workflow such as ``[("train", 2), ("val", 1)]``."""
    expected = "a list of (mode, count) pairs such as [('train', 2), ('val', 1)]"
    if not isinstance(workflow, (list, tuple)) or not workflow:
        raise ValueError(f"workflow must be {expected}, got {workflow!r}")
    out: Workflow = []
    for i, phase in enumerate(workflow):
        if not isinstance(phase, (list, tuple)) or len(phase) != 2:
            raise ValueError(f"workflow[{i}]={phase!r} must be a (mode, count) pair; workflow must be {expected}")
        mode, k = phase
        if mode not in ("train", "val"):
            raise ValueError(f"workflow[{i}] mode {mode!r} is not supported; expected 'train' or 'val'")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"workflow[{i}] count must be an int >= 1, got {k!r}")
        if mode == "val" and not has_val:
            raise ValueError(f"workflow[{i}] is a 'val' phase but no val_dataloader was given")
        out.append((mode, k))
    if not any(m == "train" for m, _ in out):
        raise ValueError(f"workflow {workflow!r} has no 'train' phase, so training would never end")
    return out
