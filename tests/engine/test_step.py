"""Batch unpacking and the loss-dict rule of the default step."""

from __future__ import annotations

import pytest
import torch

from treadle.engine.step import parse_losses, unpack_batch


def test_unpack_tuple_list_and_dict():
    a, b = torch.zeros(1), torch.ones(1)
    assert unpack_batch((a, b)) == (a, b)
    assert unpack_batch([a, b]) == (a, b)
    assert unpack_batch({"inputs": a, "targets": b, "meta": 1}) == (a, b)
    assert unpack_batch({"input": a, "target": b}) == (a, b)


@pytest.mark.parametrize("batch,got", [
    ((1, 2, 3), "a tuple of 3 elements"),
    (torch.zeros(3), "a Tensor"),
    ({"x": 1}, "a dict with keys \\['x'\\]"),
])
def test_unpack_errors_name_what_was_given(batch, got):
    with pytest.raises(TypeError, match=f"got {got}; expected \\(inputs, targets\\)"):
        unpack_batch(batch)


def test_a_total_loss_entry_is_the_total_not_one_more_term():
    parts = {"loss_cls": torch.tensor(1.0), "loss_box": torch.tensor(2.0), "total_loss": torch.tensor(3.0)}
    total, logged = parse_losses(parts)
    assert total.item() == 3.0 and logged["loss"].item() == 3.0 and logged["loss_box"].item() == 2.0


def test_parse_losses_tensor_dict_and_list():
    t = torch.tensor(2.0, requires_grad=True)
    total, logged = parse_losses(t)
    assert total is t and logged["loss"].requires_grad is False
    d = {"loss_a": torch.tensor(1.0), "aux_loss": torch.tensor(2.0), "acc": torch.tensor(0.5)}
    total, logged = parse_losses(d)
    assert total.item() == 3.0 and logged["loss"].item() == 3.0 and logged["acc"].item() == 0.5
    total, _ = parse_losses([torch.tensor(1.0), torch.tensor(4.0)])
    assert total.item() == 5.0
    with pytest.raises(ValueError, match="no key containing 'loss'"):
        parse_losses({"acc": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="losses must be"):
        parse_losses("nope")
