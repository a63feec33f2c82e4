"""``assert_allclose`` as MMEngine's tests call it (expected first, ``msg`` optional)."""

from typing import Any

import torch


def assert_allclose(expected: Any, actual: Any, rtol: float | None = None, atol: float | None = None,
                    equal_nan: bool = True, msg: str = "") -> None:
    """Compare numbers, lists or tensors with torch's closeness check; dtypes may differ."""
    actual_t = torch.as_tensor(actual, dtype=torch.float64)
    expected_t = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual_t, expected_t, rtol=rtol, atol=atol, equal_nan=equal_nan,
                               msg=msg or None)
