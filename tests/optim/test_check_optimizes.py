"""An optimizer over another model's parameters is refused; trainable parameters that no
optimizer holds are named (they would silently not train)."""

import logging

import pytest
import torch
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, make_data


def _trainer(model, optimizer):
    return treadle.Trainer(model, train_dataloader=DataLoader(make_data(8), batch_size=4),
                           loss_fn=torch.nn.CrossEntropyLoss(), optimizer=optimizer, max_iters=1, progress=False,
                           strategy="single")


def test_an_optimizer_over_another_models_parameters_is_refused():
    other = TinyNet()
    params = sum(p.numel() for p in TinyNet().parameters())
    with pytest.raises(ValueError, match=rf"holds none of the model's 4 trainable parameter tensors \({params:,} values\) "
                                         r"but 4 tensor\(s\) of another model"):
        _trainer(TinyNet(), torch.optim.SGD(other.parameters(), lr=0.1))
    strategy = treadle.build_strategy("single", seed=0)
    with pytest.raises(ValueError, match="holds none of the model's"):  # a hand-written loop's prepare too
        strategy.prepare(TinyNet(), optim_wrapper=dict(optimizer=torch.optim.SGD(other.parameters(), lr=0.1)))


def test_trainable_parameters_in_no_optimizer_are_named(caplog):
    model = TinyNet()
    with caplog.at_level(logging.WARNING, logger="treadle"):
        _trainer(model, torch.optim.SGD(model.fc1.parameters(), lr=0.1))
    values = sum(p.numel() for p in model.fc2.parameters())
    assert (f"2 of the model's 4 trainable parameter tensors ({values:,} values) are in no optimizer and will not "
            "train: fc2.weight, fc2.bias") in caplog.text


def test_frozen_parameters_and_a_full_optimizer_say_nothing(caplog):
    model = TinyNet()
    model.fc2.requires_grad_(False)
    with caplog.at_level(logging.WARNING, logger="treadle"):
        _trainer(model, torch.optim.SGD(model.fc1.parameters(), lr=0.1))
        _trainer(TinyNet(), dict(type="SGD", lr=0.1))
    assert "in no optimizer" not in caplog.text
