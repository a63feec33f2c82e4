"""treadle/precision.py: the one table of precision and dtype names."""

from __future__ import annotations

import pytest
import torch

from treadle.precision import AUTOCAST_DTYPES, DTYPE_NAMES, amp_precision, check_precision, torch_dtype


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
                                         ("BFloat16", torch.bfloat16), ("half", torch.float16),
                                         ("fp32", torch.float32), ("int8", None), ("float64", None)])
def test_a_name_is_the_torch_dtype(name, dtype):
    assert torch_dtype(name) is dtype


def test_each_16_bit_name_is_the_precision_that_autocasts_to_it():
    for name in DTYPE_NAMES:
        precision = amp_precision(name)
        if torch_dtype(name) is torch.float32:
            assert precision is None, name
        else:
            assert torch_dtype(AUTOCAST_DTYPES[precision]) is torch_dtype(name), name
    assert amp_precision("int8") is None and amp_precision(None) is None


@pytest.mark.parametrize("given, want", [(32, "32"), ("16-mixed", "16"), ("bf16", "bf16"), ("fp16", "16")])
def test_precision_spellings(given, want):
    assert check_precision(given) == want
    with pytest.raises(ValueError, match=r"precision='64' is not supported; expected one of '32', 'bf16', '16'"):
        check_precision("64")
