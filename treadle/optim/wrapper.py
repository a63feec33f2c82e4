"""OptimWrapper: one optimizer with its precision, accumulation and clipping.

``update(loss)`` is the whole optimizer side of a training step::

    scaled = loss / accumulate            # when accumulating
    scaler.scale(scaled).backward()       # plain backward() unless fp16
    after_backward callbacks
    if this micro-batch closes a window:
        scaler.unscale_ + clip            # when clip_grad is set
        before_optimizer_step callbacks
        scaler.step(optimizer) / optimizer.step()
        scaler.update(); zero_grad(set_to_none=True)

Accumulation windows: with ``accumulate=N`` each loss is divided by the size of its
window and the optimizer steps when the window is full. The trainer announces how
many micro-batches are left (``start_run(n)``): in epoch-based training, each epoch
(so an epoch of 10 batches with N=4 steps after 4, 8 and 10, the last window of 2
dividing by 2: with a mean loss every step sees the mean over its samples); in
iteration-based training, the whole run (windows span epoch boundaries and only the
window at ``max_iters`` may be short). With no known length, windows are always N.

A custom ``train_step`` uses the same calls (``backward``/``step``/``zero_grad`` or
``update``) on ``trainer.optim_wrappers[name]``. The wrapper knows nothing of the
Trainer: hook points arrive as tuples of zero-argument callables.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor

from treadle.optim.builder import build_optimizer
from treadle.optim.loss_scale import build_scaler, check_loss_scale, fixed_scale
from treadle.precision import AUTOCAST_DTYPES, amp_precision, check_precision, torch_dtype

def check_clip_grad(clip_grad: dict[str, Any] | None) -> dict[str, Any] | None:
    """Validate ``clip_grad``: ``dict(max_norm=.., norm_type=2)`` or ``dict(value=..)``."""
    if clip_grad is None:
        return None
    if not isinstance(clip_grad, dict):
        raise TypeError(f"clip_grad must be a dict such as dict(max_norm=1.0) or dict(value=0.5), got {clip_grad!r}")
    keys = set(clip_grad)
    if ("max_norm" in keys) == ("value" in keys):
        raise ValueError(f"clip_grad={clip_grad!r} must have exactly one of 'max_norm' (clip by norm) or 'value' (clip by value)")
    allowed = {"max_norm", "norm_type", "error_if_nonfinite", "foreach"} if "max_norm" in keys else {"value", "foreach"}
    extra = keys - allowed
    if extra:
        kind = "max_norm" if "max_norm" in keys else "value"
        raise ValueError(f"clip_grad has unknown keys {sorted(extra)}; allowed with {kind}: {sorted(allowed)}")
    bound = clip_grad.get("max_norm", clip_grad.get("value"))
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:  # NaN too
        raise ValueError(f"clip_grad bound must be a positive number, got {bound!r}")
    if "norm_type" in keys:
        norm_type = clip_grad["norm_type"]
        number = not isinstance(norm_type, bool) and isinstance(norm_type, (int, float))
        if not (norm_type == "inf" or (number and norm_type > 0)):  # NaN fails too
            raise ValueError(f"clip_grad norm_type={norm_type!r} is not supported; expected a positive number "
                             "(2: the Euclidean norm) or 'inf' (the largest absolute value)")
    if "error_if_nonfinite" in keys and not isinstance(clip_grad["error_if_nonfinite"], bool):
        raise TypeError(f"clip_grad error_if_nonfinite={clip_grad['error_if_nonfinite']!r}; expected True or False")
    if clip_grad.get("foreach") is not None and not isinstance(clip_grad["foreach"], bool):
        raise TypeError(f"clip_grad foreach={clip_grad['foreach']!r}; expected True, False or None")
    return dict(clip_grad)


def make_autocast(precision: str, device_type: str) -> Callable[[], ContextManager[Any]]:
    """A factory of autocast contexts for ``precision`` (a no-op for fp32)."""
    dtype = AUTOCAST_DTYPES[check_precision(precision)]
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type, dtype=torch_dtype(dtype))


@dataclass(frozen=True)
class GradientSync:
    """How gradients cross processes, as the optimizer wrapper needs to know it: given
    by the strategy (``Strategy.gradient_sync(model)``), the one place it is decided.

    Attributes:
        no_sync: a context for micro-batches that do not step, during which gradients
            are not reduced (DDP's ``no_sync``; FSDP's reduce-scatter skipped); None:
            every micro-batch synchronizes.
        clip_grad_norm: clipping by norm, ``fn(params, max_norm=, norm_type=, ...)`` ->
            the total norm (a device tensor); torch's, or one that computes the global
            norm across several device meshes (FSDP x tensor parallel, optim/clip.py).
    """

    no_sync: Callable[[], ContextManager[Any]] | None = None
    clip_grad_norm: Callable[..., Tensor] = torch.nn.utils.clip_grad_norm_


class OptimWrapper:
    """An optimizer plus AMP, gradient accumulation and clipping.

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        precision: "32", "bf16" (autocast) or "16" (autocast + GradScaler).
        device_type: device type for autocast ("cpu", "cuda", ...).
        accumulate: optimizer steps once every ``accumulate`` calls of :meth:`update`.
        clip_grad: ``dict(max_norm=..., norm_type=2)`` or ``dict(value=...)``.
        loss_scale: fp16's GradScaler: ``"dynamic"``, a fixed scale (a number) or a dict
            of GradScaler options (treadle/optim/loss_scale.py); precision "16" only.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, precision: str = "32", device_type: str = "cpu",
                 accumulate: int = 1, clip_grad: dict[str, Any] | None = None,
                 loss_scale: str | float | dict[str, Any] = "dynamic") -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"OptimWrapper needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise ValueError(f"accumulate must be an int >= 1, got {accumulate!r}")
        self.optimizer = optimizer
        self.precision = check_precision(precision)
        self.device_type = device_type
        self.accumulate = accumulate
        self.clip_grad = check_clip_grad(clip_grad)
        self.loss_scale = check_loss_scale(loss_scale)
        if self.loss_scale != "dynamic" and self.precision != "16":
            raise ValueError(f"loss_scale={loss_scale!r} needs precision='16' (fp16 with a GradScaler); "
                             f"precision={self.precision!r} scales no loss")
        self.scaler = build_scaler(self.loss_scale, device_type) if self.precision == "16" else None
        # ``with wrapper.autocast():`` around the forward pass (a no-op for fp32).
        self.autocast = make_autocast(self.precision, device_type)
        self.micro_step = 0  # update() calls since the last optimizer step
        self._window = accumulate  # size of the open accumulation window
        self._remaining: int | None = None  # micro-batches left in the run (see start_run)
        self.step_count = 0  # optimizer steps taken (skipped fp16 steps excluded)
        self.skipped_steps = 0  # steps the GradScaler skipped for inf/NaN gradients
        # Total grad norms since the log last drained them (device tensors: no sync per step).
        self.grad_norms: deque[Tensor] = deque(maxlen=1024)
        # Hook points, filled in by the trainer; empty tuples cost nothing.
        self.after_backward_callbacks: tuple[Callable[[], Any], ...] = ()
        self.before_step_callbacks: tuple[Callable[[], Any], ...] = ()
        # no_sync and clipping by norm: the strategy's (Strategy.setup_optim_wrapper gives it).
        self.gradient_sync = GradientSync()

    # -- the pieces a custom step may call ------------------------------------------
    def backward(self, loss: Tensor, **kwargs: Any) -> None:
        """Backward of ``loss`` (scaled under fp16), then the after_backward hooks."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)
        for fn in self.after_backward_callbacks:
            fn()

    def step(self) -> None:
        """Clip, run the before_optimizer_step hooks, and step (through the scaler)."""
        if self.clip_grad is not None:
            self._clip()
        for fn in self.before_step_callbacks:
            fn()
        scaler = self.scaler
        if scaler is not None:
            # fp16 syncs inside scaler.step anyway (it reads found_inf); a lower scale
            # after update() is the public sign that this step was skipped.
            before = scaler.get_scale()
            scaler.step(self.optimizer)
            scaler.update()
            skipped = scaler.get_scale() < before
            fixed = fixed_scale(self.loss_scale)
            if fixed is not None:  # MMEngine's fixed scale: back to it (the dynamic update told the skip)
                scaler.update(fixed)
            if skipped:
                self.skipped_steps += 1
                return
        else:
            self.optimizer.step()
        self.step_count += 1

    def zero_grad(self) -> None:
        """Drop gradients (set to None: cheaper than zeroing)."""
        self.optimizer.zero_grad(set_to_none=True)

    def start_run(self, micro_batches: int | None) -> None:
        """Announce how many ``update`` calls remain before windows must close (the
        end of an epoch or of training); None: unknown, windows are always full."""
        self._remaining = micro_batches

    def next_closes(self) -> bool:
        """Whether the next :meth:`update` closes its window (and so steps)."""
        if self.accumulate == 1:
            return True
        window = self._window
        if self.micro_step == 0:
            rem = self._remaining
            window = self.accumulate if rem is None or rem >= self.accumulate else max(rem, 1)
        return self.micro_step + 1 >= window

    def accumulation_context(self) -> ContextManager[Any]:
        """DDP's ``no_sync`` when the coming :meth:`update` does not step (gradients then
        all-reduce once per window), else a no-op. Wrap forward *and* backward of a
        micro-batch in it: DDP decides in the forward pass, so wrapping backward alone
        would not do."""
        no_sync = self.gradient_sync.no_sync
        if no_sync is None or self.next_closes():
            return contextlib.nullcontext()
        return no_sync()

    def optim_context(self, model: Any = None) -> ContextManager[Any]:
        """For a custom step, around forward *and* backward of a micro-batch (MMEngine's
        contract, as its ``AmpOptimWrapper``): :meth:`accumulation_context` and, under
        bf16/fp16, autocast (backward inside autocast runs each op in its forward dtype).
        ``model`` is accepted for MMEngine's signature and not needed (the strategy gave
        its :class:`GradientSync` when it prepared the wrapper)."""
        if self.precision == "32":
            return self.accumulation_context()
        stack = contextlib.ExitStack()
        stack.enter_context(self.accumulation_context())
        stack.enter_context(self.autocast())
        return stack

    def update(self, loss: Tensor) -> None:
        """Backward, and step + zero_grad when the accumulation window closes."""
        acc = self.accumulate
        if acc == 1:
            self.backward(loss)
            self.step()
            self.zero_grad()
            return
        if self.micro_step == 0:  # a window opens: short if the run ends sooner
            rem = self._remaining
            self._window = acc if rem is None or rem >= acc else max(rem, 1)
        if self._remaining is not None:
            self._remaining -= 1
        self.micro_step += 1
        window = self._window
        closes = self.micro_step >= window
        self.backward(loss / window)
        if closes:
            self.step()
            self.zero_grad()
            self.micro_step = 0

    def update_params(self, loss: Tensor) -> None:
        """MMEngine's name for :meth:`update`."""
        self.update(loss)

    # -- helpers ----------------------------------------------------------------------
    def _clip(self) -> None:
        params = [p for p in self._params() if p.grad is not None]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        cfg = self.clip_grad
        assert cfg is not None  # step() calls _clip only with clip_grad set
        if "max_norm" in cfg:
            # Returns a device tensor: no host sync here (unless error_if_nonfinite).
            self.grad_norms.append(self.gradient_sync.clip_grad_norm(params, **cfg))
        else:
            torch.nn.utils.clip_grad_value_(params, clip_value=cfg["value"], foreach=cfg.get("foreach"))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def get_lr(self) -> list[float]:
        """Learning rate of each param group."""
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self, optimizer_state: dict[str, Any] | None = None, *, grads: bool = True) -> dict[str, Any]:
        """Optimizer, scaler, accumulation counters (and an open window's gradients;
        ``grads=False``: without them, see :meth:`local_state_dict`).
        ``optimizer_state``: the optimizer's state as the strategy gives it (FSDP)."""
        if optimizer_state is None:
            optimizer_state = self.optimizer.state_dict()
        state: dict[str, Any] = {"optimizer": optimizer_state, "type": type(self.optimizer).__name__,
                                 "micro_step": self.micro_step,
                                 "window": self._window, "remaining": self._remaining,
                                 "step_count": self.step_count, "skipped_steps": self.skipped_steps}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        # Gradients the next step will add to are state too: an open accumulation window's,
        # or those a custom step leaves (a GAN's generator loss reaching the discriminator).
        # The default step sets them to None after each update: then nothing is copied.
        if grads:
            state.update(self.local_state_dict(norms=False))
        return state

    def local_state_dict(self, norms: bool = True) -> dict[str, Any]:
        """What differs from one process to the next: the gradients the next step will add
        to, an open accumulation window's (each rank's own under DDP's ``no_sync``) or those
        a custom step leaves (a GAN's generator loss reaching the discriminator), and
        clipping's gradient norms since the last log line (read here, at a save, not per
        step). Empty when there are none: the default step sets gradients to None."""
        out: dict[str, Any] = {}
        if self.holds_grads():
            out["grads"] = [p.grad.detach().clone() if p.grad is not None else None for p in self._params()]
        if norms and self.grad_norms:
            out["grad_norms"] = [float(v) for v in self.grad_norms]
        return out

    def holds_grads(self) -> bool:
        """Gradients are waiting for the next step (an open window, or a custom step's)."""
        return bool(self.micro_step) or any(p.grad is not None for p in self._params())

    def load_local_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`local_state_dict`."""
        if "grads" in state:
            for p, g in zip(self._params(), state["grads"]):
                p.grad = g.to(p.device) if g is not None else None
        if "grad_norms" in state:
            self.grad_norms.extend(torch.tensor(v, dtype=torch.float64) for v in state["grad_norms"])

    def _params(self) -> list[Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def load_state_dict(self, state: dict[str, Any],
                        load_optimizer: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Inverse of :meth:`state_dict`; ``load_optimizer`` loads the optimizer part
        the strategy's way (FSDP)."""
        (load_optimizer or self.optimizer.load_state_dict)(state["optimizer"])
        self.micro_step = int(state.get("micro_step", 0))
        self._window = int(state.get("window", self.accumulate))
        self._remaining = state.get("remaining")
        self.step_count = int(state.get("step_count", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        if "grads" in state:
            self.load_local_state_dict({"grads": state["grads"]})

    def __repr__(self) -> str:
        return (f"OptimWrapper({type(self.optimizer).__name__}, precision={self.precision!r}, "
                f"accumulate={self.accumulate}, clip_grad={self.clip_grad})")


#: MMEngine's ``optim_wrapper`` keys that treadle's OptimWrapper honours.
WRAPPER_KEYS = ("type", "optimizer", "paramwise_cfg", "accumulative_counts", "clip_grad", "dtype", "loss_scale")


def build_optim_wrapper(cfg: Any, module: torch.nn.Module, *, device_type: str = "cpu") -> OptimWrapper:
    """An OptimWrapper from an Optimizer, an OptimWrapper (returned as it is), or
    MMEngine's ``optim_wrapper`` dict over ``module``'s parameters::

        dict(optimizer=dict(type="AdamW", lr=1e-3), accumulative_counts=2,
             clip_grad=dict(max_norm=1.0), dtype="bfloat16",   # dtype: AMP (AmpOptimWrapper)
             paramwise_cfg=dict(norm_decay_mult=0.0))

    ``type`` is "OptimWrapper" (fp32 unless ``dtype`` is given) or "AmpOptimWrapper"
    (fp16 unless ``dtype="bfloat16"``; ``loss_scale``: see :class:`OptimWrapper`)."""
    if isinstance(cfg, OptimWrapper):
        return cfg
    if isinstance(cfg, torch.optim.Optimizer):
        return OptimWrapper(cfg, device_type=device_type)
    if not isinstance(cfg, dict):
        raise TypeError(f"optim_wrapper must be an OptimWrapper, a torch.optim.Optimizer or a dict such as "
                        f"dict(optimizer=dict(type='AdamW', lr=1e-3)), got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(WRAPPER_KEYS))
    if unknown:
        raise ValueError(f"optim_wrapper has unknown keys {unknown}; expected some of {list(WRAPPER_KEYS)}")
    kind = cfg.get("type", "OptimWrapper")
    if kind not in ("OptimWrapper", "AmpOptimWrapper"):
        raise ValueError(f"optim_wrapper type={kind!r}; expected 'OptimWrapper' or 'AmpOptimWrapper'")
    if "optimizer" not in cfg:
        raise ValueError("optim_wrapper has no 'optimizer'; expected e.g. dict(optimizer=dict(type='AdamW', lr=1e-3))")
    dtype = cfg.get("dtype")
    amp = "16" if dtype is None else amp_precision(dtype)  # AmpOptimWrapper: fp16 unless told
    if amp is None:
        raise ValueError(f"optim_wrapper dtype={dtype!r}; expected 'float16' or 'bfloat16' (or None)")
    precision = amp if kind == "AmpOptimWrapper" or dtype is not None else "32"
    opt_cfg = cfg["optimizer"]
    if "paramwise_cfg" in cfg:
        if not isinstance(opt_cfg, dict):
            raise TypeError("optim_wrapper paramwise_cfg needs optimizer as a config dict, not an Optimizer object")
        opt_cfg = {**opt_cfg, "paramwise": cfg["paramwise_cfg"]}
    optimizer = build_optimizer(opt_cfg, module, where="optim_wrapper.optimizer")
    return OptimWrapper(optimizer, precision=precision, device_type=device_type,
                        accumulate=cfg.get("accumulative_counts", 1), clip_grad=cfg.get("clip_grad"),
                        loss_scale=cfg.get("loss_scale", "dynamic"))
