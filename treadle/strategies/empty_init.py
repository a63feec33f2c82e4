"""Build a model without its weights, then make each tensor when it is wanted.

    empty = record(lambda: MyModel(width=1024))   # every parameter and buffer on the meta device
    ...                                            # tensor parallelism, fully_shard: on meta
    empty.fill(targets)                            # each tensor computed, handed over, freed

:func:`record` runs the model's constructor with its tensors on the meta device and writes
down, operator by operator, what the constructor did to them: each allocation, each
initialization (``reset_parameters``, a Hugging Face model's ``_init_weights``), each draw
from the random generator, in order. :meth:`EmptyModel.fill` runs that record again on the
CPU, but one tensor at a time: a parameter's value is computed when it is needed, handed
to its target (the shard a process holds, or the whole tensor) and freed. What an
initialization overwrites whole is not computed at all; its random draws are still made,
on a scratch tensor of the same layout, so every later draw comes out as in a whole build.
The values are therefore bit for bit those of the model built whole on the CPU from the
same random state, while a process holds its shards and about one tensor besides.

The constructor sees an ordinary CPU environment (``torch.tensor([]).device`` is the CPU,
so Hugging Face models run their own initialization); the factory functions that
allocate parameter-sized tensors (``torch.empty``, ``zeros``, ``ones``, ``full``, the random
ones) are sent to the meta device, while ``torch.tensor``, ``arange`` and ``linspace`` keep
making real tensors (small constants, drop-path rates read with ``.tolist()``).

A constructor that reads the value of a tensor it just allocated (``.item()``) cannot run
so: :class:`EmptyInitError` names the module class and says what to do.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

#: Factory functions whose tensors are made on the meta device while recording.
_FACTORIES = {torch.empty, torch.empty_strided, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn,
              torch.randint, torch.randperm, torch.normal}
#: In-place operators that replace every element without reading the old values.
_OVERWRITES = {"uniform_", "normal_", "fill_", "zero_", "copy_", "random_", "exponential_", "geometric_",
               "cauchy_", "log_normal_", "bernoulli_"}


_CPU = torch.device("cpu")  # where the record is run again


class EmptyInitError(RuntimeError):
    """The model cannot be built with its tensors on the meta device (one line)."""


@dataclass(frozen=True)
class _Ref:
    """A tensor as a view of a recorded storage."""

    key: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass
class _Op:
    func: Any
    spec: Any  # the pytree spec of (args, kwargs)
    leaves: list[Any]  # _Ref, a real constant tensor, or a plain value
    reads: frozenset[int]
    writes: frozenset[int]
    creates: dict[int, int]  # storage key -> index of the output leaf that holds it
    random: bool


@dataclass
class _Storage:
    nbytes: int
    meta: Any  # the meta storage, kept alive so that its key stays unique


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _ref(t: torch.Tensor) -> _Ref:
    return _Ref(_key(t), t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _view(storage: Any, ref: _Ref, device: torch.device | None = None) -> torch.Tensor:
    t = torch.empty(0, dtype=ref.dtype, device=device if device is not None else storage.device)
    return t.set_(storage, ref.offset, ref.size, ref.stride)


def _covers(t: torch.Tensor) -> bool:
    """``t`` spans every byte of its storage (an overwrite of it leaves nothing of before)."""
    return t.is_contiguous() and t.storage_offset() == 0 and t.numel() * t.element_size() == t.untyped_storage().nbytes()


class _MetaFactories(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES and not any(isinstance(a, torch.Tensor) for a in args):
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


class _Recorder(TorchDispatchMode):
    """Writes down every operator that touches a meta tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self.storages: dict[int, _Storage] = {}

    def _note(self, t: torch.Tensor) -> _Ref:
        ref = _ref(t)
        if ref.key not in self.storages:
            self.storages[ref.key] = _Storage(t.untyped_storage().nbytes(), t.untyped_storage())
        return ref

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        out_leaves, _ = tree_flatten(out)
        metas = [t for t in leaves if isinstance(t, torch.Tensor) and t.is_meta]
        made = [t for t in out_leaves if isinstance(t, torch.Tensor) and t.is_meta]
        if not metas and not made:
            return out
        written = _written_args(func, args, kwargs)
        for t in written:
            if not t.is_meta:
                raise EmptyInitError(f"{func} writes values computed from meta tensors into a real tensor")
        inputs = {_key(t) for t in metas}
        creates = {}
        for i, t in enumerate(out_leaves):
            if isinstance(t, torch.Tensor) and t.is_meta and _key(t) not in inputs:
                creates[self._note(t).key] = i
        if not creates and not written:
            return out  # a view: no value changes
        overwritten = {_key(t) for t in written if func.__name__.split(".")[0] in _OVERWRITES and _covers(t)}
        refs = [self._note(t) if isinstance(t, torch.Tensor) and t.is_meta
                else t.detach().clone() if isinstance(t, torch.Tensor)
                else _CPU if isinstance(t, torch.device) and t.type == "meta" else t for t in leaves]
        self.ops.append(_Op(func, spec, refs, frozenset(inputs - overwritten), frozenset(_key(t) for t in written),
                            creates, torch.Tag.nondeterministic_seeded in func.tags))
        return out


def _written_args(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors ``func`` writes into (in-place and ``out=`` arguments), from its schema."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        flat, _ = tree_flatten(value)
        written += [t for t in flat if isinstance(t, torch.Tensor)]
    return written


@dataclass
class EmptyModel:
    """A model whose tensors are on the meta device, and the record of how its
    constructor made them (:func:`record`)."""

    module: nn.Module
    ops: list[_Op]
    storages: dict[int, _Storage]
    tensors: dict[str, _Ref]  # parameter, buffer and tensor-attribute names -> what they view
    constants: dict[int, torch.Tensor]  # storages that were real tensors: their values
    rng_state: torch.Tensor  # the CPU generator's state when the constructor ran
    #: Weights files the constructor named (a Hugging Face spec's ``pretrained:``), read at materialization.
    weights: list[Any] = field(default_factory=list)

    def fill(self, targets: dict[str, list[torch.Tensor]], put: Callable[[torch.Tensor, torch.Tensor], None], *,
             exact_rng: bool = True, advance_rng: bool = False) -> None:
        """Compute each named tensor of ``targets`` (name -> the tensors to fill: the
        materialized parameter, sharded or not) and hand it to ``put(target, value)``, one
        storage at a time. ``exact_rng``: every random draw of the constructor is made
        again, in order (the values equal a whole build's); else only those the wanted
        tensors need. The CPU generator is left as it was, or, with ``advance_rng``, where
        the constructor run whole would have left it."""
        wanted: dict[int, list[tuple[_Ref, list[torch.Tensor]]]] = {}
        for name, ts in targets.items():
            ref = self.tensors[name]
            wanted.setdefault(ref.key, []).append((ref, ts))
        before = torch.random.get_rng_state()
        torch.random.set_rng_state(self.rng_state)
        try:
            _replay(self, wanted, put, exact_rng)
        finally:
            if not advance_rng:
                torch.random.set_rng_state(before)


def _replay(empty: EmptyModel, wanted: dict[int, list[tuple[_Ref, list[torch.Tensor]]]],
            put: Callable[[torch.Tensor, torch.Tensor], None], exact_rng: bool) -> None:
    ops = empty.ops
    # Which operators the wanted storages depend on, walked from the end: an overwrite of a
    # whole storage ends what its earlier values mattered for (the storage must still exist).
    live = {k for k in wanted if k not in empty.constants}  # values needed
    exist: set[int] = set()  # storages needed, their values not
    needed = [False] * len(ops)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if not (op.writes & live or set(op.creates) & (live | exist)):
            continue
        needed[i] = True
        live -= set(op.creates)
        exist -= set(op.creates)
        overwritten = op.writes - op.reads
        live -= overwritten
        exist |= overwritten
        live |= op.reads
    last_use: dict[int, int] = {}
    for i, op in enumerate(ops):
        if needed[i]:
            for k in (*op.reads, *op.writes, *op.creates):
                last_use[k] = i
    real: dict[int, Any] = {}
    for k, value in empty.constants.items():
        if k in wanted:
            _hand_over(wanted.pop(k), value.untyped_storage(), put)
    for i, op in enumerate(ops):
        if needed[i]:
            leaves = [_view(real[x.key], x) if isinstance(x, _Ref) else x for x in op.leaves]
            out = _run(op, leaves)
            out_leaves, _ = tree_flatten(out)
            for k, idx in op.creates.items():
                real[k] = out_leaves[idx].untyped_storage()
        elif op.random and exact_rng:  # its draws, on scratch storage of the same layout
            scratch: dict[int, Any] = {}
            leaves = [_view(scratch.setdefault(x.key, torch.zeros(empty.storages[x.key].nbytes, dtype=torch.uint8)
                                              .untyped_storage()), x) if isinstance(x, _Ref) else x
                      for x in op.leaves]
            _run(op, leaves)
        else:
            continue
        for k in [k for k, last in last_use.items() if last == i]:
            if k in wanted and k in real:
                _hand_over(wanted.pop(k), real[k], put)
            real.pop(k, None)
            del last_use[k]
    if wanted:  # never touched after its allocation: its (uninitialized) bytes, as a whole build leaves them
        for k, entries in wanted.items():
            _hand_over(entries, torch.empty(empty.storages[k].nbytes, dtype=torch.uint8).untyped_storage(), put)


def _hand_over(entries: list[tuple[_Ref, list[torch.Tensor]]], storage: Any, put: Callable[..., None]) -> None:
    for ref, targets in entries:
        value = _view(storage, ref)
        for t in targets:
            put(t, value)


def _run(op: _Op, leaves: list[Any]) -> Any:
    args, kwargs = tree_unflatten(leaves, op.spec)
    return op.func(*args, **kwargs)


_WEIGHTS: list[list[Any]] = []  # the weights files named by the constructors being recorded


def recording() -> bool:
    """Whether a constructor runs under :func:`record` now (a model spec then leaves its
    pretrained weights to be read at materialization: :func:`add_weights`)."""
    return bool(_WEIGHTS)


def add_weights(source: Any) -> None:
    """Under :func:`record`: ``source`` (a Hugging Face folder, a ``.safetensors`` file)
    holds the model's weights, to be read shard by shard when it is materialized."""
    _WEIGHTS[-1].append(source)


def record(factory: Callable[[], Any], what: str = "the model") -> Any:
    """Run ``factory()`` with the tensors it makes on the meta device, recording how it
    made them (see the module docstring); an :class:`EmptyModel` when it returns an
    ``nn.Module``, else what it returned."""
    rng_state = torch.random.get_rng_state()
    recorder = _Recorder()
    _WEIGHTS.append([])
    try:
        with _MetaFactories(), recorder:
            module = factory()
    except EmptyInitError:
        raise
    except Exception as e:
        if _from_meta(e):
            raise EmptyInitError(_cannot(e, what)) from e
        raise
    finally:
        weights = _WEIGHTS.pop()
        torch.random.set_rng_state(rng_state)  # nothing was drawn for real: the draws come at fill()
    if not isinstance(module, nn.Module):
        return module  # the caller's error to raise (the factory built something else)
    tensors, constants = _tensors(module, recorder)
    return EmptyModel(module, recorder.ops, recorder.storages, tensors, constants, rng_state, weights)


def _from_meta(error: BaseException) -> bool:
    """Whether ``error`` comes from a meta tensor (its value read, or an operator that has
    no meta kernel): other errors (a bad config value) are the constructor's own."""
    text = str(error).lower()
    return "meta" in text or "data-dependent" in text or isinstance(error, NotImplementedError)


def _tensors(module: nn.Module, recorder: _Recorder) -> tuple[dict[str, _Ref], dict[int, torch.Tensor]]:
    """Every parameter, buffer and tensor attribute of ``module`` by name, each made a
    meta tensor (real ones keep their values as constants), ties kept."""
    refs: dict[str, _Ref] = {}
    constants: dict[int, torch.Tensor] = {}
    swapped: dict[int, torch.Tensor] = {}  # id of a real tensor -> its meta stand-in (ties stay ties)
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        slots = [(mod._parameters, n) for n in mod._parameters] + [(mod._buffers, n) for n in mod._buffers]
        slots += [(mod.__dict__, n) for n, v in list(mod.__dict__.items())  # e.g. a rotary table's copy
                  if isinstance(v, torch.Tensor) and v.is_meta]
        for table, name in slots:
            t = table[name]
            if t is None:
                continue
            if not t.is_meta:  # a real parameter or buffer: its value kept, a meta stand-in put in its place
                if id(t) not in swapped:
                    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                    if isinstance(t, nn.Parameter):
                        meta = nn.Parameter(meta, requires_grad=t.requires_grad)
                    constants[recorder._note(meta).key] = t.detach().clone()
                    swapped[id(t)] = meta
                table[name] = t = swapped[id(t)]
            refs[prefix + name] = recorder._note(t)
    return refs, constants


def _cannot(error: Exception, what: str) -> str:
    """One line: which module's code failed on the meta device, and what to do."""
    owner = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, nn.Module):
            owner = type(candidate)
    where = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else what
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (f"{where} cannot be built with its tensors on the meta device ({type(error).__name__}: {first}); "
            "build the model whole: pass the module itself rather than its spec, or empty_init=False to the strategy")


__all__ = ["EmptyInitError", "EmptyModel", "record"]
