"""Activation checkpointing: chosen submodules keep their inputs, not their intermediate
tensors, and run their forward again in backward to get them back.

    apply_activation_checkpointing(model, "full")            # every block of the model's main stack
    apply_activation_checkpointing(model, "selective")       # the same blocks, matmul outputs kept
    apply_activation_checkpointing(model, ["GPT2Block"])     # classes (or class names, or submodule paths)
    apply_activation_checkpointing(model, {"modules": ["Block"], "mode": "selective"})
    apply_activation_checkpointing(model, {"check_fn": lambda m: isinstance(m, Block)})  # a predicate

``Strategy.prepare(model, activation_checkpointing=...)`` calls it before the model is
placed and wrapped (DDP, FSDP2's ``fully_shard``, DeepSpeed), the Trainer's
``activation_checkpointing=`` is that argument, and a hand-written loop may call it too.

How: each chosen module's ``forward`` becomes, on that instance only, a call of the
original forward through ``torch.utils.checkpoint.checkpoint`` (non-reentrant, the RNG
state saved and restored so dropout draws the same masks when recomputed). Nothing else
changes: the module's class, its parameters, their names and so every state dict key stay
as they are (torch's ``checkpoint_wrapper`` adds ``_checkpoint_wrapped_module.`` to
parameter names), so a checkpoint saved with activation checkpointing loads without it and
the other way round, parameter-name patterns (optimizer ``paramwise`` options, tensor
parallel plans) match the same parameters, and FSDP2's hooks, registered on the same
module, run outside the recomputed region: its all-gather happens once per forward and
once per backward, as without checkpointing. Without autograd (``torch.no_grad``,
evaluation) the original forward runs directly, at no cost. ``copy.deepcopy`` (EMA) and
pickling keep the change, bound to the copy.

Modes (torchtitan's names):

* ``full``: a chosen module keeps only its inputs; its whole forward runs again in
  backward (about one more forward per step).
* ``selective``: torchtitan's per-op selective checkpointing through
  ``torch.utils.checkpoint.create_selective_checkpoint_contexts``: inside a chosen module
  the outputs of matrix multiplications and attention kernels (:data:`SAVED_OPS`) are
  kept and only the rest (normalizations, activations, dropout, softmax, additions) runs
  again. That recomputes no matmul FLOPs, so it costs little time, and it saves less memory
  than ``full``: the matmul outputs are a large share of a transformer block's
  activations. torchtitan's variant that also drops every other matmul output is not
  offered: ``full`` is the choice when memory matters more.

Which modules, for ``"full"`` and ``"selective"`` given alone: the model's main stack of
blocks, found by one rule: among the model's ``nn.ModuleList``, ``nn.Sequential`` and
``nn.ModuleDict`` containers whose children are all of one class, the one holding the most
parameters names that class, and every submodule of exactly that class is checkpointed
(GPT-2's ``GPT2Block``, Llama's ``LlamaDecoderLayer``, T5's ``T5Block`` in encoder and
decoder, a ResNet's ``Bottleneck``, torchtitan's ``TransformerBlock``). A model without
such a container is an error asking for the classes. Given modules are matched as
FSDPStrategy's ``wrap`` matches them (a class, including subclasses; a class name; a
dotted ``module.QualName``); a string that names no class of the model may name a
submodule path instead (``backbone.layer1``, as MMEngine's runner takes them). Where a
chosen module lies inside another chosen one, only the outer one is checkpointed.

A Hugging Face model whose ``config.use_cache`` is on gets it turned off (said in the
log): recomputing an attention layer would write its keys and values into the cache a
second time. Hugging Face's own gradient checkpointing turns the cache off in training too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from treadle.logging.writers import get_logger
from treadle.suggest import closest

#: The two modes (torchtitan's names); see the module docstring.
MODES = ("full", "selective")
#: The keys of the mapping form (``check_fn``: a predicate, MMEngine's FSDPStrategy's name).
KEYS = ("modules", "mode", "check_fn")
#: What ``activation_checkpointing`` may be, as error messages say it.
EXPECTED = ("'full', 'selective', module classes, class names or submodule paths (e.g. ['Block']), "
            "{modules: [...], mode: full|selective}, {check_fn: fn(module) -> bool}, or None/False for none")

#: ``(namespace, op)`` whose outputs ``selective`` keeps; ops a torch release lacks are skipped.
SAVED_OPS = (("aten", "mm"), ("aten", "addmm"), ("aten", "bmm"), ("aten", "baddbmm"), ("aten", "_scaled_mm"),
             ("aten", "_scaled_dot_product_flash_attention"), ("aten", "_scaled_dot_product_efficient_attention"),
             ("aten", "_scaled_dot_product_cudnn_attention"), ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
             ("_c10d_functional", "reduce_scatter_tensor"))

Targets = tuple[type | str, ...] | Callable[[nn.Module], bool] | None


@dataclass(frozen=True)
class CheckpointPlan:
    """A checked ``activation_checkpointing`` value: which modules (``targets``: classes or
    names, a predicate, or None for the model's blocks) and how (``mode``)."""

    targets: Targets
    mode: str


def plan_activation_checkpointing(value: Any, name: str = "activation_checkpointing") -> CheckpointPlan | None:
    """``value`` checked without a model: a :class:`CheckpointPlan`, or None for none.
    Raises a one-line TypeError or ValueError naming ``name``."""
    if value is None or value is False:
        return None
    if isinstance(value, Mapping):
        unknown = sorted(set(map(str, value)) - set(KEYS))
        if unknown:
            raise ValueError(f"{name} has unknown keys {unknown}; expected some of {', '.join(KEYS)}")
        mode = value.get("mode", "full")
        if mode not in MODES:
            raise ValueError(f"{name}.mode={mode!r}; expected one of {', '.join(map(repr, MODES))}")
        if "check_fn" in value:
            if "modules" in value:
                raise ValueError(f"{name} gives both modules and check_fn; expected one of them")
            fn = value["check_fn"]
            if not callable(fn) or isinstance(fn, type):
                raise TypeError(f"{name}.check_fn={fn!r}; expected a function fn(module) -> bool (a config gives its "
                                "dotted path, or {type: path, **kwargs}, which the config layer imports)")
            return CheckpointPlan(fn, mode)
        modules = value.get("modules", "auto")
        targets = None if modules == "auto" else _targets(modules, f"{name}.modules")
        return CheckpointPlan(targets, mode)
    if isinstance(value, str) and value in MODES:
        return CheckpointPlan(None, value)
    if value is True:
        raise ValueError(f"{name}=True; expected {EXPECTED} ('full' checkpoints every block)")
    return CheckpointPlan(_targets(value, name), "full")


def _targets(value: Any, name: str) -> Targets:
    if callable(value) and not isinstance(value, type):
        return value
    items = [value] if isinstance(value, (str, type)) else value
    if not isinstance(items, (list, tuple, set, frozenset)) or not items:
        raise TypeError(f"{name}={value!r}; expected {EXPECTED}")
    for it in items:
        if isinstance(it, type) and issubclass(it, nn.Module):
            continue
        if not isinstance(it, str) or not it or it in MODES:
            what = ("a mode, which stands alone or as mode:" if it in MODES else f"a {type(it).__name__}")
            raise TypeError(f"{name} lists {it!r} ({what}); expected nn.Module classes, class names or submodule paths")
    return tuple(items)


def apply_activation_checkpointing(model: nn.Module, value: Any) -> list[str]:
    """Checkpoint the submodules of ``model`` that ``value`` chooses, in place (the module
    docstring says how and which); returns their names (``""`` for the model itself), in
    module order. ``value`` None or False: nothing. Modules checkpointed already are kept
    as they are. Raises a one-line ValueError when ``value`` matches no module."""
    plan = plan_activation_checkpointing(value)
    if plan is None:
        return []
    chosen = _choose(model, plan)
    names: list[str] = []
    inside: list[str] = []  # chosen modules' names: their descendants are left alone
    for path, module in model.named_modules():
        if path not in chosen or any(path.startswith(f"{outer}.") or outer == "" for outer in inside):
            continue
        inside.append(path)
        names.append(path)
        if not is_checkpointed(module):
            inner = module.__dict__.get("forward")  # a forward set on the instance before: it is the one recomputed
            module.forward = functools.partial(_checkpointed_forward, module, inner, plan.mode)  # type: ignore[method-assign]  # the instance's forward, as the docstring says
    _cache_off(model, names)
    kinds = sorted({type(model.get_submodule(n)).__name__ for n in names})
    get_logger().info(f"activation checkpointing ({plan.mode}): {len(names)} module(s) of {', '.join(kinds)}")
    return names


def is_checkpointed(module: nn.Module) -> bool:
    """Whether :func:`apply_activation_checkpointing` checkpointed ``module``."""
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _checkpointed_forward


def find_blocks(model: nn.Module) -> type[nn.Module] | None:
    """The class of the model's main stack of blocks (the rule of the module docstring),
    or None when it has no container of same-class children."""
    best: tuple[int, type[nn.Module]] | None = None
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
            continue
        classes = {type(child) for child in container.children()}
        if len(classes) != 1:
            continue
        size = sum(p.numel() for p in container.parameters())
        if size and (best is None or size > best[0]):
            best = (size, classes.pop())
    return best[1] if best is not None else None


def _choose(model: nn.Module, plan: CheckpointPlan) -> set[str]:
    """The names of the modules ``plan`` chooses; a one-line ValueError when none."""
    named = dict(model.named_modules())
    classes = sorted({type(m).__name__ for m in named.values()})
    targets = plan.targets
    if targets is None:
        block = find_blocks(model)
        if block is None:
            raise ValueError(f"activation_checkpointing={plan.mode!r}: {type(model).__name__} has no nn.ModuleList, "
                             "nn.Sequential or nn.ModuleDict of same-class blocks to checkpoint; name the modules, "
                             f"e.g. activation_checkpointing=[{classes[-1]!r}]; its module classes are {classes}")
        return {n for n, m in named.items() if type(m) is block}
    if callable(targets):
        chosen = {n for n, m in named.items() if targets(m)}
        if not chosen:
            raise ValueError(f"activation_checkpointing: the predicate {getattr(targets, '__name__', targets)!r} "
                             f"chose no module of {type(model).__name__}; its module classes are {classes}")
        return chosen
    listed: set[str] = set()
    unmatched = []
    for it in targets:
        found = {n for n, m in named.items() if _is_class(type(m), it)}
        if not found and isinstance(it, str) and it in named:
            found = {it}  # a submodule path
        if not found:
            unmatched.append(it.__name__ if isinstance(it, type) else it)
        listed |= found
    if unmatched:
        modes = [m for it in unmatched if isinstance(it, str) for m in closest(it, MODES, n=1)]
        hint = f"; did you mean the mode {modes[0]!r}?" if modes else ""
        raise ValueError(f"activation_checkpointing: {unmatched} match no module class or submodule path of "
                         f"{type(model).__name__}; its module classes are {classes}{hint}")
    return listed


def _is_class(cls: type, it: type | str) -> bool:
    if isinstance(it, type):
        return issubclass(cls, it)
    return it in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")


def _checkpointed_forward(module: nn.Module, inner: Callable[..., Any] | None, mode: str,
                          *args: Any, **kwargs: Any) -> Any:
    """A checkpointed module's forward: its own (``inner``, or its class's), through
    non-reentrant checkpointing when autograd records."""
    forward = inner if inner is not None else functools.partial(type(module).forward, module)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    from torch.utils.checkpoint import checkpoint, noop_context_fn

    context = _selective_contexts if mode == "selective" else noop_context_fn
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, context_fn=context, **kwargs)


@functools.cache
def saved_ops() -> frozenset[Any]:
    """The op overloads of :data:`SAVED_OPS` this torch release has."""
    found = []
    for namespace, op in SAVED_OPS:
        try:
            found.append(getattr(getattr(torch.ops, namespace), op).default)
        except (AttributeError, RuntimeError):  # an op (or namespace) this release does not have
            continue
    return frozenset(found)


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy)


def _cache_off(model: nn.Module, names: list[str]) -> None:
    """Turn off ``config.use_cache`` of each Hugging Face model (duck-typed: it has
    ``gradient_checkpointing_enable``) holding a checkpointed module."""
    for path, module in model.named_modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", None) is not True or not hasattr(module, "gradient_checkpointing_enable"):
            continue
        if any(path == "" or n == path or n.startswith(f"{path}.") for n in names):
            config.use_cache = False
            where = f"{path}.config" if path else "config"
            get_logger().info(f"activation checkpointing: {where}.use_cache set to False (recomputed attention "
                              "would write its keys and values into the cache twice)")


__all__ = ["CheckpointPlan", "EXPECTED", "KEYS", "MODES", "SAVED_OPS", "apply_activation_checkpointing",
           "find_blocks", "is_checkpointed", "plan_activation_checkpointing", "saved_ops"]
