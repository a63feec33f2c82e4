"""Validation and test passes: ``EvalLoop`` runs one (or ``k`` batches of an endless
feed, for iteration workflows), over one loader or several named sets, with the hooks' ``before_val`` ... ``after_val`` points
(see treadle/engine/loops.py for where it sits in ``fit()``): metrics updated with float32
outputs, losses averaged over the dataset, results summed over ranks, and under FSDP
every rank running as many batches (forward all-gathers parameters)."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import torch
from torch import Tensor

from treadle.data.feed import DataFeed
from treadle.distributed.board import EVAL, PHASE, TEST, VALIDATION, board
from treadle.hooks.base import HookDispatcher
from treadle.metrics import compute, flatten_results, result_prefix, to_python, update_metrics
from treadle.engine.step import batch_size_of

if TYPE_CHECKING:
    from torch import nn

    from treadle.hooks.state import TrainState


@dataclass(frozen=True)
class EvalComm:
    """An evaluation across several processes: this rank, and whether every rank must run
    as many batches (FSDP gathers parameters inside forward: its collectives pair up)."""

    rank: int
    lockstep: bool
    group: Any = None  # the ranks that read different data (the layout's data_object_group); None: every rank


def loader_sets(value: Any) -> dict[str, Any] | None:
    """Several evaluation sets: ``value`` as ``{name: loader or loader spec}``, or None when
    it is one loader (or one loader's spec: a mapping with a ``dataset``). A mapping is
    several sets when it has no ``dataset`` key, at least one entry, and every value is a
    loader spec (a mapping with a ``dataset``) or an iterable that is no mapping."""
    if not isinstance(value, Mapping) or "dataset" in value or not value:
        return None
    for v in value.values():
        if isinstance(v, Mapping) and "dataset" not in v:
            return None
        if not isinstance(v, Mapping) and (isinstance(v, (str, bytes)) or not isinstance(v, Iterable)):
            return None
    return dict(value)


def check_set_names(sets: Mapping[Any, Any], arg: str) -> None:
    """Set names are logged as ``val/<name>/<metric>``: non-empty strings without ``/``."""
    for name in sets:
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"{arg}: set name {name!r}; expected a non-empty str without '/' (results are logged "
                             f"as val/<name>/<metric>)")


class EvalLoop:
    """One validation or test pass: metrics with update/compute/reset, mean losses.

    ``loader`` is one loader, or several sets as ``{name: loader}``: a pass then runs each
    set in turn (between one ``before_<mode>_epoch`` and one ``after_<mode>_epoch``), the
    metrics reset before each, and its results are logged under ``<mode>/<name>/``
    (``val/clean/acc``, ``val/clean/loss``)."""

    def __init__(self, owner: Any, loader: Iterable[Any] | Mapping[str, Iterable[Any]], mode: str, *,
                 hooks: HookDispatcher, state: TrainState, model: nn.Module, metrics: dict[str, Any],
                 step: Callable[[Any], tuple[Any, Any, dict[str, Any]]],
                 custom_step: Callable[[Any], dict[str, Any]] | None = None, seed: int | None = None,
                 seed_per_sample: bool = True, comm: EvalComm | None = None, limit: int | None = None) -> None:
        self.owner = owner  # what the hooks receive (the Trainer)
        self.mode = mode  # "val" | "test"
        self.hooks, self.state, self.model, self.metrics = hooks, state, model, metrics
        self.step = step  # batch -> (outputs, targets, values to log)
        self.custom_step = custom_step  # the model's val_step(batch, trainer): values to log
        self.comm = comm  # several processes: how results are summed, and lockstep (FSDP)
        # Started at the first pass: no workers before. One feed per set (None: one loader, no name).
        sets = loader_sets(loader)
        self.named = sets is not None
        self.feeds: dict[str | None, DataFeed] = {
            name: DataFeed(one, seed=seed, seed_per_sample=seed_per_sample, limit=limit)
            for name, one in (sets.items() if sets is not None else [(None, loader)])}
        self._passes = 0
        self._empty: set[str] = set()  # the sets found without a batch (said once each)
        self._not_numbers: set[str] = set()  # results found not to be numbers (said once each)

    @property
    def set_names(self) -> list[str] | None:
        """The sets' names, in order, or None for one loader."""
        return [str(n) for n in self.feeds] if self.named else None

    @property
    def feed(self) -> DataFeed:
        """The first set's feed (the only one for one loader)."""
        return next(iter(self.feeds.values()))

    def close(self) -> None:
        """Stop every set's loader workers (see DataFeed.close)."""
        for feed in self.feeds.values():
            feed.close()

    def state_dict(self) -> dict[str, Any]:
        """Passes done and where each feed is: iteration workflows validate ``k`` batches
        at a time and go on where the last phase stopped; checkpoints record it (each
        rank its own: each reads its shard). Several sets: ``sets`` holds each one's place."""
        if not self.named:
            return {"passes": self._passes, "epoch": self.feed.epoch, "batch_idx": self.feed.batch_idx}
        return {"passes": self._passes, "sets": {name: {"epoch": f.epoch, "batch_idx": f.batch_idx}
                                                 for name, f in self.feeds.items()}}

    def load_state_dict(self, pos: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (on resume). A set the checkpoint does not know
        starts from its beginning."""
        self._passes = int(pos["passes"])
        if not self.named:
            self.feed.start_epoch(int(pos["epoch"]), skip=int(pos["batch_idx"]))
            return
        places = pos.get("sets") or {}
        for name, feed in self.feeds.items():
            place = places.get(name)
            if place is not None:
                feed.start_epoch(int(place["epoch"]), skip=int(place["batch_idx"]))

    def run(self, num_iters: int | None = None) -> dict[str, Any]:
        """A full pass (``num_iters=None``) or ``num_iters`` batches of each set from an
        endless feed (iteration workflows); returns ``{"<mode>/<name>": value}``
        (several sets: ``{"<mode>/<set>/<name>": value}``)."""
        t, mode, hooks = self.owner, self.mode, self.hooks
        state = self.state
        prev_mode = state.mode
        state.mode = mode
        place = board()  # where this rank is, for the stall watch
        phase_before, place[PHASE], place[EVAL] = place[PHASE], VALIDATION if mode == "val" else TEST, 0
        hooks.call(f"before_{mode}", t)
        hooks.call(f"before_{mode}_epoch", t)
        model = self.model
        was_training = model.training
        model.eval()
        if num_iters is None:
            passes = self._passes
            self._passes += 1
        results: dict[str, Any] = {}
        for name, feed in self.feeds.items():
            if num_iters is None:
                feed.start_epoch(passes)
            results.update(self._pass(feed, mode if name is None else f"{mode}/{name}", num_iters))
        model.train(was_training)
        state.metrics.update(results)
        hooks.call(f"after_{mode}_epoch", t, results)
        hooks.call(f"after_{mode}", t, results)
        state.mode = prev_mode
        place[PHASE] = phase_before
        return results

    def _pass(self, feed: DataFeed, prefix: str, num_iters: int | None) -> dict[str, Any]:
        """One set's batches: its results under ``prefix``."""
        t, mode, d = self.owner, self.mode, self.hooks.table
        before_iter, after_iter = d[f"before_{mode}_iter"], d[f"after_{mode}_iter"]
        step, custom_step = self.step, self.custom_step
        metrics = self.metrics
        for m in metrics.values():
            m.reset()
        sums: dict[str, Tensor] = {}
        count = 0
        # FSDP gathers parameters inside forward: every rank must run as many batches.
        lockstep = num_iters is None and self.comm is not None and self.comm.lockstep
        target = _most_batches(feed.length) if lockstep else 0  # before any forward: collectives pair up
        batch = None
        place = board()
        with torch.no_grad():
            for batch in self._batches(feed, num_iters):
                place[EVAL] += 1
                for fn in before_iter:
                    fn(t, batch)
                if custom_step is not None:
                    logged, n = custom_step(batch), 1
                else:
                    outputs, targets, logged = step(batch)
                    update_metrics(metrics, outputs, targets, mode)  # float32 outputs; errors with a hint
                    n = batch_size_of(targets)
                for k, v in logged.items():  # weighted by batch size: the dataset mean
                    v = v.detach().float() * n if isinstance(v, Tensor) else float(v) * n
                    sums[k] = sums[k] + v if k in sums else v
                count += n
                for fn in after_iter:
                    fn(t, batch, logged)
            if lockstep:
                self._replay_for_lockstep(target - feed.batch_idx, batch)
        totals = {k: to_python(v) for k, v in sums.items()}  # one host read per evaluation
        if self.comm is not None:  # each rank saw its own share of the samples: add them up
            totals, count = _sum_over_ranks(totals, count, self.comm.group)
        if count == 0 and prefix not in self._empty:  # a loader without a length that yielded nothing
            self._empty.add(prefix)
            if self.comm is None or self.comm.rank == 0:
                from treadle.logging.writers import get_logger

                get_logger().warning(f"the {prefix} loader yielded no batches: its metrics are nan (said once)")
        results = {f"{prefix}/{k}": v / max(count, 1) for k, v in totals.items()}
        group = self.comm.group if self.comm is not None else None
        for name, m in metrics.items():
            results.update(flatten_results(result_prefix(prefix, name, m), compute(m, group)))
        self._say_not_numbers(results)
        return results

    def _say_not_numbers(self, results: dict[str, Any]) -> None:
        """A result that is not a number (a metric's str, list or None) goes to log.jsonl and
        the console, and no number-only writer takes it (TensorBoard, CSV plots, the
        report): said once per key, on rank 0."""
        odd = [k for k, v in results.items() if isinstance(v, bool) or not isinstance(v, Real)]
        for key in odd:
            if key in self._not_numbers:
                continue
            self._not_numbers.add(key)
            if self.comm is None or self.comm.rank == 0:
                from treadle.logging.writers import get_logger

                value = results[key]
                get_logger().warning(f"{key} is a {type(value).__name__} ({value!r:.40}), not a number: it is kept "
                                     "in log.jsonl and the console lines, but TensorBoard and the report's plots take "
                                     "numbers only (said once)")

    def _batches(self, feed: DataFeed, num_iters: int | None) -> Iterable[Any]:
        if num_iters is None:
            yield from feed
            return
        for _ in range(num_iters):  # endless: wrap around at the end of the loader
            try:
                yield next(feed)
            except StopIteration:
                feed.start_epoch(feed.epoch + 1)
                try:
                    yield next(feed)
                except StopIteration:
                    raise RuntimeError(f"the {self.mode} loader yielded no batches") from None

    def _replay_for_lockstep(self, extra: int, last: Any) -> None:
        """Ranks with fewer evaluation batches repeat forward passes (results dropped) until
        every rank has run as many: the collectives inside forward then always pair up."""
        if extra and last is None:
            rank = self.comm.rank if self.comm is not None else 0
            raise RuntimeError(f"rank {rank} has no {self.state.mode} batch while others have {extra}: "
                               "the dataset is smaller than the number of processes")
        for _ in range(extra):
            if self.custom_step is not None:
                self.custom_step(last)
            else:
                self.step(last)


def _most_batches(length: int | None) -> int:
    """The largest number of evaluation batches of any rank."""
    from treadle.distributed.comm import all_gather_object

    if length is None:
        raise RuntimeError("evaluation in lockstep (FSDP) needs loaders with a length")
    return max(all_gather_object(length))


def _sum_over_ranks(totals: dict[str, float], count: int, group: Any) -> tuple[dict[str, float], int]:
    """Per-rank sums and sample counts made global (a rank may have no batches), over the
    ranks that read different data (tensor parallelism: each group's batches count once)."""
    from treadle.distributed.comm import all_gather_object

    summed: dict[str, float] = {}
    n = 0
    for rank_totals, rank_count in all_gather_object((totals, count), group=group):
        for k, v in rank_totals.items():
            summed[k] = summed.get(k, 0.0) + v
        n += rank_count
    return summed, n


__all__ = ["EvalComm", "EvalLoop", "check_set_names", "loader_sets"]
