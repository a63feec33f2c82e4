"""Split a checkpoint's state into the tensors a sharded writer takes and the rest.

A strategy that shards (FSDP) writes the tensors of some entries through DCP, every rank
its shards, and everything else into ``state.pt`` from rank 0. Which entries: those whose
owner says so (a ``sharded`` attribute, see treadle/strategies/states.py); the strategy
needs to know nothing about what an entry holds::

    tensors, rest = split_tensors(state, names={"model", "optim"})
    ...                                   # tensors -> DCP, rest -> state.pt
    state = merge_tensors(rest, tensors)  # the same nested dicts again
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


def split_tensors(state: dict[str, Any], names: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, rest)``: the tensor leaves of ``state[name]`` for each of ``names``, in
    nested dicts of the same keys, and ``state`` without them. Lists and tuples are leaves
    (as DCP flattens only dicts here); ``state`` itself is not changed."""
    wanted = set(names)
    tensors: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in state.items():
        if key in wanted:
            t, r = _split(value)
            if t is not None:
                tensors[key] = t
            if r is not None:
                rest[key] = r
        else:
            rest[key] = value
    return tensors, rest


def _split(value: Any) -> tuple[Any, Any]:
    if isinstance(value, torch.Tensor):
        return value, None
    if not isinstance(value, dict):
        return None, value
    tensors, rest = {}, {}
    for k, v in value.items():
        t, r = _split(v)
        if t is not None:
            tensors[k] = t
        if r is not None or t is None:
            rest[k] = r
    # An empty dict stays on the rest side, so that merging gives it back.
    return (tensors or None), (rest if rest or not tensors else None)


def merge_tensors(rest: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`split_tensors`: ``rest`` with ``tensors`` put back at their keys."""
    out = dict(rest)
    for key, value in tensors.items():
        out[key] = _merge(out.get(key), value)
    return out


def _merge(rest: Any, tensors: Any) -> Any:
    if not isinstance(tensors, dict):
        return tensors
    out = dict(rest) if isinstance(rest, dict) else {}
    for k, v in tensors.items():
        out[k] = _merge(out.get(k), v)
    return out


__all__ = ["split_tensors", "merge_tensors"]
