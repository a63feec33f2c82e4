"""What a checkpoint holds, and how a Trainer is put back from one.

A checkpoint directory (see ``treadle.checkpoint.io``) holds ``state.pt``::

    model      the module's state_dict (unwrapped)
    optim      {name: OptimWrapper.state_dict()}  optimizer, GradScaler, accumulation
    hooks      {key: hook.state_dict()}           schedulers, EMA, best-K, ...
    trainer    counters: epoch, iter, inner_iter, metrics
    data       the feed's position: epoch, batch_idx, open, seed, world_size

and ``rng_rank<r>.pt`` with every RNG of rank r. The position is that of an
iteration boundary: called from ``after_train_iter`` it already counts the running
iteration (its step is done), and from ``after_train_epoch`` it counts the epoch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import treadle
from treadle.checkpoint.rng import get_rng_state
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.trainer import Trainer

STATE_FILE = "state.pt"


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def hook_keys(trainer: "Trainer") -> dict[str, Any]:
    """A stable key per hook: its class name, with ``#n`` for repeats."""
    keys: dict[str, Any] = {}
    for h in trainer.hooks:
        name = type(h).__name__
        key, n = name, 1
        while key in keys:
            n += 1
            key = f"{name}#{n}"
        keys[key] = h
    return keys


def position(trainer: "Trainer") -> tuple[dict[str, int], dict[str, Any]]:
    """Counters and data position of the current iteration boundary."""
    s, loop = trainer.state, trainer.train_loop
    counters = {"epoch": s.epoch, "iter": s.iter, "inner_iter": 0}
    data: dict[str, Any] = {"epoch": s.epoch, "batch_idx": 0, "open": False, "seed": trainer.seed,
                            "world_size": trainer.strategy.world_size}
    if loop is None:
        return counters, data
    feed = loop.feed
    data["seed"] = feed.seed
    if loop._epoch_open:
        pending = feed.batch_idx - s.inner_iter  # 1 while the iteration's after_train_iter runs
        counters.update(iter=s.iter + pending, inner_iter=feed.batch_idx)
        data.update(epoch=s.epoch, batch_idx=feed.batch_idx, open=True)
    else:
        done_epoch = s.epoch + (1 if loop._closing_complete else 0)  # inside after_train_epoch
        counters["epoch"] = done_epoch
        data["epoch"] = done_epoch
    return counters, data


def collect(trainer: "Trainer") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(payloads, meta)`` for :func:`treadle.checkpoint.io.save_checkpoint`."""
    counters, data = position(trainer)
    strategy, module = trainer.strategy, trainer.module
    state = {
        "model": strategy.model_state_dict(module),
        "optim": {name: ow.state_dict(strategy.optim_state_dict(module, ow.optimizer))
                  for name, ow in trainer.optim_wrappers.items()},
        "hooks": {key: h.state_dict() for key, h in hook_keys(trainer).items()},
        "trainer": {**counters, "metrics": dict(trainer.state.metrics)},
        "data": data,
        "treadle": treadle.__version__,
    }
    s = trainer.state
    finished = (s.max_iters is not None and counters["iter"] >= s.max_iters) or (
        s.by_epoch and s.max_epochs is not None and counters["epoch"] >= s.max_epochs)
    meta = {"epoch": counters["epoch"], "iter": counters["iter"], "finished": bool(finished)}
    return {STATE_FILE: state, rng_file(trainer.strategy.rank): get_rng_state()}, meta


def sharded_template(trainer: "Trainer") -> dict[str, Any]:
    """This run's model and optimizer states as the strategy gives them (FSDP: sharded
    DTensors, which a sharded checkpoint is read into)."""
    strategy, module = trainer.strategy, trainer.module
    return {"model": strategy.model_state_dict(module),
            "optim": {name: strategy.optim_state_dict(module, ow.optimizer) for name, ow in trainer.optim_wrappers.items()}}


def restore(trainer: "Trainer", payloads: dict[str, Any]) -> dict[str, Any]:
    """Load ``payloads`` into the trainer; returns the data position to resume from.

    The RNG state is not applied here but handed to the train loop, which sets it
    at the exact point where the interrupted run was (just before the next batch).
    """
    state = payloads[STATE_FILE]
    strategy, module = trainer.strategy, trainer.module
    strategy.load_model_state_dict(module, state["model"])
    missing = set(trainer.optim_wrappers) ^ set(state["optim"])
    if missing:
        raise ValueError(f"the checkpoint's optimizers {sorted(state['optim'])} do not match this trainer's "
                         f"{sorted(trainer.optim_wrappers)}")
    for name, ow in trainer.optim_wrappers.items():
        ow.load_state_dict(state["optim"][name],
                           functools.partial(strategy.load_optim_state_dict, module, ow.optimizer))
    hooks = hook_keys(trainer)
    for key, hstate in state["hooks"].items():
        if key in hooks:
            hooks[key].load_state_dict(hstate)
    s = trainer.state
    c = state["trainer"]
    s.epoch, s.iter, s.inner_iter = int(c["epoch"]), int(c["iter"]), int(c["inner_iter"])
    s.metrics = dict(c.get("metrics", {}))
    pos = dict(state["data"])
    pos["rng"] = payloads.get(rng_file(strategy.rank))
    saved_world = int(pos.get("world_size", 1))
    if saved_world != strategy.world_size:
        # The sampler splits the data differently: keep the number of samples taken.
        get_logger().warning(f"resuming a run saved by {saved_world} process(es) on {strategy.world_size}: "
                             "weights, optimizer and counters are exact; the rest of the open epoch's "
                             "order and the per-rank RNG streams cannot be, so they restart from the "
                             "same number of samples with fresh streams")
        if pos.get("open"):
            pos["batch_idx"] = int(pos["batch_idx"]) * saved_world // strategy.world_size
        if pos["rng"] is None or strategy.world_size > saved_world:
            pos["rng"] = None
    elif pos["rng"] is None and strategy.distributed:
        raise FileNotFoundError(f"the checkpoint has no {rng_file(strategy.rank)}; it was not saved by this job")
    return pos
