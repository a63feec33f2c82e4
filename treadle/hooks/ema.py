"""EMAHook: keep an exponential moving average of the model and evaluate with it."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority
from treadle.optim.ema import ExponentialMovingAverage, momentum_from_alpha

#: ``EMAHook(convention=...)``: whose rule the average follows (see the class docstring).
CONVENTIONS = ("timm", "mmengine")

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class EMAHook(Hook):
    """Average the weights after optimizer steps; validate/test with the average.

    Every ``interval`` iterations on which an optimizer stepped (with accumulation,
    only window-closing iterations count), the average moves towards the model;
    before iteration ``start`` it simply copies the model (basecls). Give either
    ``momentum`` or ``alpha`` (pycls: the momentum then follows from the total batch
    size, ``max_epochs`` and ``interval``, see :func:`momentum_from_alpha`).
    Validation and test swap the averaged weights in and back out, unless
    ``use_for_val=False``. The average is part of the checkpoint (hook state).

    ``convention``: "timm" (the above; the average starts from the initial weights, so
    the first update averages with them) or "mmengine", MMEngine's ``EMAHook`` with
    ``update_buffers=True`` (what a translated MMEngine config gets): every iteration
    counts, whether the optimizer stepped or not; before iteration ``start - 1`` (0-based;
    MMEngine's ``begin_iter``) the average copies the model; the first update from there
    copies it too, then every ``interval``-th update after it averages
    (``avg.lerp_(weights, 1 - momentum)``, floating-point tensors only: integer buffers
    keep the copied values).

    ``gamma``: a momentum that ramps up from 0 (YOLOX, mmdet's ``ExpMomentumEMA``), so
    the average follows the fast-moving early weights closely. The weight on the average
    is ``momentum * (1 - exp(-n / gamma))`` instead of ``momentum``, where n is the
    number of the update: with "timm", 1 for the first averaging update; with
    "mmengine", one more than MMEngine's ``steps`` (the copy is step 0, so the first
    averaging update has n = 2), which is mmdet's weight on the new value
    ``(1 - m) * exp(-(1 + steps) / gamma) + m`` with ``m = 1 - momentum``.
    """

    priority = Priority.NORMAL

    def __init__(self, momentum: float = 0.9998, interval: int = 1, start: int = 0, alpha: float | None = None,
                 use_for_val: bool = True, convention: str = "timm", gamma: float | None = None) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"ema interval must be an int >= 1, got {interval!r}")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"ema start must be an int >= 0 (an iteration), got {start!r}")
        if not _is_number(momentum):
            raise TypeError(f"ema momentum={momentum!r} is not a number; expected a float in [0, 1] such as 0.9998")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"ema momentum must be in [0, 1], got {momentum!r}")
        if alpha is not None and not _is_number(alpha):
            raise TypeError(f"ema alpha={alpha!r} is not a number; expected a float >= 0 such as 1e-5, or None")
        if alpha is not None and not 0.0 <= alpha < math.inf:  # NaN too
            raise ValueError(f"ema alpha={alpha!r} is out of range; expected a finite float >= 0 such as 1e-5")
        if not isinstance(use_for_val, bool):
            raise TypeError(f"ema use_for_val={use_for_val!r}; expected True (validate and test with the average) "
                            "or False")
        if convention not in CONVENTIONS:
            raise ValueError(f"ema convention={convention!r}; expected 'timm' (average from the initial weights, "
                             "on optimizer steps) or 'mmengine' (MMEngine's EMAHook: the first update copies)")
        if gamma is not None and not _is_number(gamma):
            raise TypeError(f"ema gamma={gamma!r} is not a number; expected a finite number > 0 such as 2000, or None")
        if gamma is not None and not 0.0 < gamma < math.inf:  # NaN too
            raise ValueError(f"ema gamma={gamma!r}; expected a finite number > 0 (updates over which the momentum "
                             "ramps up, e.g. 2000), or None for a constant momentum")
        if convention == "mmengine" and alpha is not None:
            raise ValueError("ema alpha= is pycls's rule; with convention='mmengine' give momentum=")
        self.convention = convention
        self._updates = 0  # mmengine: updates since the average started (MMEngine's ``steps``)
        self.momentum = momentum
        self.interval = interval
        self.start = start
        self.alpha = alpha
        self.use_for_val = use_for_val
        self.gamma = gamma
        self.ema: ExponentialMovingAverage | None = None
        self._pending_state: dict[str, Any] | None = None
        self._last_steps = 0
        self._swapped = False

    def _ensure(self, trainer: "RunView") -> ExponentialMovingAverage:
        if self.ema is None:
            self.ema = ExponentialMovingAverage(trainer.module, self.momentum)
            if self._pending_state is not None:
                self.ema.load_state_dict(self._pending_state)
                self._pending_state = None
        return self.ema

    def before_run(self, trainer: "RunView") -> None:
        self._ensure(trainer)

    def before_train(self, trainer: "RunView") -> None:
        if self.alpha is not None:
            batch = getattr(trainer.train_dataloader, "batch_size", None)
            if not batch or not trainer.state.max_epochs:
                raise ValueError("ema alpha= needs a DataLoader with a batch_size and a known number of epochs; "
                                 "give momentum= instead")
            accumulate = trainer.optim_wrapper.accumulate if len(trainer.optim_wrappers) == 1 else 1
            total = batch * trainer.strategy.dp_size * max(1, accumulate)
            self.momentum = momentum_from_alpha(self.alpha, total, trainer.state.max_epochs, self.interval)
            self._ensure(trainer).momentum = self.momentum
        self._last_steps = sum(ow.step_count for ow in trainer.optim_wrappers.values())

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        if self.convention == "mmengine":
            self._mmengine_update(trainer)
            return
        steps = sum(ow.step_count for ow in trainer.optim_wrappers.values())
        if steps == self._last_steps:  # no optimizer step on this iteration
            return
        self._last_steps = steps
        it = trainer.state.iter
        if (it + 1) % self.interval:
            return
        ema = self.ema or self._ensure(trainer)
        if it < self.start:
            ema.copy_from(trainer.module)
        else:
            ema.update(trainer.module, self._ramped(ema.num_updates + 1))

    def _mmengine_update(self, trainer: "RunView") -> None:
        """MMEngine's rule (the class docstring), on every iteration."""
        ema = self.ema or self._ensure(trainer)
        if trainer.state.iter + 1 < self.start:
            ema.copy_from(trainer.module)
            return
        if self._updates == 0:
            ema.copy_from(trainer.module)
        elif self._updates % self.interval == 0:
            ema.lerp(trainer.module, 1.0 - self._ramped(self._updates + 1))
        self._updates += 1

    def _ramped(self, n: int) -> float:
        """The weight on the average at the ``n``-th update (``gamma``: see the class docstring)."""
        if self.gamma is None:
            return self.momentum
        return self.momentum * -math.expm1(-n / self.gamma)

    def _swap_in(self, trainer: "RunView") -> None:
        if self.use_for_val and not self._swapped:
            self._ensure(trainer).swap(trainer.module)
            self._swapped = True

    def _swap_out(self, trainer: "RunView", *args: Any) -> None:
        if self._swapped:
            self.ema.swap(trainer.module)  # type: ignore[union-attr]  # swapped in: _ensure() built it
            self._swapped = False

    before_val = before_test = _swap_in
    after_val = after_test = _swap_out

    def after_run(self, trainer: "RunView") -> None:
        self._swap_out(trainer)  # in case an evaluation raised half-way

    def state_dict(self) -> dict[str, Any]:
        state = self.ema.state_dict() if self.ema is not None else (self._pending_state or {})
        return {"ema": state, "momentum": self.momentum, "updates": self._updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentum = float(state.get("momentum", self.momentum))
        self._updates = int(state.get("updates", 0))
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        else:
            self._pending_state = state["ema"]


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
