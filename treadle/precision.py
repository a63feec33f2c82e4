"""Precision and floating-point dtype names: the one table every place reads them from.

The Trainer's ``precision`` (``"32"``, ``"bf16"``, ``"16"``: fp16 with a GradScaler),
MMEngine's AMP ``dtype`` (``"float16"``, ``"bfloat16"``) and FSDP's ``mixed_precision``
dtypes (``"bfloat16"``, ``"bf16"``, ``"float32"``, ...) name the same three dtypes. This
module imports nothing of treadle, and torch only to turn a name into a ``torch.dtype``:
every layer may use it, a config check before torch is loaded too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Floating dtypes by the names a user or a config may write, as torch names them.
DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16", "half": "float16", "16": "float16",
               "float32": "float32", "fp32": "float32", "float": "float32", "32": "float32"}

#: The Trainer's precisions, each with the dtype autocast computes in (None: fp32, no autocast).
AUTOCAST_DTYPES: dict[str, str | None] = {"32": None, "bf16": "bfloat16", "16": "float16"}
PRECISIONS = tuple(AUTOCAST_DTYPES)

#: Other spellings of a precision (Lightning's among them).
_PRECISION_ALIASES = {"fp32": "32", "32-true": "32", "fp16": "16", "16-mixed": "16", "bf16-mixed": "bf16"}


def check_precision(precision: Any) -> str:
    """Normalise ``precision`` ("32" | "bf16" | "16"; 32 and 16 as ints too)."""
    p = str(precision)
    p = _PRECISION_ALIASES.get(p, p)
    if p not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported; expected one of '32', 'bf16', '16' (fp16 with GradScaler)")
    return p


def amp_precision(dtype: Any) -> str | None:
    """The precision that mixed precision in the 16-bit dtype named ``dtype`` is ("bf16" or
    "16"), or None when ``dtype`` names no 16-bit float."""
    name = DTYPE_NAMES.get(dtype) if isinstance(dtype, str) else None
    return next((p for p, d in AUTOCAST_DTYPES.items() if d is not None and d == name), None)


def torch_dtype(name: str) -> "torch.dtype | None":
    """The floating ``torch.dtype`` a name of :data:`DTYPE_NAMES` stands for (any case,
    ``torch.`` before it or not), or None."""
    torch_name = DTYPE_NAMES.get(name.lower().removeprefix("torch."))
    if torch_name is None:
        return None
    import torch

    return getattr(torch, torch_name)


__all__ = ["AUTOCAST_DTYPES", "DTYPE_NAMES", "PRECISIONS", "amp_precision", "check_precision", "torch_dtype"]
