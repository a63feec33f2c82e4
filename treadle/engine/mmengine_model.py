"""A model's own steps, called the way the model expects: treadle's ``train_step(batch,
trainer)`` / ``val_step(batch, trainer)``, or MMEngine's ``BaseModel`` interface.

An MMEngine model is told apart by its ``train_step(data, optim_wrapper)`` (the second
parameter's name, as ``mmengine.model.BaseModel`` and its subclasses spell it; no import
of mmengine). For one it gets what MMEngine's runner gives it:

* ``train_step(data, optim_wrapper)``: the batch and the run's OptimWrapper (which has
  MMEngine's ``optim_context``, ``update_params``, ``backward``, ``step``, ``zero_grad``);
  several optimizers: the dict of them by name (MMEngine's ``OptimWrapperDict`` is read by
  name the same way). It runs its ``data_preprocessor`` itself; what it returns
  (``log_vars``) is logged. Wrapped by the strategy (DDP), it is stepped as MMEngine's
  ``MMDistributedDataParallel`` steps it: the forward through the wrapper.
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
    """The model's train step as ``step(batch, trainer)``, or None when it has none. An
    MMEngine model whose strategy wrapped it in another module (DDP) is stepped as MMEngine's
    ``MMDistributedDataParallel.train_step`` steps it (:func:`wrapped_train_step`); one that is
    its own (one process; FSDP2, which shards the module in place) by its own ``train_step``."""
    step = getattr(module, "train_step", None)
    if step is None:
        return None
    if not is_mmengine_model(module):
        return step

    def mmengine_train_step(batch: Any, trainer: Any) -> Any:
        wrappers = trainer.optim_wrappers
        optim_wrapper = next(iter(wrappers.values())) if len(wrappers) == 1 else dict(wrappers)
        if trainer.model is module:
            return step(batch, optim_wrapper)
        return wrapped_train_step(module, trainer.model, batch, optim_wrapper)

    return mmengine_train_step


def wrapped_train_step(module: Any, wrapper: Any, data: Any, optim_wrapper: Any) -> Any:
    """MMEngine's ``MMDistributedDataParallel.train_step``: the model's ``data_preprocessor``,
    the forward with ``mode='loss'`` through ``wrapper`` (DDP: its gradient hooks fire in
    backward), the model's ``parse_losses``, then ``optim_wrapper.update_params``; returns
    the values to log. The model's own ``train_step`` would call the unwrapped module, whose
    gradients no process would exchange."""
    if isinstance(optim_wrapper, dict):
        raise ValueError(f"{type(module).__name__} is an MMEngine model with several optimizers "
                         f"({sorted(optim_wrapper)}) under a wrapping strategy (DDP): MMEngine steps those with a "
                         "wrapper per submodule (MMSeparateDistributedDataParallel), which treadle does not have; "
                         "train it with strategy fsdp, in one process, or write model.train_step(batch, trainer)")
    with optim_wrapper.optim_context(wrapper):
        data = module.data_preprocessor(data, training=True)
        if isinstance(data, dict):
            losses = wrapper(**data, mode="loss")
        elif isinstance(data, (list, tuple)):
            losses = wrapper(*data, mode="loss")
        else:
            raise TypeError(f"{type(module).__name__}.data_preprocessor returned a {type(data).__name__}; MMEngine "
                            "models take a dict, list or tuple")
    loss, log_vars = module.parse_losses(losses)
    optim_wrapper.update_params(loss)
    return log_vars


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


__all__ = ["MMENGINE_STEP_ARG", "is_mmengine_model", "model_eval_step", "model_train_step", "wrapped_train_step"]
