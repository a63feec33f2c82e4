"""What a checkpoint holds, and how a Trainer is put back from one.

A checkpoint directory (see ``treadle.checkpoint.io``) holds ``state.pt``::

    model      the module's state_dict (unwrapped)
    optim      {name: OptimWrapper.state_dict()}  optimizer, GradScaler, accumulation
    hooks      {key: hook.state_dict()}           schedulers, EMA, best-K, ...
    trainer    counters: epoch, iter, inner_iter, metrics; run (the run's id)
    data       the feed's position: epoch, batch_idx, open, seed, world_size; the
               workflow's: phase (index, units done in it), val_due (a validation
               of this cycle has not run yet)

and ``rng_rank<r>.pt`` with every RNG of rank r and, under ``rank_state``, what else
differs between ranks: the open log windows (the values the next log line averages),
the validation feed's place, an open accumulation window's gradients. The position is
that of an iteration boundary: called from ``after_train_iter`` it already counts the running
iteration (its step is done), and from ``after_train_epoch`` it counts the epoch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

import treadle
from treadle.checkpoint.finite import first_nonfinite, named_tensors
from treadle.checkpoint.checkpointer import rng_file
from treadle.checkpoint.manifest import STATE_FILE
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.trainer import Trainer



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
    p = loop.position()
    counters = {"epoch": p.epoch, "iter": p.iter, "inner_iter": p.inner_iter}
    data.update(epoch=p.epoch, batch_idx=p.batch_idx, open=p.open, seed=p.seed)
    if p.open:
        data["batch_size"] = p.batch_size  # to resume on another world size
    if trainer.val_loop is not None:  # validation passes and their feed go on from here too
        data["val"] = trainer.val_loop.position()
    # Where the workflow is, so that a validation due right after this point still runs.
    data["phase"], data["val_due"] = p.phase, p.val_due
    return counters, data


def collect(trainer: "Trainer") -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(state, rank_state, meta)``: what the checkpointer (treadle/checkpoint/checkpointer.py)
    writes to ``state.pt``, to this rank's ``rng_rank<r>.pt`` beside its RNGs, and to the
    manifest."""
    counters, data = position(trainer)
    strategy, module = trainer.strategy, trainer.module
    state = {
        "model": strategy.get_model_state(module),
        "optim": {name: ow.state_dict(strategy.get_optim_state(module, ow.optimizer))
                  for name, ow in trainer.optim_wrappers.items()},
        "hooks": {key: h.state_dict() for key, h in hook_keys(trainer).items()},
        "trainer": {**counters, "metrics": dict(trainer.state.metrics), "run": trainer.run_id},
        "data": data,
        "treadle": treadle.__version__,
    }
    s = trainer.state
    finished = ((s.max_iters is not None and counters["iter"] >= s.max_iters) or (
        s.by_epoch and s.max_epochs is not None and counters["epoch"] >= s.max_epochs)) and not (
        data["open"] or data.get("val_due"))
    meta = {"epoch": counters["epoch"], "iter": counters["iter"], "finished": bool(finished), "run": trainer.run_id}
    return state, _rank_state(trainer, state, data), meta


def nonfinite_entry(trainer: "Trainer", state: dict[str, Any]) -> str | None:
    """The first model weight or optimizer state entry of ``state`` (as :func:`collect`
    made it) that holds NaN or inf, said so that a person can find it; None when all are
    finite. This process's share only (FSDP: its shards): the caller combines ranks."""
    named = [(f"model weight {k!r}", t) for k, t in named_tensors(state["model"])]
    names = {id(p): n for n, p in trainer.module.named_parameters()}
    for opt_name, ow_state in state["optim"].items():
        optimizer = trainer.optim_wrappers[opt_name].optimizer
        order = [names.get(id(p), f"#{i}") for i, p in
                 enumerate(p for g in optimizer.param_groups for p in g["params"])]
        where = "the optimizer" if len(state["optim"]) == 1 else f"optimizer {opt_name!r}"
        per_param = (ow_state.get("optimizer") or {}).get("state") or {}
        for key, entries in per_param.items():  # torch: {index: {"exp_avg": ...}}; FSDP: {fqn: ...}
            param = order[key] if isinstance(key, int) and 0 <= key < len(order) else key
            named += [(f"{where}'s {k!r} of parameter {param!r}", t) for k, t in named_tensors(entries)]
    return first_nonfinite(named)


def _rank_state(trainer: "Trainer", state: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """What differs from one process to the next, for this process's own file (rank 0
    writes ``state.pt`` alone): the open log windows, the validation feed's place (each
    rank reads its own shard), and gradients of an open accumulation window (under DDP's
    ``no_sync`` each rank holds its own). Moved out of ``state``/``data``."""
    local: dict[str, Any] = {"log_windows": trainer.store.state_dict()}
    norms = {name: [float(v) for v in ow.grad_norms] for name, ow in trainer.optim_wrappers.items() if ow.grad_norms}
    if norms:  # clipping's norms since the last log line (read here, at a save, not per step)
        local["grad_norms"] = norms
    if "val" in data:
        local["val"] = data.pop("val")
    if trainer.strategy.name != "fsdp":  # FSDP's gradients are shards: they stay in its sharded state
        grads = {name: st.pop("grads") for name, st in state["optim"].items() if "grads" in st}
        if grads:
            local["grads"] = grads
    return local


def sharded_template(trainer: "Trainer") -> dict[str, Any]:
    """This run's model and optimizer states as the strategy gives them (FSDP: sharded
    DTensors, which a sharded checkpoint is read into)."""
    strategy, module = trainer.strategy, trainer.module
    return {"model": strategy.get_model_state(module),
            "optim": {name: strategy.get_optim_state(module, ow.optimizer) for name, ow in trainer.optim_wrappers.items()}}


_PARTS = {"model": dict, "optim": dict, "hooks": dict, "trainer": dict, "data": dict}


def check_restorable(trainer: "Trainer", payloads: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's state, once it is known to fit this trainer; nothing is changed
    before that. Raises CheckpointError naming what does not fit."""
    from treadle.checkpoint.io import CheckpointError
    from treadle.checkpoint.weights import WeightsMismatchError, compare_weights

    state = payloads.get(STATE_FILE)
    hint = ("a weights-only checkpoint (e.g. checkpoints/best/...) or a state dict restores weights with "
            "load_from=, not resume=")
    if not isinstance(state, dict):
        raise CheckpointError(f"not a training checkpoint: it has no {STATE_FILE} dict of the training state; {hint}")
    for part, kind in _PARTS.items():
        if not isinstance(state.get(part), kind):
            raise CheckpointError(f"not a complete training checkpoint: {STATE_FILE} has no {part!r} "
                                  f"{kind.__name__} (it has {sorted(state)}); {hint}")
    for key in ("epoch", "iter", "inner_iter"):
        value = state["trainer"].get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{STATE_FILE}: trainer[{key!r}] is {value!r}; expected an int >= 0")
    if set(trainer.optim_wrappers) != set(state["optim"]):
        raise CheckpointError(f"the checkpoint's optimizers {sorted(state['optim'])} do not match this trainer's "
                              f"{sorted(trainer.optim_wrappers)}")
    model_sd = trainer.module.state_dict()
    saved = state["model"]
    if all(type(v) is torch.Tensor for v in (*model_sd.values(), *saved.values())):  # sharded states: DCP checks
        report = compare_weights(model_sd, saved)
        if not report.ok:
            err = WeightsMismatchError(report)
            details = "\n".join(str(report).splitlines()[1:])  # without the "loaded 0 entries" line
            err.args = (f"resume needs the model the checkpoint was saved from; nothing was loaded:\n{details}",)
            raise err
    for name, ow in trainer.optim_wrappers.items():
        _check_optimizer(name, ow.optimizer, state["optim"][name])
    return state


def _check_optimizer(name: str, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """The saved optimizer state is of the same kind and shape as ``optimizer``'s (torch
    would take another optimizer's hyperparameters and fail at the first step)."""
    from treadle.checkpoint.io import CheckpointError

    where = f"optimizer {name!r}"
    kind = saved.get("type")  # recorded since this check exists; older checkpoints have none
    if isinstance(kind, str) and kind != type(optimizer).__name__:
        raise CheckpointError(f"{where}: the checkpoint was saved by {kind}, this trainer has "
                              f"{type(optimizer).__name__}; resume needs the same optimizer (load_from= takes "
                              "the weights alone)")
    opt = saved.get("optimizer")
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        return  # a strategy's own layout (FSDP): its loader checks it
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{where}: the checkpoint has {len(groups)} param group(s), this optimizer "
                              f"{len(optimizer.param_groups)}")
    for i, (g, mine) in enumerate(zip(groups, optimizer.param_groups)):
        if len(g["params"]) != len(mine["params"]):
            raise CheckpointError(f"{where}: param group {i} has {len(g['params'])} parameters in the checkpoint, "
                                  f"{len(mine['params'])} here")


def restore(trainer: "Trainer", payloads: dict[str, Any]) -> dict[str, Any]:
    """Load ``payloads`` (``state.pt`` and this rank's ``rng_rank<r>.pt``) into the
    trainer; returns the data position to resume from.

    The RNG state is not applied here but handed to the train loop, which sets it
    at the exact point where the interrupted run was (just before the next batch).
    """
    state = check_restorable(trainer, payloads)
    strategy, module = trainer.strategy, trainer.module
    own = payloads.get(rng_file(strategy.rank))
    local = own.get("rank_state") if isinstance(own, dict) else None
    if not isinstance(local, dict):  # older checkpoints: in state.pt; another world size: none for this rank
        local = {"log_windows": state["trainer"].get("log_windows"), "val": state["data"].get("val")}
    strategy.set_model_state(module, state["model"])
    for name, ow in trainer.optim_wrappers.items():
        st = state["optim"][name]
        if name in local.get("grads", {}):
            st = {**st, "grads": local["grads"][name]}
        ow.load_state_dict(st, functools.partial(strategy.set_optim_state, module, ow.optimizer))
    hooks = hook_keys(trainer)
    for key, hstate in state["hooks"].items():
        if key in hooks:
            hooks[key].load_state_dict(hstate)
    s = trainer.state
    c = state["trainer"]
    s.epoch, s.iter, s.inner_iter = int(c["epoch"]), int(c["iter"]), int(c["inner_iter"])
    s.metrics = dict(c.get("metrics", {}))
    if isinstance(local.get("log_windows"), dict):  # the values logged at the next interval
        trainer.store.load_state_dict(local["log_windows"])
    for name, norms in (local.get("grad_norms") or {}).items():
        if name in trainer.optim_wrappers:
            trainer.optim_wrappers[name].grad_norms.extend(torch.tensor(v, dtype=torch.float64) for v in norms)
    if isinstance(c.get("run"), str):  # the same run goes on (older checkpoints have no run: a new one starts)
        trainer.run_id = c["run"]
    pos = dict(state["data"])
    if trainer.val_loop is not None and isinstance(local.get("val"), dict):
        trainer.val_loop.restore(local["val"])
    pos["rng"] = own
    saved_world = int(pos.get("world_size", 1))
    if saved_world != strategy.world_size:
        # The sampler splits the data differently: keep the number of samples taken.
        get_logger().warning(f"resuming a run saved by {saved_world} process(es) on {strategy.world_size}: "
                             "weights, optimizer and counters are exact; the rest of the open epoch's "
                             "order and the per-rank RNG streams cannot be, so they restart from the "
                             "same number of samples with fresh streams")
        if pos.get("open"):  # the samples already taken, in this run's batches
            saved_batch, batch = pos.get("batch_size"), getattr(trainer.train_dataloader, "batch_size", None)
            if not (isinstance(saved_batch, int) and isinstance(batch, int) and saved_batch > 0 and batch > 0):
                saved_batch = batch = 1  # unknown (older checkpoints): the per-process batch is assumed unchanged
            pos["batch_idx"] = int(pos["batch_idx"]) * saved_world * saved_batch // (strategy.world_size * batch)
        if pos["rng"] is None or strategy.world_size > saved_world:
            pos["rng"] = None
    elif pos["rng"] is None and strategy.distributed:
        raise FileNotFoundError(f"the checkpoint has no {rng_file(strategy.rank)}; it was not saved by this job")
    return pos
