"""Collate functions a config may name: ``collate_fn: default_collate`` or ``pseudo_collate``.

``default_collate`` is torch's (stack tensors, numbers and arrays into batch tensors).
``pseudo_collate`` keeps each sample's values as they are: a batch of dicts becomes one
dict of lists, a batch of tuples a list of lists, anything else the list of samples.
It is for samples that cannot be stacked (images of different sizes, detection
targets) and models that batch them themselves, as MMEngine's function of that name does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable

from torch.utils.data import default_collate


def pseudo_collate(samples: Sequence[Any]) -> Any:
    """Turn a list of samples inside out without stacking: ``[{"x": a}, {"x": b}]`` ->
    ``{"x": [a, b]}``; a named tuple stays one of its type, a tuple becomes a list."""
    first = samples[0]
    if isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, Mapping):
        return type(first)({key: pseudo_collate([s[key] for s in samples]) for key in first})  # type: ignore[call-arg]
    if isinstance(first, Sequence):
        if any(len(s) != len(first) for s in samples):
            raise RuntimeError(f"pseudo_collate: samples of different lengths ({sorted({len(s) for s in samples})}) "
                               "cannot be turned into one batch")
        fields = [pseudo_collate(list(column)) for column in zip(*samples)]
        if isinstance(first, tuple) and hasattr(first, "_fields"):
            return type(first)(*fields)
        if isinstance(first, tuple):
            return fields
        try:
            return type(first)(fields)  # type: ignore[call-arg]
        except TypeError:
            return fields
    return list(samples)


#: The names ``collate_fn`` may give (any configuration, safe mode included).
COLLATE_FUNCTIONS: dict[str, Callable[[Sequence[Any]], Any]] = {
    "default_collate": default_collate,
    "pseudo_collate": pseudo_collate,
}

__all__ = ["COLLATE_FUNCTIONS", "default_collate", "pseudo_collate"]
