"""A model with MMEngine's ``BaseModel`` interface trains, validates and tests under treadle
as under MMEngine's runner: ``train_step(data, optim_wrapper)`` gets the OptimWrapper
(``optim_context``, ``update_params``), runs its ``data_preprocessor`` itself and returns
the values to log; ``val_step(data)``/``test_step(data)`` return predictions, which the
metrics get with the batch. The model below is written here with that interface (the
suite does not need mmengine)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.engine.mmengine_model import is_mmengine_model, wrapped_train_step
from support import ON_CPU, make_data


class Preprocessor(nn.Module):
    """``data_preprocessor(data, training)``: the model's input scaling (so a test sees it ran)."""

    def forward(self, data: dict, training: bool = False) -> dict:
        return {"inputs": data["inputs"].float() * 2.0, "labels": data["labels"]}


class MMStyleClassifier(nn.Module):
    """MMEngine's BaseModel interface: forward(..., mode), parse_losses, the three steps."""

    def __init__(self) -> None:
        super().__init__()
        self.data_preprocessor = Preprocessor()
        self.fc = nn.Linear(6, 3)

    def forward(self, inputs, labels=None, mode="tensor"):
        logits = self.fc(inputs)
        if mode == "loss":
            return {"loss_cls": F.cross_entropy(logits, labels), "acc": (logits.argmax(1) == labels).float().mean()}
        if mode == "predict":
            return logits.argmax(1)
        return logits

    def parse_losses(self, losses):
        loss = sum(v for k, v in losses.items() if "loss" in k)
        return loss, {"loss": loss.detach(), **{k: v.detach() for k, v in losses.items()}}

    def train_step(self, data, optim_wrapper):
        with optim_wrapper.optim_context(self):
            data = self.data_preprocessor(data, True)
            losses = self(**data, mode="loss")
        loss, log_vars = self.parse_losses(losses)
        optim_wrapper.update_params(loss)
        return log_vars

    def val_step(self, data):
        return self(**self.data_preprocessor(data, False), mode="predict")

    def test_step(self, data):
        return self(**self.data_preprocessor(data, False), mode="predict")


class Accuracy:
    """A metric fed as MMEngine's evaluator is: the predictions and the data batch."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.right = self.seen = 0

    def update(self, predictions, batch) -> None:
        self.right += int((predictions == batch["labels"]).sum())
        self.seen += len(predictions)

    def compute(self) -> float:
        return self.right / self.seen


def _loader(data) -> DataLoader:
    return DataLoader([{"inputs": x, "labels": y} for x, y in data], batch_size=8)


def test_the_interface_is_recognised():
    assert is_mmengine_model(MMStyleClassifier())
    assert not is_mmengine_model(nn.Linear(2, 2))


def test_mmengine_model_trains_as_a_hand_written_loop(tmp_path):
    data = make_data(32)
    torch.manual_seed(0)
    model = MMStyleClassifier()
    ref = copy.deepcopy(model)
    trainer = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=_loader(data), val_dataloader=_loader(data),
                              test_dataloader=_loader(data), optimizer=dict(type="SGD", lr=0.1), max_epochs=2,
                              metrics={"acc": Accuracy()}, strategy=ON_CPU, log_interval=2, log_writers=("jsonl",))
    trainer.fit()

    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        for batch in _loader(data):
            loss = F.cross_entropy(ref.fc(batch["inputs"] * 2.0), batch["labels"])
            loss.backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)

    with torch.no_grad():
        x = torch.stack([x for x, _ in data]) * 2.0
        y = torch.stack([y for _, y in data])
        expected = (ref.fc(x).argmax(1) == y).float().mean().item()
    assert trainer.state.metrics["val/acc"] == pytest.approx(expected)
    assert trainer.test()["test/acc"] == pytest.approx(expected)
    record = (tmp_path / "log.jsonl").read_text().splitlines()[0]
    assert '"loss_cls"' in record and '"acc"' in record  # the log_vars train_step returned


class Wrapper(nn.Module):
    """A stand-in for DDP: the module inside, and every forward through it recorded."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module, self.calls = module, []

    def forward(self, *args, **kwargs):
        self.calls.append(sorted(kwargs))
        return self.module(*args, **kwargs)


def test_a_wrapped_model_is_stepped_as_mmengines_ddp_wrapper_steps_it():
    """Under DDP the model's own train_step would run the unwrapped module (no gradient would be
    exchanged): the step runs data_preprocessor, forward(mode='loss') through the wrapper,
    parse_losses and update_params, as MMDistributedDataParallel.train_step does."""
    torch.manual_seed(0)
    model = MMStyleClassifier()
    ref = copy.deepcopy(model)
    wrapper = Wrapper(model)
    batch = next(iter(_loader(make_data(8))))
    from treadle.optim.wrapper import OptimWrapper

    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    log_vars = wrapped_train_step(model, wrapper, batch, ow)
    assert wrapper.calls == [["inputs", "labels", "mode"]]
    assert sorted(log_vars) == ["acc", "loss", "loss_cls"]
    ref_ow = OptimWrapper(torch.optim.SGD(ref.parameters(), lr=0.1))
    ref.train_step(batch, ref_ow)  # the model's own step, unwrapped: the same update
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"several optimizers .* \(MMSeparateDistributedDataParallel\)"):
        wrapped_train_step(model, wrapper, batch, {"a": ow, "b": ref_ow})
