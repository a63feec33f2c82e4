"""Tensor parallelism: a plan of module-name patterns and styles, applied with torch's
``parallelize_module`` over the mesh's ``tp`` dimension.

    plan = {"layers.*.attn.q_proj": "colwise", "layers.*.attn.o_proj": "rowwise",
            "layers.*.mlp.up": "colwise", "layers.*.mlp.down": "rowwise"}
    resolved = resolve_plan(model, plan, tp=2)      # {fqn: ParallelStyle}; checked, nothing changed
    apply_plan(model, tp_mesh, resolved)

A pattern is a module name whose ``*`` stands for one name segment (``layers.*.attn``
matches ``layers.0.attn``, not ``layers.0.x.attn``). A style is a name of
:data:`STYLES` or a torch ``ParallelStyle`` (for layouts the names do not cover, such as
sequence parallelism's neighbours). ``"auto"`` is the model's own plan (a Hugging Face
model's ``tp_plan``, or its config's ``base_model_tp_plan``); a callable
``plan(model, tp_mesh)`` parallelizes the model itself, or returns a plan to apply.

The names are Hugging Face's, so a model's own plan reads as it is written:

==========================  ========================================================
``colwise``                 Linear/Embedding split on the output features; the output
                            stays split (a local tensor), for a ``rowwise`` layer next
``rowwise``                 split on the input features; the output summed (replicated)
``colwise_rep``             ``colwise`` with the output gathered (alias
                            ``colwise_gather_output``): a model's last layer
``rowwise_rep``             ``rowwise`` taking a replicated input (alias ``rowwise_split_input``)
``embedding_rowwise``       an Embedding split on the vocabulary, the output replicated
``sequence_parallel``       a norm or dropout run on a sequence-split input (``SequenceParallel``)
``replicated_with_grad_allreduce``
                            a module (a per-head norm: Qwen3's ``q_norm``) with the same
                            weights on every rank, run on this rank's share of the heads:
                            its weights' gradients are summed over the group
``loss_parallel``           the output layer split on the classes and kept so: the loss
                            is computed on the shards (torch's ``loss_parallel``)
``replicate``, ``local``    left as it is: the same weights on every tp rank
==========================  ========================================================
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch
from torch import nn

from treadle.suggest import closest

Plan = dict[str, Any] | str | Callable[..., Any] | None

#: Styles by name: (maker, what the style splits: "out", "in", "vocab" or None).
STYLES: dict[str, tuple[Callable[[], Any] | None, str | None]] = {}


def _styles() -> dict[str, tuple[Callable[[], Any] | None, str | None]]:
    """The table, built at first use (torch.distributed.tensor is slow to import)."""
    if STYLES:
        return STYLES
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    STYLES.update({
        "colwise": (ColwiseParallel, "out"),
        "rowwise": (RowwiseParallel, "in"),
        "colwise_rep": (lambda: ColwiseParallel(output_layouts=Replicate()), "out"),
        "colwise_gather_output": (lambda: ColwiseParallel(output_layouts=Replicate()), "out"),
        "rowwise_rep": (lambda: RowwiseParallel(input_layouts=Replicate()), "in"),
        "rowwise_split_input": (lambda: RowwiseParallel(input_layouts=Replicate()), "in"),
        "embedding_rowwise": (lambda: RowwiseParallel(input_layouts=Replicate()), "vocab"),
        "sequence_parallel": (SequenceParallel, None),
        "replicated_with_grad_allreduce": (_replicated_on_split_input, None),
        "loss_parallel": (lambda: ColwiseParallel(output_layouts=Shard(-1), use_local_output=False), "out"),
        "replicate": (None, None),
        "local": (None, None),
    })
    return STYLES


def _replicated_on_split_input() -> Any:
    """A style for a module whose weights are the same on every rank but whose input is
    this rank's share (the heads a colwise projection left it): its weights become
    replicated DTensors and its input a DTensor split on the dimension before the last
    (the heads; the module computes along the last), so the weight's gradient comes out
    partial and DTensor sums it over the group. The output goes on as a local tensor."""
    from torch.distributed.tensor import DTensor, Shard, distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    def split_inputs(module: nn.Module, inputs: tuple[Any, ...], mesh: Any) -> tuple[Any, ...]:
        return tuple(DTensor.from_local(t, mesh, [Shard(max(t.dim() - 2, 0))], run_check=False)
                     if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) else t for t in inputs)

    def local_output(module: nn.Module, output: Any, mesh: Any) -> Any:
        return output.to_local() if isinstance(output, DTensor) else output

    class ReplicatedOnSplitInput(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            # No partition function: distribute_module replicates the module's parameters.
            return distribute_module(module, device_mesh, input_fn=split_inputs, output_fn=local_output)

    return ReplicatedOnSplitInput()


def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(r"[^.]+".join(re.escape(part) for part in pattern.split("*")))


def _generic(name: str) -> str:
    """``layers.3.attn`` -> ``layers.*.attn``: how plans name repeated modules."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", name)


def model_plan(model: nn.Module) -> dict[str, Any]:
    """``tp_plan="auto"``: the model's own plan. A Hugging Face model's ``tp_plan``
    (the base model's plan under its prefix, and the head's), else its config's
    ``base_model_tp_plan`` under the model's ``base_model_prefix``."""
    plan = getattr(model, "tp_plan", None)
    if isinstance(plan, dict) and plan:
        return dict(plan)
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None)
    if isinstance(base, dict) and base:
        prefix = getattr(model, "base_model_prefix", "")
        inner = prefix and isinstance(getattr(model, prefix, None), nn.Module)
        return {f"{prefix}.{k}" if inner else k: v for k, v in base.items()}
    raise ValueError(f"tp_plan='auto': {type(model).__name__} has no tensor-parallel plan of its own (a Hugging Face "
                     "model's tp_plan or config.base_model_tp_plan); expected tp_plan= a dict of module-name "
                     "patterns to styles, such as {'layers.*.attn.q_proj': 'colwise', 'layers.*.attn.o_proj': "
                     "'rowwise'}, or a callable plan(model, tp_mesh)")


def check_plan_type(plan: Any, source: str = "tp_plan") -> None:
    """Refuse, before any process starts, a ``tp_plan`` of the wrong kind (``source``:
    how the message names the plan)."""
    if plan is None or plan == "auto" or (callable(plan) and not isinstance(plan, (str, dict))):
        return
    if not isinstance(plan, dict):
        raise TypeError(f"tp_plan={plan!r}; expected a dict of module-name patterns to styles, 'auto' (the model's "
                        "own plan) or a callable plan(model, tp_mesh)")
    from torch.distributed.tensor.parallel import ParallelStyle

    for pattern, style in plan.items():
        if not isinstance(pattern, str) or not pattern:
            raise TypeError(f"tp_plan key {pattern!r}: expected a module-name pattern such as 'layers.*.attn.q_proj'")
        if not isinstance(style, (str, ParallelStyle)):
            raise TypeError(f"tp_plan[{pattern!r}]={style!r}; expected a style name ({', '.join(_styles())}) or a "
                            "torch ParallelStyle")
        if isinstance(style, str) and style not in _styles():
            if source != "tp_plan":  # the model's own plan
                what = ("packed projections (packed_*: several projections in one weight) are not split yet"
                        if style.startswith("packed_") else "mixture-of-experts experts (moe_tp_experts) are not "
                        "split yet" if style.startswith("moe_") else "a style of the model's that treadle does not know")
                raise ValueError(f"{source}: the model's plan gives {pattern!r} the style {style!r}, which treadle "
                                 f"does not apply ({what}; fused projections a plain style splits, such as "
                                 "colwise_gather_output, are); expected tp_plan= a dict of the styles treadle knows "
                                 f"({', '.join(_styles())}), or a callable")
            near = closest(style, _styles(), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"tp_plan[{pattern!r}]={style!r} is not a style treadle knows{hint}; expected one of "
                             f"{', '.join(map(repr, _styles()))} or a torch ParallelStyle")


def resolve_plan(model: nn.Module, plan: dict[str, Any], tp: int, *, source: str = "tp_plan",
                 checked: bool = False) -> dict[str, Any]:
    """``{module name: ParallelStyle}`` for ``plan`` on ``model``, checked before anything
    changes: every pattern matches a module, no module matches two styles, ``tp`` divides
    each dimension a style splits, no split module shares a weight with another module,
    and a Hugging Face model's attention heads split evenly. One-line ValueErrors.
    ``checked``: the plan's entries already passed :func:`check_plan_type` (the strategy's
    constructor checks a given plan once)."""
    if not checked:
        check_plan_type(plan, source)
    names = {name: m for name, m in model.named_modules() if name}
    chosen: dict[str, tuple[str, Any]] = {}
    for pattern, style in plan.items():
        rx = _pattern(pattern)
        hits = [n for n in names if rx.fullmatch(n)]
        if not hits:
            generic = sorted({_generic(n) for n in names})
            near = closest(pattern, generic, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(map(repr, near))}?" if near else f"; its modules include {generic[:8]}"
            raise ValueError(f"{source}: {pattern!r} matches no module of {type(model).__name__}{hint}")
        for n in hits:
            if n in chosen and chosen[n][1] != style:
                raise ValueError(f"{source}: module {n!r} matches {chosen[n][0]!r} and {pattern!r}, with different "
                                 "styles; expected one style per module")
            chosen[n] = (pattern, style)
    resolved: dict[str, Any] = {}
    for n, (_, style) in chosen.items():
        if isinstance(style, str):
            make, splits = _styles()[style]
            if make is None:  # replicated: left as it is
                continue
            _check_divides(n, names[n], style, splits, tp, source)
            resolved[n] = make()
        else:
            resolved[n] = style
    _check_ties(model, set(resolved), source)
    _check_heads(model, tp, source)
    return resolved


def _check_divides(name: str, module: nn.Module, style: str, splits: str | None, tp: int, source: str) -> None:
    if splits is None:
        return
    if isinstance(module, nn.Linear):
        dim = {"out": ("out_features", module.out_features), "in": ("in_features", module.in_features),
               "vocab": ("out_features", module.out_features)}[splits]
    elif isinstance(module, nn.Embedding):
        dim = {"out": ("embedding_dim", module.embedding_dim), "in": ("num_embeddings", module.num_embeddings),
               "vocab": ("num_embeddings", module.num_embeddings)}[splits]
    else:
        raise ValueError(f"{source}[{name!r}]={style!r}: the module is a {type(module).__name__}; the style splits an "
                         "nn.Linear or nn.Embedding (pass a torch ParallelStyle for other modules)")
    if dim[1] % tp:
        raise ValueError(f"{source}: tp={tp} does not divide {name}.{dim[0]}={dim[1]}, which {style!r} splits; "
                         "expected a tp that divides it")


def _check_ties(model: nn.Module, split: set[str], source: str) -> None:
    """Refuse a split module whose weight another module shares (tied embeddings): the
    split replaces the parameter, and the tie would break silently."""
    owners: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        for pname, p in m.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append(f"{name}.{pname}" if name else pname)
    for names in owners.values():
        mods = {n.rpartition(".")[0] for n in names}
        if len(mods) > 1 and mods & split:
            raise ValueError(f"{source}: {' and '.join(sorted(names))} are one tied parameter, and the plan splits "
                             f"{sorted(mods & split)[0]!r}; untie them (e.g. a Hugging Face config's "
                             "tie_word_embeddings=False) or leave the tied modules out of the plan")


def _check_heads(model: nn.Module, tp: int, source: str) -> None:
    config = getattr(model, "config", None)
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, key, None)
        if isinstance(heads, int) and heads % tp:
            raise ValueError(f"{source}: tp={tp} does not divide the model's {key}={heads}; each tp rank computes "
                             "whole heads, so expected a tp that divides it")


def apply_plan(model: nn.Module, tp_mesh: Any, plan: Plan, tp: int, *, checked: bool = False) -> bool:
    """Parallelize ``model`` over ``tp_mesh`` by ``plan`` (a dict, "auto", or a callable);
    returns whether the loss is computed on class shards (a ``loss_parallel`` style).
    ``checked``: a dict ``plan`` already passed :func:`check_plan_type`."""
    from torch.distributed.tensor.parallel import parallelize_module

    if plan == "auto":
        plan = model_plan(model)
        source = "tp_plan='auto'"
    elif callable(plan) and not isinstance(plan, dict):
        returned = plan(model, tp_mesh)
        if returned is None:
            return False
        plan, source = returned, "the plan tp_plan() returned"
    else:
        source = "tp_plan"
        warn_if_contradicting(model, plan)  # type: ignore[arg-type]  # a dict here (check_plan_type)
    assert isinstance(plan, dict)  # check_plan_type: a dict, "auto" or a callable
    resolved = resolve_plan(model, plan, tp, source=source, checked=checked and source == "tp_plan")
    parallelize_module(model, tp_mesh, resolved)
    return any(isinstance(v, str) and v == "loss_parallel" for v in plan.values())


#: Style names that mean the same layout (:data:`STYLES`' aliases).
_SAME = {"colwise_rep": "colwise_gather_output", "rowwise_rep": "rowwise_split_input", "local": "replicate"}


def _styles_by_module(model: nn.Module, plan: dict[str, Any]) -> dict[str, str]:
    """The style name each module of ``model`` gets from ``plan`` (styles given as objects left out)."""
    names = [name for name, _ in model.named_modules() if name]
    out: dict[str, str] = {}
    for pattern, style in plan.items():
        if isinstance(pattern, str) and isinstance(style, str):
            rx = _pattern(pattern)
            out.update({name: _SAME.get(style, style) for name in names if rx.fullmatch(name)})
    return out


def contradictions(model: nn.Module, plan: dict[str, Any], own: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(module pattern, the user's style, the model's style)`` where ``plan`` and the
    model's ``own`` plan differ, one per module name with its layer numbers as ``*``."""
    mine, theirs = _styles_by_module(model, plan), _styles_by_module(model, own)
    found: dict[str, tuple[str, str, str]] = {}
    for name, style in mine.items():
        if name in theirs and theirs[name] != style:
            found.setdefault(_generic(name), (_generic(name), style, theirs[name]))
    return list(found.values())


def warn_if_contradicting(model: nn.Module, plan: dict[str, Any]) -> str | None:
    """A user's plan that gives a module another style than the model's own plan (a Hugging
    Face model's ``tp_plan``) does: both may run, and train wrong without a word (Phi-3's
    fused ``mlp.gate_up_proj`` under plain ``colwise`` keeps its output split, while the
    model chunks it as if whole; its own plan says ``colwise_gather_output``). Warned once,
    on rank 0, naming the modules and both styles; the user's plan is applied as given.
    Returns the warning's text, or None."""
    try:
        own = model_plan(model)
    except ValueError:  # the model has no plan of its own: nothing to contradict
        return None
    found = contradictions(model, plan, own)
    if not found:
        return None
    shown = "; ".join(f"{name}: {mine!r} where the model's plan says {theirs!r}" for name, mine, theirs in found[:4])
    more = f" (and {len(found) - 4} more)" if len(found) > 4 else ""
    text = (f"tp_plan contradicts {type(model).__name__}'s own tensor-parallel plan: {shown}{more}; applied as given, "
            "but a fused projection split without its output gathered trains wrong without an error (tp_plan='auto' "
            "takes the model's plan)")
    from treadle.distributed import comm
    from treadle.logging.writers import get_logger

    if comm.get_rank() == 0:
        get_logger().warning(text)
    return text


__all__ = ["STYLES", "apply_plan", "check_plan_type", "contradictions", "model_plan", "resolve_plan",
           "warn_if_contradicting"]
