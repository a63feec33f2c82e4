"""Giving a model built on the meta device its values, each process only its share.

    materialize(model, device, empty=empty, weights=["llama-dir"])

``model`` is the user's module after the strategy has split it (tensor parallelism and
``fully_shard`` work on meta tensors: each parameter is then a DTensor whose local shard
is still empty). :func:`materialize` allocates the local shards on ``device``
(``to_empty``), then fills every parameter, buffer and tensor attribute:

1. from the weights files, in order (``pretrained:`` of a Hugging Face model spec, then
   ``load_from=``): each process reads the box of each tensor that it holds
   (treadle/checkpoint/tensor_sources.py; a sharded treadle checkpoint through DCP,
   which reshards), after every shape was checked against the model;
2. the rest from the record of the model's constructor (treadle/components/empty_init.py):
   a tensor the files lack (a new head, a LoRA adapter) gets the value the model's own
   initialization gives it; with no files at all, every tensor is bit for bit the one of
   the model built whole from the same random state.

Tied weights stay tied; a tensor no source can give is an error naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from treadle.checkpoint.manifest import CheckpointError
from treadle.components.empty_init import EmptyModel
from treadle.distributed.voice import job_warning

_WRAPPED = "._checkpoint_wrapped_module"  # activation checkpointing's wrapper, not in state dict keys
_LISTED = 8


def has_meta(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device (a DTensor's local shard counts)."""
    return any(_local(t).is_meta for t in (*module.parameters(), *module.buffers()))


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _targets(module: nn.Module, attributes: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Every parameter, buffer and allocated tensor attribute by name (a tied one under each name)."""
    out: dict[str, list[torch.Tensor]] = {}
    for name, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        out.setdefault(name.replace(_WRAPPED, ""), []).append(t)
    for name, t in attributes.items():
        out.setdefault(name.replace(_WRAPPED, ""), []).append(t)
    return out


def _ties(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Groups of (module, parameter name) slots holding one parameter object."""
    groups: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in module.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                groups.setdefault(id(p), []).append((mod, name))
    return [g for g in groups.values() if len(g) > 1]


def _allocate(module: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """Every meta tensor made an empty one on ``device``, ties kept (``to_empty`` replaces
    each module's parameters one by one, which unties them; FSDP keeps its own); returns
    the tensor attributes so allocated, by name."""
    ties = _ties(module)
    module.to_empty(device=device)
    for group in ties:
        first_mod, first_name = group[0]
        for mod, name in group[1:]:
            if mod._parameters[name] is not first_mod._parameters[first_name]:
                mod._parameters[name] = first_mod._parameters[first_name]
    attributes = {}
    made: dict[int, torch.Tensor] = {}  # one allocation per meta tensor, however many attributes hold it
    for mod_name, mod in module.named_modules(remove_duplicate=False):  # to_empty leaves tensor attributes
        for attr, value in list(mod.__dict__.items()):
            if isinstance(value, torch.Tensor) and value.is_meta and not attr.startswith("_"):
                if id(value) not in made:
                    made[id(value)] = torch.empty_like(value, device=device)
                setattr(mod, attr, made[id(value)])
                attributes[f"{mod_name}.{attr}" if mod_name else attr] = made[id(value)]
    return attributes


def put(target: torch.Tensor, value: torch.Tensor) -> None:
    """Copy this process's share of ``value`` (the whole tensor, on the CPU) into
    ``target``: the box of a DTensor's local shard, or all of a plain tensor."""
    with torch.no_grad():
        chunks = getattr(target, "__create_chunk_list__", None)
        if chunks is None:
            target.copy_(value)
            return
        (chunk,) = chunks()
        box = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))
        target.to_local().copy_(value[box])


class Weights:
    """A source of weights: its keys, their shapes, and a way to fill targets from it.
    ``strict``: every key must be one of the model's (``load_from=``); else a key the
    model lacks is warned about (a pretrained folder, as ``from_pretrained`` does)."""

    def __init__(self, where: str, keys: Iterable[str], shape: Callable[[str], tuple[int, ...]],
                 read: Callable[[str, Any, Any, torch.Tensor], None] | None = None, strict: bool = False) -> None:
        self.where, self.keys, self.shape, self.read, self.strict = where, set(keys), shape, read, strict

    def load(self, plan: dict[str, str], targets: dict[str, list[torch.Tensor]]) -> None:
        """Each ``targets[name]`` filled with this process's box of the tensor ``plan[name]``."""
        assert self.read is not None
        with torch.no_grad():
            for name, key in plan.items():
                for target in targets[name]:
                    chunks = getattr(target, "__create_chunk_list__", None)
                    if chunks is None:
                        self.read(key, (0,) * target.dim(), tuple(target.shape), target)
                    else:
                        (chunk,) = chunks()
                        self.read(key, tuple(chunk.offsets), tuple(chunk.sizes), target.to_local())


class _ShardedCheckpoint(Weights):
    """A sharded treadle checkpoint's ``model`` entry, read through DCP into the targets
    (DCP reads each process's shards and reshards from any mesh)."""

    def __init__(self, path: Path, strict: bool) -> None:
        from treadle.checkpoint.dcp_safe import read_metadata_safely
        from treadle.checkpoint.sharded import DCP_METADATA

        metadata = read_metadata_safely(path / DCP_METADATA).state_dict_metadata
        shapes = {k[len("model."):]: tuple(getattr(v, "size", ())) for k, v in metadata.items() if k.startswith("model.")}
        super().__init__(str(path), shapes, shapes.__getitem__, strict=strict)
        self.path = path

    def load(self, plan: dict[str, str], targets: dict[str, list[torch.Tensor]]) -> None:
        from treadle.checkpoint.sharded import load_sharded

        load_sharded(self.path, {"model": {key: targets[name][0] for name, key in plan.items()}}, payloads=[])
        for name in plan:  # ties: one tensor filled, the others share it or get a copy
            for t in targets[name][1:]:
                if t is not targets[name][0]:
                    with torch.no_grad():
                        _local(t).copy_(_local(targets[name][0]))


def open_weights(source: Any, strict: bool = True) -> Weights:
    """A weights source from ``load_from``/``pretrained``: a Hugging Face folder or a
    ``.safetensors`` file (read box by box), a sharded treadle checkpoint (through DCP),
    a mapping of tensors, or any other file ``load_from=`` takes (read whole: ``.pt``/``.pth``,
    a treadle checkpoint of one process)."""
    from treadle.checkpoint.tensor_sources import FolderWeights, is_hf_folder
    from treadle.checkpoint.sharded import is_sharded_checkpoint

    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.suffix == ".safetensors" or (path.is_dir() and is_hf_folder(path)):
            files = FolderWeights(path, "load_from" if strict else "pretrained")
            return Weights(str(path), files.specs, lambda k: files.specs[k].shape, files.read_box, strict)
        if path.is_dir() and is_sharded_checkpoint(path):
            return _ShardedCheckpoint(path, strict)
        from treadle.checkpoint.weights import read_weights

        source_sd: Mapping[str, Any] = read_weights(path)
        where = str(path)
    elif isinstance(source, Mapping):
        source_sd, where = source, "<state dict>"
    else:
        raise TypeError(f"weights {source!r}: expected a path or a state dict")
    tensors = {k: v for k, v in source_sd.items() if isinstance(v, torch.Tensor)}

    def read(key: str, offsets: Any, sizes: Any, out: torch.Tensor) -> None:
        out.copy_(tensors[key][tuple(slice(o, o + s) for o, s in zip(offsets, sizes))])
    return Weights(where, tensors, lambda k: tuple(tensors[k].shape), read, strict)


def _candidates(name: str, prefix: str) -> list[str]:
    """The keys a weights file may give ``name`` under: itself; a PEFT model's base names
    (``base_model.model.X``, ``.base_layer``); with or without the base model's prefix."""
    names = [name]
    if name.startswith("base_model.model."):
        base = name[len("base_model.model."):].replace(".base_layer.", ".").replace(".original_module.", ".")
        names.append(base)
    if prefix:
        names += [n[len(prefix) + 1:] if n.startswith(prefix + ".") else f"{prefix}.{n}" for n in list(names)]
    return names


def _full_shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)  # a DTensor's shape is the global one


def materialize(module: nn.Module, device: torch.device, *, empty: EmptyModel | None = None,
                weights: Iterable[Any] = (), load_from: Any = None, what: str = "the model",
                each_module: Callable[[nn.Module], None] | None = None) -> None:
    """Allocate ``module``'s meta tensors on ``device`` and fill them (see the module
    docstring); every process calls it. ``weights``: pretrained files (a key the model
    lacks is warned about); ``load_from``: weights every key of which must be the model's.
    ``each_module``: called with each submodule once its own tensors are filled, children
    before their parent, each module's tensors allocated only in its turn (DeepSpeed's
    ZeRO-3 partitions them there: no process holds more than one module whole).
    Raises CheckpointError naming a tensor whose shape differs between a weights file and
    the model, a ``load_from`` key the model lacks, or a tensor that nothing can fill,
    before anything is allocated when ``each_module`` is given."""
    sources = [open_weights(w, strict=False) for w in weights]
    if load_from is not None:
        sources.append(open_weights(load_from, strict=True))
    if each_module is None:
        targets = _targets(module, _allocate(module, device))
    else:  # planned on the meta tensors; allocated module by module below
        targets = _targets(module, _meta_attributes(module))
    plans, rest = _plan(module, sources, targets, empty=empty, load_from=load_from, what=what,
                        strict=load_from is not None and len(sources) == 1)
    if each_module is None:
        _fill(plans, targets, rest, empty)
    else:
        made: dict[int, torch.Tensor] = {}
        left = set(rest)
        names: dict[int, list[str]] = {}  # a meta tensor's names (a tied one has several)
        for name, ts in targets.items():
            for t in ts:
                names.setdefault(id(t), []).append(name)
        trim = _malloc_trim()
        for _, mod in _children_first(module):
            own = _allocate_own(mod, device, made, names)
            if own:
                _fill(plans, own, [n for n in own if n in left], empty)
            each_module(mod)
            if own:
                trim()
    persistent = _persistent(module)
    _say_new(module, sources, [n for n in rest if n in persistent])


def _plan(module: nn.Module, sources: list[Weights], targets: dict[str, list[torch.Tensor]], *,
          empty: EmptyModel | None, load_from: Any, what: str, strict: bool
          ) -> tuple[list[tuple[Weights, dict[str, str]]], list[str]]:
    """Which key of which source fills each target (every shape checked), and the names
    that no source fills, left to the record of the constructor; raises on a tensor
    nothing can fill."""
    prefix = str(getattr(module, "base_model_prefix", "") or "")
    plans: list[tuple[Weights, dict[str, str]]] = []
    filled: set[str] = set()
    for source in sources:
        plan: dict[str, str] = {}
        for name, ts in targets.items():
            key = next((k for k in _candidates(name, prefix) if k in source.keys), None)
            if key is None:
                continue
            want, have = _full_shape(ts[0]), tuple(source.shape(key))
            if want != have:
                raise CheckpointError(f"{source.where}: tensor {key!r} has shape {list(have)}, the model's "
                                      f"{name!r} {list(want)}; expected weights saved from this model")
            plan[name] = key
        left = sorted(source.keys - set(plan.values()))
        if left and source.strict:
            raise CheckpointError(f"{source.where}: {left[0]!r}" + (f" (and {len(left) - 1} more)" if len(left) > 1
                                  else "") + f" is not a tensor of {what}; expected weights saved from this model")
        if left:
            job_warning(f"{source.where}: {len(left)} tensor(s) the model does not have, not loaded: "
                        f"{', '.join(left[:_LISTED])}{' ...' if len(left) > _LISTED else ''}")  # alike on every rank
        plans.append((source, plan))
        filled |= set(plan)
    done = {id(t) for n in filled for t in targets[n]}  # a tied name: its tensor was filled under another
    storage = {n: empty.tensors[n].key for n in targets if empty is not None and n in empty.tensors}
    if storage:  # or the record says it shares storage with a filled one
        keys_filled = {storage[n] for n in filled if n in storage}
        filled |= {n for n, k in storage.items() if k in keys_filled}
    rest = [n for n, ts in targets.items() if n not in filled and not all(id(t) in done for t in ts)]
    missing = [n for n in rest if empty is None or (strict and n in _persistent(module))]
    if missing:
        why = f"load_from {load_from} does not hold it" if load_from is not None else "no weights were given"
        raise CheckpointError(f"{what}: {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                              else "") + f" is on the meta device and {why}; give load_from= weights that hold "
                              "every tensor, or the model as a spec (dict(type=..., ...)) so that treadle builds it")
    unknown = [n for n in rest if empty is not None and n not in empty.tensors]
    if unknown:
        raise CheckpointError(f"{what}: {unknown[0]!r} is on the meta device but was not made by the model's "
                              "constructor (added after it?); give its value through load_from=")
    return plans, rest


def _fill(plans: list[tuple[Weights, dict[str, str]]], targets: dict[str, list[torch.Tensor]], rest: Iterable[str],
          empty: EmptyModel | None) -> None:
    """``targets`` filled: from each source's plan, the ``rest`` from the record."""
    for source, plan in plans:
        mine = {n: k for n, k in plan.items() if n in targets}
        if mine:
            source.load(mine, targets)
    left = {n: targets[n] for n in rest}
    if left:
        assert empty is not None  # else _plan raised
        empty.fill(left, put)


def _malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)``: the C heap's free pages given back to the system (a no-op
    where there is none). Filling a model module by module frees a whole module after
    keeping its partition; the allocator keeps such holes resident otherwise (a 152 MiB
    Llama on 2 processes: 55 MiB above what the partitions hold)."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int

    def trimmed() -> None:
        trim(0)
    return trimmed


def _children_first(module: nn.Module, prefix: str = "", seen: set[int] | None = None
                    ) -> Iterable[tuple[str, nn.Module]]:
    """(name, module) of every submodule once, each after its children."""
    seen = set() if seen is None else seen
    for name, child in module.named_children():
        if id(child) not in seen:
            seen.add(id(child))
            yield from _children_first(child, f"{prefix}{name}.", seen)
    yield prefix[:-1], module


def _meta_attributes(module: nn.Module) -> dict[str, torch.Tensor]:
    """The meta tensors held as plain attributes (not parameters or buffers), by name."""
    return {f"{mod_name}.{attr}" if mod_name else attr: value
            for mod_name, mod in module.named_modules(remove_duplicate=False)
            for attr, value in list(mod.__dict__.items())
            if isinstance(value, torch.Tensor) and value.is_meta and not attr.startswith("_")}


def _allocate_own(mod: nn.Module, device: torch.device, made: dict[int, torch.Tensor],
                  names: dict[int, list[str]]) -> dict[str, list[torch.Tensor]]:
    """``mod``'s own meta parameters, buffers and tensor attributes (not its children's)
    made empty ones on ``device``, a tensor an earlier module holds too given that
    allocation (ties kept); returns the ones allocated here under each of their names."""
    own: dict[str, list[torch.Tensor]] = {}

    def allocate(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(t) not in made:
            fresh = torch.empty_like(t, device=device)
            made[id(t)] = nn.Parameter(fresh, requires_grad=t.requires_grad) if parameter else fresh
            for name in names.get(id(t), ()):
                own.setdefault(name, []).append(made[id(t)])
        return made[id(t)]

    for slots, parameter in ((mod._parameters, True), (mod._buffers, False)):
        for attr, t in list(slots.items()):
            if t is not None and t.is_meta:
                slots[attr] = allocate(t, parameter)
    for attr, value in list(mod.__dict__.items()):
        if isinstance(value, torch.Tensor) and value.is_meta and not attr.startswith("_"):
            setattr(mod, attr, allocate(value, False))
    return own


def _persistent(module: nn.Module) -> set[str]:
    """The names a state dict holds: parameters and persistent buffers."""
    names = set()
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        names |= {prefix + n for n, p in mod._parameters.items() if p is not None}
        names |= {prefix + n for n, b in mod._buffers.items() if b is not None and n not in mod._non_persistent_buffers_set}
    return {n.replace(_WRAPPED, "") for n in names}


def _say_new(module: nn.Module, sources: list[Weights], new: list[str]) -> None:
    """With weights files: one line naming the tensors they lacked, initialized by the
    model's constructor (a PEFT adapter's are new by design: not listed); once for the
    job, as every rank finds the same."""
    adapter = getattr(module, "active_adapter", None)
    new = [n for n in new if not (isinstance(adapter, str) and f".{adapter}." in n)]
    if sources and new:
        job_warning(f"{len(new)} tensor(s) not in {', '.join(s.where for s in sources)}, initialized as the "
                    f"model's constructor does: {', '.join(new[:_LISTED])}{' ...' if len(new) > _LISTED else ''}")


__all__ = ["Weights", "has_meta", "materialize", "open_weights", "put"]
