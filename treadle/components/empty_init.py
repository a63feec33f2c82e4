"""Build a model without its weights, then make each tensor when it is wanted.

    empty = record(lambda: MyModel(width=1024))   # every parameter and buffer on the meta device
    ...                                            # tensor parallelism, fully_shard: on meta
    empty.fill(targets, put)                       # each tensor computed, handed over, freed

:func:`record` runs the model's constructor with the tensors it allocates left empty, and
writes down, operator by operator, what the constructor did to them: each allocation,
each initialization (``reset_parameters``, a Hugging Face model's ``_init_weights``), each
draw from the random generator, in order. :meth:`EmptyModel.fill` runs that record again
on the CPU, one tensor at a time: a tensor's value is computed when it is wanted, handed
to its target (the shard a process holds, or the whole tensor) and freed. What a later
initialization overwrites whole is never computed.

Random draws: while recording, each draw on an empty tensor is made for real on a scratch
tensor of the same layout (then freed) and the generator's state before it is kept, so the
generator moves as in a whole build, and a draw on a real tensor meanwhile (``randperm`` in
``nn.init.sparse_``) gives what it would have given. At :meth:`EmptyModel.fill` each draw
wanted starts from its kept state: the values are bit for bit those of the model built
whole on the CPU from the same random state, while a process holds its shards and about
one tensor besides. A model whose weights come from files (:func:`from_weights`, around a
Hugging Face spec's ``pretrained:`` skeleton) skips that: the few tensors the files lack
draw in order at fill time.

The constructor sees an ordinary CPU environment: the empty tensors say they are on the
CPU (``torch.nn.init`` skips a tensor that says it is on the meta device, and a Hugging
Face model skips its initialization under a meta device context); the allocating factories
(``torch.empty``, ``zeros``, ``ones``, ``full``, ``rand``, ``randn``, ``normal``) make empty
tensors, while ``torch.tensor``, ``arange``, ``linspace``, ``randint`` and ``randperm``
keep making real ones (constants, indices, drop-path rates read with ``.tolist()``).

A constructor that reads the value of a tensor it allocated (``.item()``) cannot run so:
:class:`EmptyInitError` names the module class and says what to do.
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

#: Factory operators whose tensors are left empty while recording.
_FACTORIES = {"empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "normal"}
#: In-place operators that replace every element without reading the old values.
_OVERWRITES = {"uniform_", "normal_", "fill_", "zero_", "copy_", "random_", "exponential_", "geometric_",
               "cauchy_", "log_normal_", "bernoulli_"}
_CPU = torch.device("cpu")  # where the record is run again


class EmptyInitError(RuntimeError):
    """The model cannot be built with its tensors left empty (one line)."""


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
    rng: torch.Tensor | None  # a random operator's generator state before it (None: draws in order)


@dataclass
class _Storage:
    nbytes: int
    meta: Any  # the meta storage, kept alive so that its key stays unique


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _ref(t: torch.Tensor) -> _Ref:
    return _Ref(_key(t), t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _view(storage: Any, ref: _Ref) -> torch.Tensor:
    return torch.empty(0, dtype=ref.dtype, device=storage.device).set_(storage, ref.offset, ref.size, ref.stride)


def _covers(t: torch.Tensor) -> bool:
    """``t`` spans every byte of its storage (an overwrite of it leaves nothing of before)."""
    return t.is_contiguous() and t.storage_offset() == 0 and t.numel() * t.element_size() == t.untyped_storage().nbytes()


def _run(func: Any, spec: Any, leaves: list[Any]) -> Any:
    args, kwargs = tree_unflatten(leaves, spec)
    return func(*args, **kwargs)


class _Empty(torch.Tensor):
    """A tensor without data that says it is on the CPU, so that a constructor runs as it
    would. What is done to it runs on the meta tensor inside and is recorded (:class:`_Recorder`)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "_Empty":
        t = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(),  # type: ignore[attr-defined]  # torch's subclass API
                                                storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                device=_CPU, requires_grad=elem.requires_grad)
        t.elem = elem
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise EmptyInitError(f"{func}: a tensor of a model built on the meta device was used after its "
                             "construction, outside the model's parameters and buffers")

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"EmptyTensor(size={list(self.shape)}, dtype={self.dtype})"


class _Recorder(TorchDispatchMode):
    """Leaves the factories' tensors empty and writes down every operator on them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self.storages: dict[int, _Storage] = {}
        self.weights: list[Any] = []
        self.exact = True  # random draws made while recording, their states kept (add_weights: not)
        self._scratch: Any = None  # what random draws are made on (see _zeros)

    def _zeros(self, nbytes: int, reuse: bool) -> Any:
        """A zeroed storage of at least ``nbytes`` to draw on. ``reuse``: the recorder's own,
        grown to the largest draw: one allocation for every draw of a constructor, where one
        per draw left the C allocator holding about the whole model's bytes once freed."""
        if not reuse:
            return torch.zeros(nbytes, dtype=torch.uint8).untyped_storage()
        if self._scratch is None or self._scratch.nbytes() < nbytes:
            self._scratch = None
            self._scratch = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
        torch.tensor([], dtype=torch.uint8).set_(self._scratch, 0, (nbytes,)).zero_()
        return self._scratch

    def _note(self, t: torch.Tensor) -> _Ref:
        ref = _ref(t)
        if ref.key not in self.storages:
            self.storages[ref.key] = _Storage(t.untyped_storage().nbytes(), t.untyped_storage())
        return ref

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        leaves, spec = tree_flatten((args, kwargs))
        empties = [t for t in leaves if isinstance(t, _Empty)]
        factory = (not empties and func.__name__.split(".")[0] in _FACTORIES
                   and not any(isinstance(t, torch.Tensor) for t in leaves))
        if not empties and not factory:
            return func(*args, **kwargs)  # real tensors only: runs as it is
        written = [t for t in _written_args(func, args, kwargs)]
        if any(not isinstance(t, _Empty) for t in written):
            raise EmptyInitError(f"{func} writes values computed from a model's empty tensors into a real tensor")
        random = torch.Tag.nondeterministic_seeded in func.tags
        state = None
        if random and self.exact:  # the draw made now, on scratch, so that the generator moves as in a whole build
            state = torch.random.get_rng_state()
            scratch: dict[int, Any] = {}
            _run(func, spec, [_view(scratch.setdefault(_key(t.elem), self._zeros(t.elem.untyped_storage().nbytes(),
                                                                                  reuse=not scratch)), _ref(t.elem))
                              if isinstance(t, _Empty) else t for t in leaves])
        returns = func._schema.returns
        if written and len(returns) == 1 and returns[0].alias_info is not None and returns[0].alias_info.is_write:
            out = None  # in place: nothing to run on meta (an index_put_ with real indices could not)
            wrapped = written[0]
        else:
            try:
                out, wrapped = self._on_meta(func, spec, leaves, factory)
            except Exception:  # its result depends on the values (.item(), a mask's .any(), nonzero)
                if written or factory:
                    raise
                return self._for_real(func, spec, leaves)
        inputs = {_key(t.elem) for t in empties}
        creates = {}
        for i, t in enumerate(tree_flatten(out)[0]):
            if isinstance(t, torch.Tensor) and t.is_meta and _key(t) not in inputs:
                creates[self._note(t).key] = i
        if not creates and not written:
            return wrapped  # a view: no value changes
        targets = [t.elem for t in written]
        overwritten = {_key(t) for t in targets if func.__name__.split(".")[0] in _OVERWRITES and _covers(t)}
        refs = [self._note(t.elem) if isinstance(t, _Empty)
                else t.detach().clone() if isinstance(t, torch.Tensor)
                else _CPU if isinstance(t, torch.device) else t for t in leaves]
        self.ops.append(_Op(func, spec, refs, frozenset(inputs - overwritten), frozenset(_key(t) for t in targets),
                            creates, random, state))
        return wrapped

    def _for_real(self, func: Any, spec: Any, leaves: list[Any]) -> Any:
        """``func`` on the real values of the empty tensors it reads, computed now from the
        record so far (a tensor or two, freed after): what it returns is real (a number,
        indices), as the constructor run whole would have it."""
        keys = {_key(t.elem) for t in leaves if isinstance(t, _Empty)}
        before = torch.random.get_rng_state()
        real: dict[int, Any] = {}
        for i in (i for i, wanted in enumerate(_needed(self.ops, set(keys))) if wanted):
            op = self.ops[i]
            if op.rng is not None:
                torch.random.set_rng_state(op.rng)
            elif op.random:  # drawn now, in order: the fill draws it again from this state
                op.rng = torch.random.get_rng_state()
            out = _run(op.func, op.spec, [_view(real[x.key], x) if isinstance(x, _Ref) else x for x in op.leaves])
            for k, idx in op.creates.items():
                real[k] = tree_flatten(out)[0][idx].untyped_storage()
        if self.exact:  # the generator back where a whole build has it now
            torch.random.set_rng_state(before)
        return _run(func, spec, [_view(real[_key(t.elem)], _ref(t.elem)) if isinstance(t, _Empty) else t
                                 for t in leaves])

    def _on_meta(self, func: Any, spec: Any, leaves: list[Any], factory: bool) -> tuple[Any, Any]:
        """``func`` run on meta tensors (empty ones unwrapped, real ones as meta stand-ins:
        their values are recorded), and its output with the meta tensors wrapped empty."""
        run = [t.elem if isinstance(t, _Empty) else torch.empty_like(t, device="meta") if isinstance(t, torch.Tensor)
               else torch.device("meta") if factory and isinstance(t, torch.device) else t for t in leaves]
        run_args, run_kwargs = tree_unflatten(run, spec)
        if factory and "device" not in run_kwargs:
            run_kwargs["device"] = torch.device("meta")
        out = func(*run_args, **run_kwargs)
        out_leaves, out_spec = tree_flatten(out)
        return out, tree_unflatten([_Empty(t) if isinstance(t, torch.Tensor) and t.is_meta else t
                                    for t in out_leaves], out_spec)


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
    rng_state: torch.Tensor  # the CPU generator's state when the constructor started
    #: Weights files the constructor named (a Hugging Face spec's ``pretrained:``), read at materialization.
    weights: list[Any] = field(default_factory=list)

    def fill(self, targets: dict[str, list[torch.Tensor]], put: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
        """Compute each named tensor of ``targets`` (name -> the tensors to fill: the
        materialized parameter, sharded or not) and hand it to ``put(target, value)``, one
        storage at a time. The CPU generator is left as it was."""
        wanted: dict[int, list[tuple[_Ref, list[torch.Tensor]]]] = {}
        for name, ts in targets.items():
            ref = self.tensors[name]
            wanted.setdefault(ref.key, []).append((ref, ts))
        before = torch.random.get_rng_state()
        torch.random.set_rng_state(self.rng_state)  # draws without a kept state come in order from here
        try:
            _replay(self, wanted, put)
        finally:
            torch.random.set_rng_state(before)


def _needed(ops: list[_Op], live: set[int]) -> list[bool]:
    """Which operators the values of the ``live`` storages depend on, walked from the end:
    an overwrite of a whole storage ends what its earlier values mattered for (the storage
    must still exist)."""
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
    return needed


def _replay(empty: EmptyModel, wanted: dict[int, list[tuple[_Ref, list[torch.Tensor]]]],
            put: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
    ops = empty.ops
    needed = _needed(ops, {k for k in wanted if k not in empty.constants})
    last_use: dict[int, int] = {}
    for i, op in enumerate(ops):
        if needed[i]:
            for k in (*op.reads, *op.writes, *op.creates):
                last_use[k] = i
    for k, value in empty.constants.items():
        if k in wanted:
            _hand_over(wanted.pop(k), value.untyped_storage(), put)
    real: dict[int, Any] = {}
    for i, op in enumerate(ops):
        if not needed[i]:
            continue
        if op.rng is not None:
            torch.random.set_rng_state(op.rng)
        out = _run(op.func, op.spec, [_view(real[x.key], x) if isinstance(x, _Ref) else x for x in op.leaves])
        out_leaves, _ = tree_flatten(out)
        for k, idx in op.creates.items():
            real[k] = out_leaves[idx].untyped_storage()
        for k in [k for k, last in last_use.items() if last == i]:
            if k in wanted and k in real:
                _hand_over(wanted.pop(k), real[k], put)
            real.pop(k, None)
            del last_use[k]
    for k, entries in wanted.items():  # never written after its allocation: its bytes as a whole build leaves them
        _hand_over(entries, torch.empty(empty.storages[k].nbytes, dtype=torch.uint8).untyped_storage(), put)


def _hand_over(entries: list[tuple[_Ref, list[torch.Tensor]]], storage: Any, put: Callable[..., None]) -> None:
    for ref, targets in entries:
        value = _view(storage, ref)
        for t in targets:
            put(t, value)


_RECORDERS: list[_Recorder] = []  # the constructors being recorded, innermost last


def recording() -> bool:
    """Whether a constructor runs under :func:`record` now (a model spec then leaves its
    pretrained weights to be read at materialization: :func:`from_weights`)."""
    return bool(_RECORDERS)


@contextlib.contextmanager
def from_weights(source: Any) -> Iterator[None]:
    """Under :func:`record`: the model built inside takes its weights from ``source`` (a
    Hugging Face folder, a ``.safetensors`` file), read shard by shard when it is
    materialized. Its constructor's random draws are then not made while recording (the
    weights replace them; a tensor the files lack draws in order at materialization, as
    ``from_pretrained`` draws for it); what is built after (a PEFT adapter) draws as usual."""
    recorder = _RECORDERS[-1]
    recorder.weights.append(source)
    exact, recorder.exact = recorder.exact, False
    try:
        yield
    finally:
        recorder.exact = exact


def record(factory: Callable[[], Any], what: str = "the model") -> Any:
    """Run ``factory()`` with the tensors it allocates left empty, recording how it made
    them (see the module docstring); an :class:`EmptyModel` when it returns an
    ``nn.Module``, else what it returned. The CPU generator moves as in a whole build."""
    rng_state = torch.random.get_rng_state()
    recorder = _Recorder()
    _RECORDERS.append(recorder)
    try:
        with recorder:
            module = factory()
    except EmptyInitError:
        raise
    except Exception as e:
        if _from_meta(e):
            raise EmptyInitError(_cannot(e, what)) from e
        raise
    finally:
        _RECORDERS.pop()
    if not isinstance(module, nn.Module):
        return module  # the caller's error to raise (the factory built something else)
    tensors, constants = _tensors(module, recorder)
    return EmptyModel(module, recorder.ops, recorder.storages, tensors, constants, rng_state, recorder.weights)


def _from_meta(error: BaseException) -> bool:
    """Whether ``error`` comes from an empty tensor (its value read, or an operator that
    has no meta kernel): other errors (a bad config value) are the constructor's own."""
    text = str(error).lower()
    return isinstance(error, NotImplementedError) or any(
        word in text for word in ("meta", "data-dependent", "storage", "data pointer", "subclass", "emptytensor"))


def _tensors(module: nn.Module, recorder: _Recorder) -> tuple[dict[str, _Ref], dict[int, torch.Tensor]]:
    """Every parameter, buffer and empty tensor attribute of ``module`` by name, each made
    a plain meta tensor (what tensor parallelism and ``fully_shard`` take; real ones keep
    their values as constants), ties kept."""
    refs: dict[str, _Ref] = {}
    constants: dict[int, torch.Tensor] = {}
    swapped: dict[int, torch.Tensor] = {}  # id of a tensor -> its meta stand-in (ties stay ties)
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        prefix = f"{mod_name}." if mod_name else ""
        slots = [(mod._parameters, n) for n in mod._parameters] + [(mod._buffers, n) for n in mod._buffers]
        slots += [(mod.__dict__, n) for n, v in list(mod.__dict__.items())  # e.g. a rotary table's copy
                  if isinstance(v, _Empty)]
        for table, name in slots:
            t = table[name]
            if t is None:
                continue
            if id(t) not in swapped:
                if isinstance(t, _Empty):
                    meta = t.elem
                else:  # a real parameter or buffer: its value kept
                    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                    constants[recorder._note(meta).key] = t.detach().clone()
                if isinstance(t, nn.Parameter) and table is mod._parameters:
                    meta = nn.Parameter(meta, requires_grad=t.requires_grad)
                swapped[id(t)] = meta
            table[name] = swapped[id(t)]
            refs[prefix + name] = recorder._note(swapped[id(t)])
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
    return (f"{where} cannot be built with its tensors left empty ({type(error).__name__}: {first}); build the "
            "model whole: pass the module itself rather than its spec, or empty_init=False to the strategy")


__all__ = ["EmptyInitError", "EmptyModel", "from_weights", "record", "recording"]
