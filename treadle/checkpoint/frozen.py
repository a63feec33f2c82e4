"""Digests of the weights that do not train, for checkpoints that leave them out.

Parameters with ``requires_grad=False`` (a PEFT model's base, a frozen backbone) are not
written into training checkpoints by default: ``state.pt["model"]`` holds the trainable
parameters and every persistent buffer, and ``state.pt["frozen"]`` describes the rest
(its owner: ``FrozenWeights`` in treadle/strategies/states.py)::

    {"saved": False,      # True: the frozen tensors are in state.pt["model"] too (save_frozen=True)
     "digest": "sha256",
     "tensors": {"base_model.model.lm_head.weight":
                     {"shape": [256, 128], "dtype": "float32", "sha256": "<64 hex digits>"},
                 ...}}

``tensors`` lists every frozen parameter by its state-dict key (each name of a tied
weight), in the model's order. A digest is the sha256 of the whole tensor's bytes in
row-major order, as torch holds them in memory: the same for any sharding, so a run on
another mesh compares its own weights with it. A resume, or a ``load_from=``, of a
checkpoint that left them out compares the model's frozen weights with these digests
and refuses another base naming the first tensor that differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Callable, Iterable

import torch
from torch import nn

from treadle.checkpoint.manifest import CheckpointError

#: The digest's algorithm, recorded in the entry.
DIGEST = "sha256"


def frozen_keys(module: nn.Module) -> list[str]:
    """The state-dict keys of ``module``'s parameters that do not train, in its order
    (every name of a tied parameter)."""
    return [name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad]


def tensor_sha256(tensor: torch.Tensor) -> str:
    """The sha256 of ``tensor``'s bytes, row-major, on the host (a DTensor must be made
    whole first: :func:`describe` does)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    h = hashlib.sha256()
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself: no copy
    return h.hexdigest()


def _info(tensor: torch.Tensor, digest: str) -> dict[str, Any]:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."), "sha256": digest}


def describe(tensors: Mapping[str, torch.Tensor], names: Iterable[str], *, rank: int = 0, world_size: int = 1,
             gather: Callable[[Any], list[Any]] | None = None) -> dict[str, dict[str, Any]]:
    """``{name: {"shape", "dtype", "sha256"}}`` of ``tensors[name]`` for each of ``names``.

    Several processes (``gather``: every rank's object on every rank, e.g.
    ``comm.all_gather_object``): every rank calls this with the same names; each hashes
    every ``world_size``-th tensor and the digests are gathered. A DTensor is made whole
    one at a time (``full_tensor()``, a collective), so at most one whole tensor is held
    beyond the shards. The same object under two names (a tied weight) is hashed once."""
    from torch.distributed.tensor import DTensor

    names = list(names)
    first: dict[Any, str] = {}  # a tensor's identity -> the first name it had
    mine: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        t = tensors[name]
        if _identity(t) in first:
            continue
        first[_identity(t)] = name
        if isinstance(t, DTensor):
            t = t.full_tensor()  # every rank, in the same order
        if gather is None or i % world_size == rank:
            mine[name] = _info(t, tensor_sha256(t))
        del t
    if gather is not None:
        for share in gather(mine):
            mine.update(share)
    return {name: mine[first[_identity(tensors[name])]] for name in names}


def _identity(t: torch.Tensor) -> Any:
    """The same for two names of one tensor (a tied weight): a DTensor's object (every rank
    decides alike, as each makes the collective for it), a tensor's memory."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor) or t.numel() == 0:
        return id(t)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


class FrozenDigests:
    """The descriptions (:func:`describe`) of a module's frozen weights, kept across saves:
    computed at the first :meth:`get`, again only when the set of frozen parameters
    changes (other names, or other parameter objects) or after :meth:`forget`."""

    def __init__(self) -> None:
        self._key: tuple[tuple[str, int], ...] | None = None
        self._value: dict[str, dict[str, Any]] = {}

    def get(self, module: nn.Module, tensors: Callable[[], Mapping[str, torch.Tensor]], *, rank: int = 0,
            world_size: int = 1, gather: Callable[[Any], list[Any]] | None = None) -> dict[str, dict[str, Any]]:
        """The descriptions of ``module``'s frozen weights, read from ``tensors()`` (its state
        dict as the strategy gives it) when they must be computed; with ``gather``, a
        collective then (see :func:`describe`)."""
        frozen = [(name, p) for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad]
        key = tuple((name, id(p)) for name, p in frozen)
        if key != self._key:
            state = tensors() if frozen else {}
            names = [name for name, _ in frozen if name in state]
            self._value = describe(state, names, rank=rank, world_size=world_size, gather=gather) if names else {}
            self._key = key
        return self._value

    def forget(self) -> None:
        """The frozen weights were changed in place (loaded): compute again at the next :meth:`get`."""
        self._key = None


def check_entry(entry: Any, where: str) -> dict[str, Any]:
    """``entry`` (a checkpoint's ``frozen`` entry, plain data) if it has the layout of the
    module docstring; a one-line CheckpointError naming ``where`` otherwise."""
    ok = isinstance(entry, dict) and isinstance(entry.get("saved"), bool) and entry.get("digest") == DIGEST \
        and isinstance(entry.get("tensors"), dict) and all(
            isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("sha256"), str)
            and isinstance(v.get("shape"), list) and isinstance(v.get("dtype"), str)
            for k, v in entry["tensors"].items())
    if not ok:
        raise CheckpointError(f"{where}: its 'frozen' entry is not the description of frozen weights this treadle "
                              f"writes ({{'saved': bool, 'digest': {DIGEST!r}, 'tensors': {{name: {{shape, dtype, "
                              "sha256}}}}}})")
    return entry


def first_difference(saved: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]],
                     names: Iterable[str] | None = None) -> str | None:
    """The first tensor whose description differs between ``saved`` (the checkpoint's)
    and ``current`` (both ``{name: {"shape", "dtype", "sha256"}}``), as a phrase naming it;
    None when they agree. ``names``: compare these (each must be in both); default: all,
    the two sets of names included."""
    for name in saved if names is None else names:
        want, have = saved.get(name), current.get(name)
        if want is None:
            return f"{name!r} is frozen here but the checkpoint has no digest of it"
        if have is None:
            return f"{name!r} is frozen in the checkpoint but not a frozen parameter here"
        if list(want["shape"]) != list(have["shape"]):
            return f"{name!r} differs (shape {tuple(want['shape'])} in the checkpoint, {tuple(have['shape'])} here)"
        if want["dtype"] != have["dtype"]:
            return f"{name!r} differs (dtype {want['dtype']} in the checkpoint, {have['dtype']} here)"
        if want["sha256"] != have["sha256"]:
            return f"{name!r} differs (sha256 {want['sha256'][:12]}... in the checkpoint, {have['sha256'][:12]}... here)"
    if names is None:
        extra = next((name for name in current if name not in saved), None)
        if extra is not None:
            return f"{extra!r} is frozen here but not in the checkpoint"
    return None


def verify_left_out(entry: Any, missing: Iterable[str], where: str,
                    digests: Callable[[list[str]], Mapping[str, Mapping[str, Any]]]) -> set[str]:
    """The ``missing`` weights (a model's keys a checkpoint's weights lack) that the
    checkpoint's ``frozen`` ``entry`` describes as left out, once ``digests(names)`` (the
    model's own tensors of those names, described) match it; a one-line CheckpointError
    naming ``where`` and the first tensor that differs otherwise. None: nothing left out."""
    if entry is None:
        return set()
    entry = check_entry(entry, where)
    listed = [k for k in missing if k in entry["tensors"]] if not entry["saved"] else []
    if not listed:
        return set()
    problem = first_difference(entry["tensors"], digests(listed), names=listed)
    if problem is not None:
        raise CheckpointError(f"{where}: nothing was loaded: frozen weight {problem}; {ADVICE}")
    return set(listed)


#: What to do about a base that differs, for the one-line errors.
ADVICE = ("the checkpoint holds the trained weights only: give the model the base it was trained over, or save "
          "with save_frozen=True to keep the frozen weights in the checkpoint")

__all__ = ["ADVICE", "DIGEST", "FrozenDigests", "check_entry", "describe", "first_difference", "frozen_keys",
           "tensor_sha256", "verify_left_out"]
