"""Validation and test passes: ``EvalLoop`` runs one (or ``k`` batches of an endless
feed, for iteration workflows) with the hooks' ``before_val`` ... ``after_val`` points
(see treadle/engine/loops.py for where it sits in ``fit()``): metrics updated with float32
outputs, losses averaged over the dataset, results summed over ranks, and under FSDP
every rank running as many batches (forward all-gathers parameters)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch import Tensor

from treadle.data.feed import DataFeed
from treadle.hooks.base import HookDispatcher
from treadle.metrics import flatten_results, to_python, update_metrics
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


class EvalLoop:
    """One validation or test pass: metrics with update/compute/reset, mean losses."""

    def __init__(self, owner: Any, loader: Iterable[Any], mode: str, *, hooks: HookDispatcher,
                 state: TrainState, model: nn.Module, metrics: dict[str, Any],
                 step: Callable[[Any], tuple[Any, Any, dict[str, Any]]],
                 custom_step: Callable[[Any], dict[str, Any]] | None = None, seed: int | None = None,
                 seed_per_sample: bool = True, comm: EvalComm | None = None, limit: int | None = None) -> None:
        self.owner = owner  # what the hooks receive (the Trainer)
        self.mode = mode  # "val" | "test"
        self.hooks, self.state, self.model, self.metrics = hooks, state, model, metrics
        self.step = step  # batch -> (outputs, targets, values to log)
        self.custom_step = custom_step  # the model's val_step(batch, trainer): values to log
        self.comm = comm  # several processes: how results are summed, and lockstep (FSDP)
        # Started at the first pass: no workers before.
        self.feed = DataFeed(loader, seed=seed, seed_per_sample=seed_per_sample, limit=limit)
        self._passes = 0

    def state_dict(self) -> dict[str, int]:
        """Passes done and where the feed is: iteration workflows validate ``k`` batches
        at a time and go on where the last phase stopped; checkpoints record it (each
        rank its own: each reads its shard)."""
        return {"passes": self._passes, "epoch": self.feed.epoch, "batch_idx": self.feed.batch_idx}

    def load_state_dict(self, pos: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (on resume)."""
        self._passes = int(pos["passes"])
        self.feed.start_epoch(int(pos["epoch"]), skip=int(pos["batch_idx"]))

    def run(self, num_iters: int | None = None) -> dict[str, Any]:
        """A full pass (``num_iters=None``) or ``num_iters`` batches from an endless
        feed (iteration workflows); returns ``{"<mode>/<name>": value}``."""
        t, mode, hooks = self.owner, self.mode, self.hooks
        state, d = self.state, hooks.table
        prev_mode = state.mode
        state.mode = mode
        hooks.call(f"before_{mode}", t)
        hooks.call(f"before_{mode}_epoch", t)
        before_iter, after_iter = d[f"before_{mode}_iter"], d[f"after_{mode}_iter"]
        step, custom_step = self.step, self.custom_step
        metrics = self.metrics
        for m in metrics.values():
            m.reset()
        model = self.model
        was_training = model.training
        model.eval()
        sums: dict[str, Tensor] = {}
        count = 0
        if num_iters is None:
            self.feed.start_epoch(self._passes)
            self._passes += 1
        # FSDP gathers parameters inside forward: every rank must run as many batches.
        lockstep = num_iters is None and self.comm is not None and self.comm.lockstep
        target = _most_batches(self.feed.length) if lockstep else 0  # before any forward: collectives pair up
        batch = None
        with torch.no_grad():
            for batch in self._batches(num_iters):
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
                self._replay_for_lockstep(target - self.feed.batch_idx, batch)
        model.train(was_training)
        totals = {k: to_python(v) for k, v in sums.items()}  # one host read per evaluation
        if self.comm is not None:  # each rank saw its own share of the samples: add them up
            totals, count = _sum_over_ranks(totals, count)
        results = {f"{mode}/{k}": v / max(count, 1) for k, v in totals.items()}
        for name, m in metrics.items():
            results.update(flatten_results(f"{mode}/{name}", m.compute()))
        state.metrics.update(results)
        hooks.call(f"after_{mode}_epoch", t, results)
        hooks.call(f"after_{mode}", t, results)
        state.mode = prev_mode
        return results

    def _batches(self, num_iters: int | None) -> Iterable[Any]:
        if num_iters is None:
            yield from self.feed
            return
        for _ in range(num_iters):  # endless: wrap around at the end of the loader
            try:
                yield next(self.feed)
            except StopIteration:
                self.feed.start_epoch(self.feed.epoch + 1)
                try:
                    yield next(self.feed)
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


def _sum_over_ranks(totals: dict[str, float], count: int) -> tuple[dict[str, float], int]:
    """Per-rank sums and sample counts made global (a rank may have no batches), over the
    ranks that read different data (tensor parallelism: each group's batches count once)."""
    from treadle.distributed.comm import all_gather_object

    summed: dict[str, float] = {}
    n = 0
    for rank_totals, rank_count in all_gather_object((totals, count), data_parallel=True):
        for k, v in rank_totals.items():
            summed[k] = summed.get(k, 0.0) + v
        n += rank_count
    return summed, n


__all__ = ["EvalComm", "EvalLoop"]
