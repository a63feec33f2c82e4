"""Batch unpacking and the loss-dict rule of the default step."""

from __future__ import annotations

import weakref

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


class _Outputs(torch.nn.Module):
    """A model whose output holds, beside its loss, a tensor backward does not need (as a
    language model's logits): the step should let go of it before backward runs."""

    def __init__(self, loss_fn: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))
        self.loss_fn = loss_fn

    def forward(self, x):
        logits = x * self.weight
        self.logits = weakref.ref(logits)
        return logits if self.loss_fn else {"loss": logits.logsumexp(0), "logits": logits}


@pytest.mark.parametrize("loss_fn", [False, True], ids=["model returns its loss", "loss_fn"])
def test_the_model_outputs_are_freed_before_backward(loss_fn):
    from treadle.engine.step import make_train_step
    from treadle.optim.wrapper import OptimWrapper

    model = _Outputs(loss_fn)
    alive_in_backward = []
    model.weight.register_hook(lambda g: alive_in_backward.append(model.logits() is not None))
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    step = make_train_step(model, (lambda out, target: out.logsumexp(0)) if loss_fn else None, wrapper, None)
    logged = step((torch.arange(3.0), torch.zeros(())) if loss_fn else torch.arange(3.0))
    assert alive_in_backward == [False]  # the output (logits) was freed before the gradients were computed
    assert torch.equal(model.weight.detach(), torch.ones(3) - 0.1 * torch.softmax(torch.arange(3.0), 0) * torch.arange(3.0))
    assert logged["loss"].item() == pytest.approx(torch.arange(3.0).logsumexp(0).item())
