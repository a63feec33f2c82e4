"""A model's own steps, called the way the model expects: treadle's ``train_step(batch,
trainer)`` / ``val_step(batch, trainer)``, or MMEngine's ``BaseModel`` interface.

An MMEngine model is told apart by its ``train_step(data, optim_wrapper)`` (the second
parameter's name, as ``mmengine.model.BaseModel`` and its subclasses spell it; no import
of mmengine). For one it gets what MMEngine's runner gives it:

* ``train_step(data, optim_wrapper)``: the batch and the run's OptimWrapper (which has
  MMEngine's ``optim_context``, ``update_params``, ``backward``, ``step``, ``zero_grad``);
  several optimizers: the dict of them by name (MMEngine's ``OptimWrapperDict`` is read by
  name the same way). It runs its ``data_preprocessor`` itself; what it returns
  (``log_vars``) is logged.
* ``val_step(data)`` / ``test_step(data)``: the predictions, which go to every metric as
  ``metric.update(predictions, batch)`` (MMEngine's ``evaluator.process(data_samples=
  predictions, data_batch=batch)``); nothing else is logged.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

#: The second parameter of an MMEngine model's ``train_step``.
MMENGINE_STEP_ARG = "optim_wrapper"


def _params(fn: Any) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an odd callable: not MMEngine's
        return []


def is_mmengine_model(module: Any) -> bool:
    """Whether ``module.train_step`` is MMEngine's ``train_step(data, optim_wrapper)``."""
    step = getattr(module, "train_step", None)
    params = _params(step) if callable(step) else []
    return len(params) >= 2 and params[1].name == MMENGINE_STEP_ARG


def model_train_step(module: Any) -> Callable[[Any, Any], Any] | None:
    """The model's train step as ``step(batch, trainer)``, or None when it has none."""
    step = getattr(module, "train_step", None)
    if step is None:
        return None
    if not is_mmengine_model(module):
        return step

    def mmengine_train_step(batch: Any, trainer: Any) -> Any:
        wrappers = trainer.optim_wrappers
        return step(batch, next(iter(wrappers.values())) if len(wrappers) == 1 else dict(wrappers))

    return mmengine_train_step


def model_eval_step(module: Any, name: str) -> Callable[[Any, Any], Any] | None:
    """The model's ``val_step``/``test_step`` (``name``) as ``step(batch, trainer)`` returning
    values to log, or None when it has none."""
    step = getattr(module, name, None)
    if step is None:
        return None
    if not is_mmengine_model(module):
        return step

    def mmengine_eval_step(batch: Any, trainer: Any) -> dict[str, Any]:
        trainer.update_metrics(step(batch), batch)
        return {}

    return mmengine_eval_step


__all__ = ["MMENGINE_STEP_ARG", "is_mmengine_model", "model_eval_step", "model_train_step"]
