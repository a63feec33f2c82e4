"""The owners of what a strategy places: the model, its frozen weights' digests, the
optimizers, the schedulers, the loaders' places, the run's identity.

Each is a *Stateful* (``state_dict`` / ``load_state_dict``) that the checkpointer is
handed by name (``Strategy.checkpoint_states``, for the Trainer and a hand-written loop
alike)::

    frozen = FrozenWeights(strategy, module, digests, saved=False)  # what does not train: digests only
    states = {"model": ModelState(strategy, module, frozen),
              "frozen": frozen,
              "optim": OptimStates(strategy, module, {"default": optim_wrapper}),
              "param_schedulers": SchedulerStates(strategy),
              "data": LoaderPlaces(strategy, loaders),
              "strategy": RunState(strategy)}
    rank_states = {"optim": optim_states.local}      # each rank's own: open-window gradients

``check_state_dict`` (optional on a Stateful) refuses a saved state that does not fit
before anything is loaded: the checkpointer calls every owner's check first. ``sharded``
marks an owner whose tensors a sharding strategy (FSDP) writes through DCP.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, TYPE_CHECKING, Protocol

import torch
from torch import nn

from treadle._version import __version__
from treadle.checkpoint.finite import first_nonfinite, named_tensors
from treadle.checkpoint.frozen import ADVICE, DIGEST, FrozenDigests, check_entry, first_difference, frozen_keys
from treadle.checkpoint.io import CheckpointError
from treadle.distributed import comm
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.optim.wrapper import OptimWrapper


class StrategyOfStates(Protocol):
    """What the owners below use of their strategy (``treadle.strategies.base.Strategy``
    has it all; named here so that this module needs no import of the strategies, which
    import it)."""

    name: str
    rank: int
    world_size: int
    distributed: bool
    tp_size: int
    run_id: str
    shards_state: bool
    saves_window_grads: bool
    param_schedulers: Any

    def get_model_state(self, module: nn.Module) -> dict[str, Any]: ...
    def set_model_state(self, module: nn.Module, state: dict[str, Any], *, strict: bool = True) -> None: ...
    def full_shapes(self, module: nn.Module) -> dict[str, tuple[int, ...]]: ...
    def get_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...
    def set_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None: ...
    def check_optim_state(self, state: Any) -> None: ...
    def scheduler_state_dict(self) -> Any: ...
    def load_scheduler_state_dict(self, state_dict: Any) -> None: ...


class ModelState:
    """The model's state as the strategy gives it (FSDP: sharded DTensors): a flat state
    dict of every parameter and persistent buffer, less the parameters that do not train
    when ``frozen`` (the checkpoint's :class:`FrozenWeights`) does not keep them."""

    def __init__(self, strategy: "StrategyOfStates", module: nn.Module, frozen: "FrozenWeights | None" = None) -> None:
        self.strategy, self.module, self.frozen = strategy, module, frozen
        self.sharded = strategy.shards_state

    def _left_out(self, kept: Callable[[str], bool] = lambda key: False) -> set[str]:
        """The frozen keys this state leaves out (none when the frozen weights are saved),
        less those ``kept`` says to keep."""
        if self.frozen is None or self.frozen.saved:
            return set()
        return {k for k in frozen_keys(self.module) if not kept(k)}

    def state_dict(self) -> dict[str, Any]:
        state = self.strategy.get_model_state(self.module)
        left_out = self._left_out()
        return {k: v for k, v in state.items() if k not in left_out} if left_out else state

    def load_template(self, saved: Callable[[str], bool]) -> dict[str, Any]:
        """What a sharded load reads into (``saved(key)``: the checkpoint holds ``key``):
        every entry but the frozen weights the checkpoint left out."""
        state = self.strategy.get_model_state(self.module)
        left_out = set(frozen_keys(self.module)) - {k for k in state if saved(k)}
        return {k: v for k, v in state.items() if k not in left_out}

    def check_state_dict(self, state: Any) -> None:
        """The saved weights are this model's: same keys, same shapes (sharded states:
        DCP checks them as it reads); a frozen parameter may be missing (its digest, in the
        ``frozen`` entry, is checked by its owner), no other."""
        from treadle.checkpoint.weights import WeightsMismatchError, compare_weights

        if not isinstance(state, dict):
            raise CheckpointError(f"the checkpoint's model state is a {type(state).__name__}, not a dict")
        model_sd = self.module.state_dict()
        frozen = set(frozen_keys(self.module))
        if all(type(v) is torch.Tensor for v in (*model_sd.values(), *state.values())):
            report = compare_weights(self.strategy.full_shapes(self.module), state)
            report.missing = [k for k in report.missing if k not in frozen]
            if not report.ok:
                err = WeightsMismatchError(report)
                details = "\n".join(str(report).splitlines()[1:])  # without the "loaded 0 entries" line
                err.args = (f"resume needs the model the checkpoint was saved from; nothing was loaded:\n{details}",)
                raise err
        trained = [k for k in model_sd if k not in state and k not in frozen]
        if trained:
            raise CheckpointError(f"resume needs the model the checkpoint was saved from; nothing was loaded: the "
                                  f"checkpoint has no weights for {trained[0]!r}, which trains here")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Strict, but for the frozen parameters the checkpoint left out (they stay as built)."""
        missing = {k for k in self.module.state_dict() if k not in state}
        partial = bool(missing) and missing <= set(frozen_keys(self.module))
        self.strategy.set_model_state(self.module, state, strict=not partial)


class FrozenWeights:
    """``state.pt["frozen"]``: the parameters that do not train, described by their digests
    (the layout: treadle/checkpoint/frozen.py); ``saved``: their tensors are in the
    ``model`` entry too (``save_frozen=True``), else that entry leaves them out.

    A checkpoint that left them out resumes only over the same frozen weights: the check
    compares digests and refuses another base in one line naming the first tensor that
    differs. One that kept them loads them from its ``model`` entry. The digests are
    computed once (``digests``, held by the strategy across saves)."""

    def __init__(self, strategy: "StrategyOfStates", module: nn.Module, digests: FrozenDigests,
                 saved: bool = False) -> None:
        if not isinstance(saved, bool):
            raise TypeError(f"save_frozen={saved!r}; expected True (the frozen weights in every checkpoint) or False "
                            "(their digests only)")
        self.strategy, self.module, self.digests, self.saved = strategy, module, digests, saved

    def current(self) -> dict[str, dict[str, Any]]:
        """``{name: {"shape", "dtype", "sha256"}}`` of this model's frozen weights, made the
        first time and when the set of frozen parameters changes. A sharding strategy's
        ranks gather each tensor and hash a share (a collective: every rank saves and
        resumes together); the others' hash their own whole copy, with no collective (rank
        0 alone may collect a state, to reserve an asynchronous save's buffers)."""
        s = self.strategy
        share = s.distributed and s.shards_state
        return self.digests.get(self.module, lambda: s.get_model_state(self.module), rank=s.rank,
                                world_size=s.world_size, gather=comm.all_gather_object if share else None)

    def state_dict(self) -> dict[str, Any]:
        return {"saved": self.saved, "digest": DIGEST, "tensors": self.current()}

    def check_state_dict(self, state: Any) -> None:
        entry = check_entry(state, "the checkpoint")
        if entry["saved"]:
            return  # its model entry holds them: they load from there
        problem = first_difference(entry["tensors"], self.current())
        if problem is not None:
            raise CheckpointError(f"resume refused, nothing was loaded: frozen weight {problem}; {ADVICE}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["saved"]:  # the model's frozen weights are now the checkpoint's
            self.digests.forget()


class OptimStates:
    """``{name: OptimWrapper.state_dict()}`` of every optimizer, the optimizer part as the
    strategy gives it. What differs between ranks (open-window gradients, clipping's
    norms) is in :attr:`local`, for each rank's own file."""

    def __init__(self, strategy: "StrategyOfStates", module: nn.Module, wrappers: Mapping[str, "OptimWrapper"]) -> None:
        self.strategy, self.module, self.wrappers = strategy, module, wrappers
        self.sharded = strategy.shards_state
        self.local = _LocalOptimStates(self)

    def state_dict(self) -> dict[str, Any]:
        out = {}
        for name, ow in self.wrappers.items():
            st = ow.state_dict(self.strategy.get_optim_state(self.module, ow.optimizer), grads=False)
            if not self.strategy.saves_window_grads and ow.holds_grads():
                get_logger().warning(f"checkpoint inside an accumulation window of optimizer {name!r}: its partial "
                                     f"gradients are not saved under strategy {self.strategy.name!r}; the window "
                                     "restarts on resume")
                st["micro_step"] = 0
            out[name] = st
        return out

    def check_state_dict(self, state: Any) -> None:
        if not isinstance(state, dict) or set(state) != set(self.wrappers):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"the checkpoint's optimizers {got} do not match these {sorted(self.wrappers)}")
        for name, ow in self.wrappers.items():
            if isinstance(state[name], dict):  # the strategy's layout first (DeepSpeed flattens param groups)
                self.strategy.check_optim_state(state[name].get("optimizer"))
            check_optimizer(name, ow.optimizer, state[name])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, ow in self.wrappers.items():
            ow.load_state_dict(state[name], functools.partial(self.strategy.set_optim_state, self.module, ow.optimizer))

    def describe_nonfinite(self, state: dict[str, Any]) -> str | None:
        """The first model weight or optimizer entry of a collected ``state`` (``"model"``,
        ``"optim"``) holding NaN or inf, named for a person; None when all are finite.
        This process's share only (FSDP: its shards): the checkpointer combines ranks."""
        named = [(f"model weight {k!r}", t) for k, t in named_tensors(state.get("model", {}))]
        names = {id(p): n for n, p in self.module.named_parameters()}
        optim = state.get("optim", {})
        for opt_name, ow_state in optim.items():
            optimizer = self.wrappers[opt_name].optimizer
            order = [names.get(id(p), f"#{i}") for i, p in
                     enumerate(p for g in optimizer.param_groups for p in g["params"])]
            where = "the optimizer" if len(optim) == 1 else f"optimizer {opt_name!r}"
            per_param = (ow_state.get("optimizer") or {}).get("state") or {}
            for key, entries in per_param.items():  # torch: {index: {"exp_avg": ...}}; FSDP: {fqn: ...}
                param = order[key] if isinstance(key, int) and 0 <= key < len(order) else key
                named += [(f"{where}'s {k!r} of parameter {param!r}", t) for k, t in named_tensors(entries)]
        return first_nonfinite(named)


class _LocalOptimStates:
    """This rank's part of :class:`OptimStates` (see ``OptimWrapper.local_state_dict``)."""

    def __init__(self, owner: OptimStates) -> None:
        self.owner = owner

    def state_dict(self) -> dict[str, Any]:
        out = {}
        for name, ow in self.owner.wrappers.items():
            st = ow.local_state_dict()
            if not self.owner.strategy.saves_window_grads:  # see OptimStates.state_dict
                st.pop("grads", None)
            if st:
                out[name] = st
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, st in state.items():
            if name in self.owner.wrappers:
                self.owner.wrappers[name].load_local_state_dict(st)


class SchedulerStates:
    """The prepared schedulers' states, in order (a dict of lists by optimizer name for
    several wrappers): the one owner of scheduler state (the Trainer's ParamSchedulerHook
    steps them, the strategy saves them)."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def state_dict(self) -> Any:
        return self.strategy.scheduler_state_dict()

    def check_state_dict(self, state: Any) -> None:
        """As many saved states as prepared schedulers, for each optimizer."""
        scheds = self.strategy.param_schedulers
        mine = scheds if isinstance(scheds, dict) else {"": scheds}
        saved = state if isinstance(scheds, dict) and isinstance(state, dict) else {"": state}
        for name, group in mine.items():
            states = saved.get(name)
            if not isinstance(states, list) or len(states) != len(group):
                got = len(states) if isinstance(states, list) else type(states).__name__
                where = f" of optimizer {name!r}" if name else ""
                raise CheckpointError(f"scheduler states{where}: {got}, but {len(group)} scheduler(s) were prepared")

    def load_state_dict(self, state: Any) -> None:
        self.strategy.load_scheduler_state_dict(state)


class LoaderPlaces:
    """``[loader.state_dict(), ...]``: where each tracked training loader goes on, in the
    order they were prepared (``Strategy.track_loader``). Places beyond the loaders
    prepared so far wait for loaders prepared after the resume (:attr:`pending`).
    :attr:`local` is each rank's own part: the positions of streams that keep their own."""

    def __init__(self, loaders: list[Any]) -> None:
        self.loaders = loaders
        self.pending: list[dict[str, Any]] = []
        self.pending_streams: list[Any] = []
        self.local = _LoaderStreams(self)

    def state_dict(self) -> list[Any]:
        return [ld.state_dict() for ld in self.loaders]

    def check_state_dict(self, state: Any) -> None:
        if not isinstance(state, list):
            raise CheckpointError(f"the checkpoint's data entry is a {type(state).__name__}, not a list of places")
        if len(self.loaders) > len(state):
            raise CheckpointError(f"{len(self.loaders)} loader(s) were prepared, the checkpoint has the place of "
                                  f"{len(state)}")

    def load_state_dict(self, state: list[Any]) -> None:
        saved = list(state)
        for ld in self.loaders:
            ld.load_state_dict(saved.pop(0))
        self.pending = saved


class _LoaderStreams:
    """``[loader.stream_state_dict(), ...]`` of the tracked loaders (None for a loader whose
    stream keeps no position of its own, or between epochs), in this rank's file: each rank
    reads its own share of a stream (torchdata's ``StatefulDataLoader`` state, a Stateful
    dataset's, treadle/data/feed.py)."""

    def __init__(self, owner: LoaderPlaces) -> None:
        self.owner = owner
        self.warned: set[int] = set()  # loaders whose state could not be saved (said once)

    def state_dict(self) -> list[Any]:
        out = []
        for i, ld in enumerate(self.owner.loaders):
            get = getattr(ld, "stream_state_dict", None)
            state = get() if callable(get) else None
            try:
                out.append(plain_state(state, f"the stream state of training loader {i}"))
            except TypeError as err:  # not what weights_only reads back: the resume reads the stream again
                if i not in self.warned:
                    self.warned.add(i)
                    get_logger().warning(f"{err}; it is left out of checkpoints, and a resume inside an epoch "
                                         "reads the stream again up to its place")
                out.append(None)
        return out

    def check_state_dict(self, state: Any) -> None:
        if not isinstance(state, list):
            raise CheckpointError(f"the checkpoint's stream states are a {type(state).__name__}, not a list")

    def load_state_dict(self, state: list[Any]) -> None:
        saved = list(state)
        for ld in self.owner.loaders:
            st = saved.pop(0) if saved else None
            load = getattr(ld, "load_stream_state_dict", None)
            if st is not None and callable(load):
                load(st)
        self.owner.pending_streams = saved


class RunState:
    """The run's identity: its id (a resume carries it on), the number of processes that
    saved (and ``tp``, their tensor-parallel ranks per data shard, when more than one),
    the treadle version."""

    def __init__(self, strategy: "StrategyOfStates") -> None:
        self.strategy = strategy

    def state_dict(self) -> dict[str, Any]:
        state = {"run": self.strategy.run_id, "world_size": self.strategy.world_size, "treadle": __version__}
        if self.strategy.tp_size > 1:  # tensor parallelism: the ranks of a group share a data shard
            state["tp"] = self.strategy.tp_size
        return state

    def check_state_dict(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise CheckpointError(f"the checkpoint's strategy entry is a {type(state).__name__}, not a dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("run"), str) and state["run"]:  # the same run goes on
            self.strategy.run_id = state["run"]


def check_optimizer(name: str, optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """The saved optimizer state is of the same kind and shape as ``optimizer``'s (torch
    would take another optimizer's hyperparameters and fail at the first step)."""
    where = f"optimizer {name!r}"
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where}: the checkpoint's state is a {type(saved).__name__}, not a dict")
    kind = saved.get("type")
    if isinstance(kind, str) and kind != type(optimizer).__name__:
        raise CheckpointError(f"{where}: the checkpoint was saved by {kind}, this run has "
                              f"{type(optimizer).__name__}; resume needs the same optimizer (load_from= takes "
                              "the weights alone)")
    opt = saved.get("optimizer")
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        return  # a strategy's own layout: its loader checks it
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{where}: the checkpoint has {len(groups)} param group(s), this optimizer "
                              f"{len(optimizer.param_groups)}")
    for i, (g, mine) in enumerate(zip(groups, optimizer.param_groups)):
        if len(g["params"]) != len(mine["params"]):
            raise CheckpointError(f"{where}: param group {i} has {len(g['params'])} parameters in the checkpoint, "
                                  f"{len(mine['params'])} here")


def plain_state(obj: Any, where: str) -> Any:
    """``obj`` if ``torch.load(weights_only=True)`` can read it back (else a TypeError
    naming the entry, before anything is written)."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain_state(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where} has key {k!r} of type {type(k).__name__}; expected str or int keys")
        return {k: plain_state(v, f"{where}[{k!r}]") for k, v in obj.items()}
    raise TypeError(f"{where} is a {type(obj).__name__}; a checkpoint holds only numbers, strings, tensors, "
                    "and lists and dicts of them (it is read back with weights_only=True)")


__all__ = ["FrozenWeights", "LoaderPlaces", "ModelState", "OptimStates", "RunState", "SchedulerStates", "check_optimizer",
           "plain_state"]
