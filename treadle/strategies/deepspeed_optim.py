"""The optimizer side of a DeepSpeed engine, as treadle's OptimWrapper.

``DeepSpeedStrategy`` replaces the wrapper ``prepare`` built by a
:class:`DeepSpeedOptimWrapper` over the engine; the loop and a custom step call it as
any wrapper (``update``, or ``backward``/``step``/``zero_grad``)::

    update(loss):  engine.backward(loss / window, scale_wrt_gas=False)   # ZeRO reduces
                   at a window's end: engine.step()                       # clip, step, zero

treadle keeps the accumulation window (DeepSpeed runs with
``managed_gradient_accumulation: false``, so a short last window divides by its own
size, as for every other strategy); DeepSpeed does precision and clipping.

State: each rank's ZeRO partition (fp32 masters and optimizer state) is in that rank's
own file (:meth:`DeepSpeedOptimWrapper.local_state_dict`), turned into plain containers
so that it reads back with ``weights_only=True`` and no allowlist
(:func:`to_plain` / :func:`from_plain`). The engine's counters are in the shared part.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

from torch import Tensor

from treadle.optim.wrapper import OptimWrapper

#: The DeepSpeed classes inside a ZeRO optimizer's state_dict, by name: rebuilt from plain
#: dicts only when their name is one of these (nothing else in a file is ever constructed).
_SCALERS = ("LossScaler", "DynamicLossScaler")


@contextlib.contextmanager
def quiet_deepspeed() -> Iterator[None]:
    """DeepSpeed's deprecation warnings on this torch, silenced inside treadle's own rare
    calls only (``initialize``, checkpoint state): torch.jit.script_method at its import,
    torch.distributed's renamed collectives before :func:`use_current_collectives`.
    Not per step: each ``catch_warnings`` makes Python show "default" warnings again."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning,
                                message=r"`?torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)`? is deprecated")
        warnings.filterwarnings("ignore", category=DeprecationWarning,
                                message=r"`?torch\.jit\.script_method`? is deprecated")
        yield


def use_current_collectives() -> None:
    """Point DeepSpeed's communication backend (``deepspeed.comm.comm.cdb``, its object
    for client code) at torch's current names of the two collectives it resolved at
    start: ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` are deprecated
    wrappers that call ``all_gather_single`` / ``reduce_scatter_single`` with the same
    arguments and warn at every call. Nothing else changes, and no filter is installed."""
    import torch.distributed as dist
    from deepspeed.comm import comm as ds_comm

    backend = ds_comm.cdb
    for attr, old, new in (("all_gather_function", "all_gather_into_tensor", "all_gather_single"),
                           ("reduce_scatter_function", "reduce_scatter_tensor", "reduce_scatter_single")):
        if hasattr(dist, new) and getattr(backend, attr, None) is getattr(dist, old, None):
            setattr(backend, attr, getattr(dist, new))


def to_plain(state: dict[str, Any]) -> dict[str, Any]:
    """A ZeRO optimizer ``state_dict()`` with DeepSpeed's objects (loss scaler, stage enum,
    fragment addresses) as plain dicts and ints: ``torch.load(weights_only=True)`` reads
    it with no allowlist."""
    out = dict(state)
    scaler = out.get("loss_scaler")
    if scaler is not None and not isinstance(scaler, dict):
        out["loss_scaler"] = {"__class__": type(scaler).__name__, **vars(scaler)}
    if "zero_stage" in out:
        out["zero_stage"] = int(out["zero_stage"])
    if "param_slice_mappings" in out:
        out["param_slice_mappings"] = [{k: [int(a.numel), int(a.start)] for k, a in m.items()}
                                       for m in out["param_slice_mappings"]]
    return out


def from_plain(state: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`to_plain` (raises ValueError on a loss scaler of an unknown class)."""
    from collections import OrderedDict

    from deepspeed.runtime.fp16 import loss_scaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    out = dict(state)
    scaler = out.get("loss_scaler")
    if isinstance(scaler, dict):
        fields = dict(scaler)
        name = fields.pop("__class__", None)
        if name not in _SCALERS:
            raise ValueError(f"the ZeRO optimizer state names loss scaler {name!r}; expected one of {_SCALERS}")
        cls = getattr(loss_scaler, name)
        obj = cls.__new__(cls)
        obj.__dict__.update(fields)
        out["loss_scaler"] = obj
    if "zero_stage" in out:
        out["zero_stage"] = ZeroStageEnum(out["zero_stage"])
    if "param_slice_mappings" in out:
        out["param_slice_mappings"] = [OrderedDict((k, fragment_address(numel=n, start=s)) for k, (n, s) in m.items())
                                       for m in out["param_slice_mappings"]]
    return out


class DeepSpeedOptimWrapper(OptimWrapper):
    """An OptimWrapper whose backward and step are a DeepSpeed engine's (see the module
    docstring). ``optimizer`` stays the torch optimizer you gave: schedulers act on it."""

    def __init__(self, engine: Any, built: OptimWrapper) -> None:
        # Precision is the engine's (its bf16/fp16 sections): no autocast, no GradScaler here.
        super().__init__(built.optimizer, device_type=built.device_type, accumulate=built.accumulate,
                         clip_grad=built.clip_grad)
        self.precision = built.precision
        self.engine = engine
        self.stage = int(engine.zero_optimization_stage())

    def backward(self, loss: Tensor, **kwargs: Any) -> None:
        """``engine.backward`` of ``loss`` as it is (the window's division is treadle's)."""
        self.engine.backward(loss, scale_wrt_gas=False, **kwargs)
        for fn in self.after_backward_callbacks:
            fn()

    def step(self) -> None:
        """The before_optimizer_step hooks, then ``engine.step()``: reduce (stages 0/1),
        clip to ``gradient_clipping``, step, zero the gradients."""
        for fn in self.before_step_callbacks:
            fn()
        skipped = self.engine.skipped_steps
        self.engine.step()
        if self.engine.skipped_steps > skipped:  # fp16 overflow (DeepSpeed's loss scaler)
            self.skipped_steps += 1
            return
        self.step_count += 1
        if self.clip_grad is not None:
            norm = self.engine.get_global_grad_norm()
            if norm is not None:  # computed by DeepSpeed as it clipped: no extra work
                self.grad_norms.append(norm if isinstance(norm, Tensor) else _as_tensor(norm))

    def zero_grad(self) -> None:
        """Drop the module's gradients (``engine.step`` already cleared ZeRO's buffers)."""
        self.engine.zero_grad()

    def holds_grads(self) -> bool:
        """An open window's gradients wait in ZeRO's buffers (the strategy does not save
        them: ``saves_window_grads`` is False, the window restarts on resume)."""
        return bool(self.micro_step)

    def local_state_dict(self, norms: bool = True) -> dict[str, Any]:
        """This rank's ZeRO partition (plain containers) and clipping's norms."""
        out = super().local_state_dict(norms)  # an open window's "grads" entry is dropped (saves_window_grads)
        with quiet_deepspeed():
            out["zero"] = to_plain(self.engine.optimizer.state_dict())
        return out

    def state_dict(self, optimizer_state: dict[str, Any] | None = None, *, grads: bool = True) -> dict[str, Any]:
        """Counters (the wrapper's and the engine's) and ``optimizer_state`` (the
        strategy's shared part); the ZeRO partition is in :meth:`local_state_dict`."""
        state = super().state_dict(optimizer_state if optimizer_state is not None else {}, grads=False)
        e = self.engine
        state["engine"] = {"global_steps": int(e.global_steps), "global_samples": int(e.global_samples),
                           "skipped_steps": int(e.skipped_steps), "micro_steps": int(e.micro_steps)}
        return state

    def load_state_dict(self, state: dict[str, Any], load_optimizer: Any = None) -> None:
        """Inverse of :meth:`state_dict` (the partition: :meth:`load_local_state_dict`);
        ``load_optimizer`` checks the shared part the strategy's way."""
        super().load_state_dict(state, load_optimizer or (lambda _: None))
        for key, value in state.get("engine", {}).items():
            setattr(self.engine, key, int(value))

    def load_local_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`local_state_dict`: the fp32 masters (and the weights, from
        them) and the optimizer state of this rank's partition. This run's clipping wins
        over the saved one (DeepSpeed would keep the checkpoint's)."""
        import torch.distributed as dist

        if "zero" in state:
            zero = from_plain(state["zero"])
            zero["clip_grad"] = self.engine.optimizer.clip_grad
            states: list[Any] = [None] * dist.get_world_size()
            states[dist.get_rank()] = zero
            optimizer = self.engine.optimizer
            with quiet_deepspeed():
                if self.stage == 3:
                    optimizer.checkpoint_event_prologue()
                optimizer.load_state_dict(state_dict_list=states, load_optimizer_states=True,
                                          load_from_fp32_weights=True)
                if self.stage == 3:
                    optimizer.checkpoint_event_epilogue()
        super().load_local_state_dict({k: v for k, v in state.items() if k != "zero"})

    def __repr__(self) -> str:
        return (f"DeepSpeedOptimWrapper({type(self.optimizer).__name__}, stage={self.stage}, "
                f"precision={self.precision!r}, accumulate={self.accumulate}, clip_grad={self.clip_grad})")


def _as_tensor(value: Any) -> Tensor:
    import torch

    return torch.tensor(float(value), dtype=torch.float64)


__all__ = ["DeepSpeedOptimWrapper", "to_plain", "from_plain", "quiet_deepspeed", "use_current_collectives"]
