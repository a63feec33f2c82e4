"""The default train and eval steps: batch -> forward -> losses -> optimizer.

``make_train_step`` returns the default step, one function::

    batch = move(batch)                          # to the strategy's device
    if loss_fn: losses = loss_fn(model(inputs), targets)
    else:       losses = model(batch)            # tensor or dict of losses (model(**batch) for a
                                                 # dict, model(inputs, targets) for a pair: whole_batch_caller)
    total, logged = parse_losses(losses)         # keys containing "loss" are summed
    del losses                                   # the outputs (logits) let go before backward
    optim_wrapper.update(total)                  # backward, and step when the window closes
    return logged                                # detached: goes to the logger

Under bf16/fp16 the calls of the model and of ``loss_fn`` each run inside autocast (the
loss sum and backward outside it, as torch advises); fp32 enters no context. When DDP
accumulates gradients, the whole step runs inside its ``no_sync`` on the iterations that
do not step (DDP decides in the forward, so forward and backward must both be inside).

``Trainer(timer_breakdown=True)`` gives it a timer whose marks it calls between the
phases (``treadle/hooks/phase_timer.py``); without one there are no marks.

With ``train_metrics`` (a ``feed``, see ``treadle/hooks/train_metrics.py``) the step also
calls ``feed(outputs, targets)`` after the loss, outside autocast (the metrics compute in
float32, as in evaluation); without them the step has no such call.

An exception from the model, the loss or backward leaves with one line of context
added (``treadle/hints.py``), from ``except`` clauses only: nothing is checked per step.

Under tensor parallelism with the loss on class shards (``loss_parallel``: the plan keeps
the output layer's classes split), each step runs inside torch's ``loss_parallel()``,
and what leaves it (logged values, the outputs metrics see) is made whole first.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch import Tensor, nn

from treadle.hints import backward_error, loss_error, model_error
from treadle.optim.wrapper import OptimWrapper
from treadle.hooks.phase_timer import PhaseTimer

Batch = Any
StepFn = Callable[[Batch], dict[str, Tensor]]
FeedFn = Callable[[Any, Any], None]  # (outputs, targets): the train metrics' update


def takes_inputs_and_targets(module: nn.Module) -> bool:
    """Whether ``module.forward`` takes a batch's two parts, ``forward(inputs, targets)``, as
    torchvision's detection models do (``forward(images, targets=None)``): its first two
    parameters are positional, the first without a default, the second without one or with
    None, and any after them have defaults. A forward of one parameter (``forward(batch)``),
    of ``*args``, or whose second parameter defaults to anything but None
    (``forward(batch, return_all=False)``) does not."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a builtin or C forward: no signature to read
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 or positional[0].default is not positional[0].empty:
        return False
    second = positional[1]
    if second.default is not second.empty and second.default is not None:
        return False
    rest_optional = all(p.default is not p.empty for p in positional[2:])
    no_required_keywords = all(p.default is not p.empty for p in params if p.kind is p.KEYWORD_ONLY)
    return rest_optional and no_required_keywords


def whole_batch_caller(module: nn.Module) -> Callable[[Callable[..., Any], Batch], Any]:
    """How the default step calls the model on the whole batch (no ``loss_fn``), decided
    once from ``module.forward``'s signature:

    * a mapping batch (a dict, Hugging Face's ``BatchEncoding``) is passed as keyword
      arguments, ``model(**batch)``, when the forward takes ``**kwargs`` or has a parameter
      named after every key of the batch (a Hugging Face model's ``input_ids``,
      ``attention_mask``, ``labels``);
    * a batch that is a pair ``(inputs, targets)`` (a tuple or list of two) goes in as
      ``model(inputs, targets)`` when the forward takes the two
      (:func:`takes_inputs_and_targets`: torchvision's detection models with their reference
      collate ``lambda b: tuple(zip(*b))``), in training and in evaluation alike;
    * any other batch, and any other model: ``model(batch)``.
    """
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a builtin or C forward: no signature to read
        params = []
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    names = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    pair = takes_inputs_and_targets(module)

    def call(model: Callable[..., Any], batch: Batch) -> Any:
        if isinstance(batch, Mapping) and (any_keyword or (names and batch.keys() <= names)):
            return model(**batch)
        if pair and isinstance(batch, (tuple, list)) and len(batch) == 2:
            return model(batch[0], batch[1])
        return model(batch)
    return call


def metric_inputs(outputs: Any, batch: Batch) -> tuple[Any, Any]:
    """``(outputs, targets)`` for metrics when the model took the whole batch: the
    ``logits`` of an output that has them (a Hugging Face ``ModelOutput``, a dataclass)
    and a mapping batch's ``labels`` (or ``targets``)
    when they have them; else the output as it is and the batch's second element (or
    the batch)."""
    named = _as_mapping(outputs) if not isinstance(outputs, Tensor) else None
    if named is not None and "logits" in named:
        outputs = named["logits"]
    if isinstance(batch, Mapping):
        for key in ("labels", "targets"):  # Hugging Face's name, torchvision detection's
            if key in batch:
                return outputs, batch[key]
    try:
        return outputs, unpack_batch(batch)[1]
    except TypeError:
        return outputs, batch


def unpack_batch(batch: Batch) -> tuple[Any, Any]:
    """Split a batch into ``(inputs, targets)``.

    Accepted: a 2-element tuple/list, or a dict with "inputs"/"targets" (or the
    singular "input"/"target") keys.
    """
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, dict):
        for a, b in (("inputs", "targets"), ("input", "target")):
            if a in batch and b in batch:
                return batch[a], batch[b]
        got = f"a dict with keys {sorted(map(str, batch))}"
    elif isinstance(batch, (tuple, list)):
        got = f"a {type(batch).__name__} of {len(batch)} elements"
    else:
        got = f"a {type(batch).__name__}"
    raise TypeError(f"the default step cannot unpack the batch: got {got}; expected (inputs, targets) "
                    "or a dict with 'inputs' and 'targets' keys. Pass loss_fn=None and a model that takes "
                    "the whole batch, or define model.train_step(batch, trainer).")


def _as_mapping(losses: Any) -> Mapping[str, Any] | None:
    """A model output that carries its losses by name: a dict or other mapping (a Hugging
    Face ``ModelOutput``), a dataclass, or an object with a ``loss`` tensor."""
    if isinstance(losses, Mapping):
        return losses
    if dataclasses.is_dataclass(losses) and not isinstance(losses, type):
        return {f.name: getattr(losses, f.name) for f in dataclasses.fields(losses)}
    if isinstance(getattr(losses, "loss", None), Tensor):
        return {"loss": losses.loss}
    return None


def _loggable(value: Any) -> bool:
    """A value the logger takes: a one-element tensor or a plain number. Anything else (a
    model's logits, a cache object) is dropped before the logger sees it: nothing large
    stays on the device for the log window, nothing non-numeric reaches the writers."""
    if isinstance(value, Tensor):
        return value.numel() == 1  # metadata only: no device read
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_losses(losses: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Total loss and the detached values to log.

    ``losses``: a tensor; a list of tensors (summed); or an output that carries its
    losses by name (a dict, a Hugging Face ``ModelOutput``, a dataclass, an object with a
    ``loss``): its entries whose key contains "loss" are summed into the total (MMEngine's
    rule; a ``total_loss`` entry is the total itself, basecls' rule), logged as "loss";
    its other one-element tensors and numbers are logged too; everything else is dropped.
    """
    if isinstance(losses, Tensor):
        return losses, {"loss": losses.detach()}
    named = _as_mapping(losses)
    if named is not None:
        if "total_loss" in named:
            terms = [named["total_loss"]]
        else:
            terms = [v for k, v in named.items() if "loss" in k and v is not None]
        if not terms:
            raise ValueError(f"the loss dict has no key containing 'loss' (keys: {sorted(named)}); entries whose "
                             "name contains 'loss' are summed into the total (a Hugging Face model returns a loss "
                             "when the batch holds its labels)")
        total = terms[0] if len(terms) == 1 else sum(terms)
        logged = {k: (v.detach() if isinstance(v, Tensor) else v) for k, v in named.items() if _loggable(v)}
        logged["loss"] = total.detach()
        return total, logged
    if isinstance(losses, (list, tuple)) and losses and all(isinstance(v, Tensor) for v in losses):
        total = sum(losses)
        return total, {"loss": total.detach()}
    raise TypeError(f"losses must be a Tensor, a dict of Tensors, a list of Tensors or an output with a loss "
                    f"(a ModelOutput, a dataclass), got {type(losses).__name__}")


def autocasting(fn: Callable[..., Any], autocast: Callable[[], Any]) -> Callable[..., Any]:
    """``fn`` run inside ``autocast()`` (a fresh context per call)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        with autocast():
            return fn(*args, **kwargs)
    return run


def outputs_and_loss(model: Callable[..., Any], loss_fn: Callable[..., Any], batch: Batch,
                     mode: str) -> tuple[Any, Any, Any]:
    """``(outputs, targets, losses)`` of ``model`` on the batch's inputs and ``loss_fn`` on
    its targets; an error in either gets its hint (treadle/hints.py) for ``mode``."""
    inputs, targets = unpack_batch(batch)
    try:
        outputs = model(inputs)
    except Exception as e:
        raise model_error(e, inputs, mode)
    try:
        return outputs, targets, loss_fn(outputs, targets)
    except Exception as e:
        raise loss_error(e, outputs, targets, mode)


def _whole(value: Any) -> Any:
    """A DTensor made a plain tensor holding all of it (others as they are)."""
    full = getattr(value, "full_tensor", None)
    return full() if full is not None else value


def on_class_shards(step: Callable[[Batch], Any], eval_step: bool = False) -> Callable[[Batch], Any]:
    """``step`` inside torch's ``loss_parallel()`` (the model's output split on the
    classes: cross-entropy computed on the shards, backward too); the logged values (and
    an eval step's outputs) come out whole."""
    from torch.distributed.tensor.parallel import loss_parallel

    def run(batch: Batch) -> Any:
        with loss_parallel():
            result = step(batch)
        if eval_step:
            outputs, targets, logged = result
            return _whole(outputs), targets, {k: _whole(v) for k, v in logged.items()}
        return {k: _whole(v) for k, v in result.items()}
    return run


def make_train_step(model: nn.Module, loss_fn: Callable[..., Any] | None, optim_wrapper: OptimWrapper,
                    move: Callable[[Batch], Batch] | None, timer: PhaseTimer | None = None,
                    feed: FeedFn | None = None, module: nn.Module | None = None,
                    loss_parallel: bool = False) -> StepFn:
    """The default training step: ``step(batch) -> logged``, read top to bottom below.

    What varies with the configuration is chosen here, once: ``move`` (None: batches
    stay where the loader put them), autocast (a no-op in fp32), the accumulation
    context (DDP's ``no_sync`` when accumulating, so gradients are all-reduced once per
    window; else a no-op), and the phase marks of ``timer`` (``Trainer(timer_breakdown=True)``,
    treadle/hooks/phase_timer.py; none without one). The mark between backward and the
    optimizer is the timer's too, called first among ``optim_wrapper.after_backward_callbacks``
    (the Trainer puts it there), so ``update()`` stays untouched.
    ``feed``: the train metrics' ``update(outputs, targets)``, called after the loss (it
    needs a ``loss_fn``: without one the model returns losses, not outputs).
    Without a ``loss_fn`` the model gets the whole batch, as :func:`whole_batch_caller`
    decides from ``module`` (the unwrapped model; default ``model``).
    ``loss_parallel``: the step runs as :func:`on_class_shards` says.
    """
    call = whole_batch_caller(module if module is not None else model)
    if feed is not None and loss_fn is None:
        raise ValueError("train_metrics need the model's outputs, which the default step has only with a loss_fn")
    if feed is not None and loss_parallel:
        sharded_feed = feed
        feed = lambda outputs, targets: sharded_feed(_whole(outputs), targets)  # noqa: E731  # metrics see all classes
    update = optim_wrapper.update
    # Under bf16/fp16 the model and the loss run inside autocast, each call in its own
    # context; the metrics' feed, the loss sum and backward outside it. fp32: no context.
    forward, compute_loss = model, loss_fn
    if optim_wrapper.precision != "32":
        forward = autocasting(model, optim_wrapper.autocast)
        compute_loss = autocasting(loss_fn, optim_wrapper.autocast) if loss_fn is not None else None
    timed = timer is not None  # untimed: a branch per mark, not a call
    begin, mark, end = (timer.begin, timer.mark, timer.end) if timer is not None else (None, None, None)

    def step(batch: Batch) -> dict[str, Tensor]:
        if timed:
            begin()
        if move is not None:
            batch = move(batch)
        if compute_loss is None:  # the model takes the whole batch and returns its loss(es)
            try:
                losses = call(forward, batch)
            except Exception as e:
                raise model_error(e, batch, "train", whole_batch=True)
            if timed:
                mark()  # forward done; the loss phase is parse_losses only
        else:
            inputs, targets = unpack_batch(batch)
            try:
                outputs = forward(inputs)
            except Exception as e:
                raise model_error(e, inputs, "train")
            if timed:
                mark()
            try:
                losses = compute_loss(outputs, targets)
            except Exception as e:
                raise loss_error(e, outputs, targets, "train")
            if feed is not None:
                feed(outputs, targets)
            del outputs
        total, logged = parse_losses(losses)
        del losses  # the model's outputs (logits): backward does not need them, freed before it runs
        if timed:
            mark()
        try:
            update(total)  # backward, then (when the window closes) clip, step, zero_grad
        except Exception as e:  # backward or the optimizer: a line of context (treadle/hints.py)
            raise backward_error(e, total)
        if timed:
            end()
        return logged

    if optim_wrapper.gradient_sync.no_sync is not None and optim_wrapper.accumulate > 1:
        accumulation = optim_wrapper.accumulation_context
        plain_step = step

        def step(batch: Batch) -> dict[str, Tensor]:  # inside DDP's no_sync when not stepping
            with accumulation():
                return plain_step(batch)
    return on_class_shards(step) if loss_parallel else step


def tell_if_outside_autocast(module: nn.Module, precision: str, device_type: str,
                              training: Callable[[], bool]) -> None:
    """Under bf16/fp16, say once when a custom train step runs the model's forward
    outside autocast (it then computes in float32, silently). Checked at the first
    forward of a layer with parameters while ``training()`` (not in validation, whose
    step autocasts itself); the hooks are removed after that one check.
    """
    if precision == "32":
        return
    handles: list[Any] = []

    def check(_: nn.Module, __: Any) -> None:
        if not training():
            return
        for h in handles:
            h.remove()
        handles.clear()
        if not torch.is_autocast_enabled(device_type):
            from treadle.logging.writers import get_logger

            get_logger().warning(
                f"precision={precision!r}: the custom train step ran the model outside autocast, so it computes in "
                "float32; wrap forward and backward in `with optim_wrapper.optim_context(model):` (or the forward "
                "in `with optim_wrapper.autocast():`)")
    for m in module.modules():
        if any(True for _ in m.parameters(recurse=False)):
            handles.append(m.register_forward_pre_hook(check))


def batch_size_of(targets: Any) -> int:
    """Number of samples in ``targets`` (first dimension), 1 when unknown."""
    if isinstance(targets, Tensor) and targets.dim() > 0:
        return targets.shape[0]
    if isinstance(targets, (list, tuple)):
        return len(targets)
    return 1


def make_eval_step(model: nn.Module, loss_fn: Callable[..., Any] | None, autocast: Callable[[], Any],
                   move: Callable[[Batch], Batch] | None, module: nn.Module | None = None,
                   loss_parallel: bool = False) -> Callable[[Batch], tuple[Any, Any, dict[str, Tensor]]]:
    """The default validation/test step: ``batch -> (outputs, targets, losses)``.

    With ``loss_fn``: ``outputs = model(inputs)`` and the losses are computed. Without
    it, the model gets the whole batch (:func:`whole_batch_caller`); a mapping output's
    "loss" entries are reported, and metrics get :func:`metric_inputs` (a Hugging Face
    output's ``logits`` and the batch's ``labels``). ``loss_parallel``: as
    :func:`on_class_shards` says.
    """
    call = whole_batch_caller(module if module is not None else model)

    def step(batch: Batch) -> tuple[Any, Any, dict[str, Tensor]]:
        if move is not None:
            batch = move(batch)
        with autocast():
            if loss_fn is not None:
                outputs, targets, losses = outputs_and_loss(model, loss_fn, batch, "eval")
                _, logged = parse_losses(losses)
                return outputs, targets, logged
            try:
                outputs = call(model, batch)
            except Exception as e:
                raise model_error(e, batch, "eval", whole_batch=True)
        logged: dict[str, Tensor] = {}
        named = _as_mapping(outputs) if not isinstance(outputs, Tensor) else None
        if named is not None and any("loss" in k and named[k] is not None for k in named):
            _, logged = parse_losses({k: v for k, v in named.items() if "loss" in k and v is not None})
        return (*metric_inputs(outputs, batch), logged)
    return on_class_shards(step, eval_step=True) if loss_parallel else step
