"""Errors from the user's model, loss and metrics, with one line of context added.

The default steps (treadle/engine/step.py) and the evaluation loop (treadle/engine/eval_loop.py) call
these only from an ``except`` clause: the happy path pays nothing (Python 3.11's
exceptions cost nothing until raised), reads no tensor and syncs no device. Each
function adds one note to the exception, ``treadle: <what was running>: <what it was
given>; <the likely fix>``, and records that line as ``error.treadle_hint``; the
exception itself (its type, message and traceback) is the user's, raised on as it is.
The command line prints the short form of such an error (see treadle/cli.py).

Shape mismatches that torch's losses only warn about (``mse_loss``, ``l1_loss``,
``smooth_l1_loss``, ``huber_loss`` broadcast a (N, 1) output against (N,) targets into
an (N, N) difference) are errors while a Trainer runs: :func:`strict_loss_shapes`.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Any, Iterator

from torch import Tensor

HINT_ATTR = "treadle_hint"
# The start of torch.nn.functional's warning for losses whose input and target sizes
# differ (a filter's message matches at the start). Kept short: the filter compiles it
# at a process's first run (re caches it after), 0.1 ms for the whole sentence.
BROADCAST_WARNING = "Using a target size "


@contextlib.contextmanager
def strict_loss_shapes() -> Iterator[None]:
    """While inside: torch's loss-broadcasting warning is raised as an exception (which
    :func:`loss_error` turns into a ValueError with a hint). Other warnings, and the
    filters outside, are left as they are."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=BROADCAST_WARNING, category=UserWarning)
        yield


def hint_of(error: BaseException) -> str | None:
    """The line treadle added to ``error``, or None."""
    hint = getattr(error, HINT_ATTR, None)
    return hint if isinstance(hint, str) else None


def add_hint(error: BaseException, line: str) -> BaseException:
    """Add ``line`` to ``error`` (a note, and ``error.treadle_hint``), once: the innermost
    context wins. Returns ``error``."""
    if hint_of(error) is None:
        setattr(error, HINT_ATTR, line)
        error.add_note(f"treadle: {line}")
    return error


def describe(value: Any, depth: int = 0) -> str:
    """A short description of a step's value: ``Tensor (64, 10) float32``, ``tuple of 2
    [...]``, ``dict with keys [...]``."""
    if isinstance(value, Tensor):
        device = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"Tensor {_shape(value)} {str(value.dtype).removeprefix('torch.')}{device}"
    if isinstance(value, (tuple, list)):
        head = f"{type(value).__name__} of {len(value)}"
        if depth or not value:
            return head
        items = [describe(v, depth + 1) for v in value[:3]] + (["..."] if len(value) > 3 else [])
        return f"{head} [{', '.join(items)}]"
    if isinstance(value, dict):
        keys = sorted(map(str, value))
        return f"dict with keys {keys[:8]}{' ...' if len(keys) > 8 else ''}"
    return type(value).__name__


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(map(str, t.shape)) + ("," if t.dim() == 1 else "") + ")"


def _phase(mode: str) -> str:
    return {"train": "the training step", "eval": "evaluation", "val": "validation", "test": "the test"}.get(mode, mode)


# -- the model --------------------------------------------------------------------------
def model_error(error: BaseException, inputs: Any, mode: str, whole_batch: bool = False) -> BaseException:
    """An exception from ``model(inputs)`` (``whole_batch``: no loss_fn, so the model
    was given the whole batch)."""
    call = "model(batch)" if whole_batch else "model(inputs)"
    line = f"in {call} of {_phase(mode)}, {'batch' if whole_batch else 'inputs'}: {describe(inputs)}"
    text = str(error)
    fix = None
    if "must be Tensor, not" in text and isinstance(inputs, (tuple, list, dict)) and whole_batch:
        fix = ("without loss_fn the model is given the whole batch; pass loss_fn= so that treadle calls "
               "model(inputs) and loss_fn(outputs, targets), or unpack the batch in forward")
    elif ("expected scalar type" in text or "should be the same" in text or "dtype" in text) and _has_double(inputs):
        fix = "the inputs are float64 while the model is float32: build the data as float32 (e.g. x.float())"
    elif "same device" in text:
        fix = ("the model and a tensor it uses are on different devices: treadle moves the batch to the "
               "strategy's device; a tensor made in forward must go there too (e.g. device=x.device)")
    elif "shapes cannot be multiplied" in text or "size mismatch" in text or ("expected input" in text
                                                                              and "channels" in text):
        fix = "a layer does not fit the shape of the inputs: check the model's first layers against the data"
    return add_hint(error, line + (f"; {fix}" if fix else ""))


def _has_double(value: Any) -> bool:
    if isinstance(value, Tensor):
        return value.is_floating_point() and value.element_size() == 8
    if isinstance(value, (tuple, list)):
        return any(_has_double(v) for v in value)
    if isinstance(value, dict):
        return any(_has_double(v) for v in value.values())
    return False


# -- the loss ---------------------------------------------------------------------------
def loss_error(error: BaseException, outputs: Any, targets: Any, mode: str) -> BaseException:
    """An exception from ``loss_fn(outputs, targets)``. torch's broadcasting warning
    (see :func:`strict_loss_shapes`) becomes a ValueError, chained to it."""
    seen = f"outputs: {describe(outputs)}, targets: {describe(targets)}"
    line = f"in loss_fn(outputs, targets) of {_phase(mode)}, {seen}"
    text = str(error)
    if isinstance(error, UserWarning) and "different to the input size" in text:
        fix = (f"outputs {_shape(outputs) if isinstance(outputs, Tensor) else ''} and targets "
               f"{_shape(targets) if isinstance(targets, Tensor) else ''} would be broadcast against each other, "
               "giving a wrong loss: make them the same shape (e.g. outputs.squeeze(-1) or targets.view(-1, 1))")
        fix = " ".join(fix.split())
        converted = ValueError(f"loss_fn: {text}").with_traceback(error.__traceback__)
        converted.__cause__ = error
        return add_hint(converted, f"{line}; {fix}")
    fix = None
    if isinstance(outputs, (tuple, list, dict)):
        kind = type(outputs).__name__
        fix = (f"the model returned a {kind}, and loss_fn is given the model's output as it is: return one tensor "
               "from forward, or give a loss_fn that picks it, e.g. lambda outputs, targets: "
               "F.cross_entropy(outputs[0], targets)")
    elif _float_class_targets(outputs, targets) or "expected target dtype to be Long" in text \
            or "expected scalar type Long" in text:
        fix = ("this loss takes class indices as int64 targets: convert them with targets.long() (or build the "
               "dataset with int64 labels)")
    elif "out of bounds" in text and isinstance(outputs, Tensor) and outputs.dim() >= 2:
        fix = f"the model has {outputs.shape[1]} outputs per sample; class indices must lie in [0, {outputs.shape[1] - 1}]"
    elif "size" in text and isinstance(outputs, Tensor) and isinstance(targets, Tensor):
        fix = "the outputs and targets do not fit this loss: check their shapes above against what it expects"
    return add_hint(error, line + (f"; {fix}" if fix else ""))


def _float_class_targets(outputs: Any, targets: Any) -> bool:
    """Floating-point targets with one dimension fewer than the outputs: class indices
    given as floats. Judged by the tensors, as torch's wording differs by device and
    release (CPU: "expected scalar type Long", CUDA: "... not implemented for 'Float'")."""
    return (isinstance(outputs, Tensor) and isinstance(targets, Tensor) and targets.is_floating_point()
            and outputs.dim() == targets.dim() + 1)


def backward_error(error: BaseException, total: Any) -> BaseException:
    """An exception from the optimizer wrapper's update (backward, then the step)."""
    text = str(error)
    if isinstance(total, Tensor) and total.dim() > 0 and total.numel() != 1:
        line = (f"in backward of the training step: the loss has shape {_shape(total)}, it must be a scalar; "
                "loss_fn returned one loss per element: use reduction='mean' (or return loss.mean())")
    elif isinstance(total, Tensor) and not total.requires_grad:
        line = ("in backward of the training step: the loss does not require grad; it was computed from detached "
                "values, under torch.no_grad(), or every parameter is frozen (requires_grad=False)")
    elif "does not require grad" in text or "second time" in text:
        line = f"in backward of the training step (loss: {describe(total)})"
    else:
        line = f"in backward and the optimizer step of the training step (loss: {describe(total)})"
    return add_hint(error, line)


# -- metrics ----------------------------------------------------------------------------
def metric_error(error: BaseException, name: str, outputs: Any, targets: Any, mode: str,
                 arg: str = "metrics") -> BaseException:
    """An exception from ``metrics[name].update(outputs, targets)`` (``arg``: the Trainer
    argument that holds it, "metrics" or "train_metrics")."""
    line = (f"in {arg}[{name!r}].update(outputs, targets) during {_phase(mode)}, outputs: {describe(outputs)}, "
            f"targets: {describe(targets)}; treadle calls update(outputs, targets): the model's outputs first, "
            "as torchmetrics' update(preds, target)")
    return add_hint(error, line)


def check_metric_update(name: str, metric: Any, arg: str = "metrics") -> None:
    """At construction: ``metric.update`` must take ``(outputs, targets)`` positionally
    (``arg``: the Trainer argument that holds it)."""
    try:
        sig = inspect.signature(metric.update)
    except (TypeError, ValueError):  # a builtin without a signature: it will tell at the first call
        return
    try:
        sig.bind(None, None)
    except TypeError:
        raise TypeError(f"{arg}[{name!r}] ({type(metric).__name__}): update{sig} cannot be called as "
                        "update(outputs, targets); treadle passes the model's outputs and the batch's targets, in "
                        "that order (torchmetrics' update(preds, target) works as it is)") from None


__all__ = ["BROADCAST_WARNING", "HINT_ATTR", "add_hint", "backward_error", "check_metric_update", "describe", "hint_of",
           "loss_error", "metric_error", "model_error", "strict_loss_shapes"]
