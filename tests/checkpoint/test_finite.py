"""first_nonfinite: the first tensor with a NaN or an inf, for every floating dtype."""

from __future__ import annotations

import pytest
import torch

from treadle.checkpoint.finite import first_nonfinite, named_tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_first_bad_tensor_is_named(dtype, bad):
    ok = torch.randn(4, 3).to(dtype)
    spoiled = torch.randn(7).to(dtype)
    spoiled[5] = bad
    assert first_nonfinite([("ok", ok), ("x", spoiled), ("y", spoiled.clone())]) == "x"
    assert first_nonfinite([("ok", ok), ("empty", torch.empty(0, dtype=dtype))]) is None


def test_mixed_dtypes_ints_and_nesting():
    big = torch.full((3,), torch.finfo(torch.float16).max, dtype=torch.float16)  # large, finite: no overflow
    tree = {"model": {"w": torch.ones(2), "h": big, "steps": torch.tensor([2**40])},
            "optim": {"state": {0: {"exp_avg": torch.zeros(2), "exp_avg_sq": torch.tensor([1.0, float("nan")])}}}}
    assert [k for k, _ in named_tensors(tree)] == ["model.w", "model.h", "optim.state.0.exp_avg",
                                                   "optim.state.0.exp_avg_sq"]
    assert first_nonfinite(named_tensors(tree)) == "optim.state.0.exp_avg_sq"
    tree["optim"]["state"][0]["exp_avg_sq"][1] = 0.0
    assert first_nonfinite(named_tensors(tree)) is None
