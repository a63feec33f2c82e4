"""Custom steps: a Trainer subclass's val_step/test_step, the model's test_step, and the
one warning for a custom train step that runs its forward outside autocast."""

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, make_data


def _loader(n=12):
    return DataLoader(make_data(n), batch_size=8)


def test_a_subclass_val_step_and_test_step_replace_the_default_ones():
    calls = []

    class T(treadle.Trainer):
        def val_step(self, batch):
            x, y = batch
            self.update_metrics(self.model(x), y)
            calls.append(("val", len(y)))
            return {"n": torch.tensor(float(len(y)))}

        def test_step(self, batch):
            calls.append(("test", len(batch[1])))
            return {"m": torch.tensor(2.0)}

    t = T(TinyNet(), val_dataloader=_loader(), test_dataloader=_loader(), metrics={"acc": treadle.Accuracy()})
    val = t.validate()
    assert val["val/n"] == pytest.approx(6.0) and 0.0 <= val["val/acc"] <= 1.0  # (8 + 4) / 2
    assert t.test()["test/m"] == pytest.approx(2.0)
    assert calls == [("val", 8), ("val", 4), ("test", 8), ("test", 4)]


def test_a_test_pass_falls_back_to_val_step_and_takes_the_models_test_step_first():
    seen = []

    class OnlyVal(treadle.Trainer):
        def val_step(self, batch):
            seen.append("trainer.val_step")

    OnlyVal(TinyNet(), test_dataloader=_loader(8)).test()

    class M(TinyNet):
        def val_step(self, batch, trainer):
            seen.append("model.val_step")

        def test_step(self, batch, trainer):
            seen.append("model.test_step")

    t = treadle.Trainer(M(), val_dataloader=_loader(8), test_dataloader=_loader(8))
    t.validate()
    t.test()
    assert seen == ["trainer.val_step", "model.val_step", "model.test_step"]


def test_subclass_eval_steps_get_the_batch_from_the_strategys_mover():
    got = []

    class T(treadle.Trainer):
        def val_step(self, batch):
            got.append(batch[0].device)

    t = T(TinyNet(), val_dataloader=_loader(8))
    t.validate()
    assert got == [t.strategy.device]


class _Custom(TinyNet):
    """A model whose own train_step autocasts or not, as asked."""

    def __init__(self, autocast: bool):
        super().__init__()
        self.autocast = autocast

    def train_step(self, batch, trainer):
        x, y = batch
        ow = trainer.optim_wrapper
        if self.autocast:
            with ow.optim_context(trainer.model):
                out = trainer.model(x)
                self.dtype = out.dtype
                loss = nn.functional.cross_entropy(out.float(), y)
                ow.update(loss)
        else:
            out = trainer.model(x)
            self.dtype = out.dtype
            loss = nn.functional.cross_entropy(out, y)
            ow.update(loss)
        return {"loss": loss.detach()}


@pytest.mark.parametrize("autocast", [False, True])
def test_a_custom_step_outside_autocast_under_bf16_is_told_once(caplog, autocast):
    model = _Custom(autocast)
    t = treadle.Trainer(model, train_dataloader=_loader(32), optimizer=dict(type="SGD", lr=0.1), max_iters=4,
                        precision="bf16", strategy="single", progress=False, log_interval=2)
    with caplog.at_level(logging.WARNING, logger="treadle"):
        t.fit()
    told = [r for r in caplog.records if "outside autocast" in r.getMessage()]
    assert len(told) == (0 if autocast else 1)
    assert model.dtype == (torch.bfloat16 if autocast else torch.float32)
    assert not any(m._forward_pre_hooks for m in model.modules())  # checked once, then the hooks are gone


def test_fp32_custom_steps_and_the_default_step_are_never_checked(caplog):
    model = _Custom(autocast=False)
    treadle.Trainer(model, train_dataloader=_loader(16), optimizer=dict(type="SGD", lr=0.1), max_iters=1,
                    progress=False)
    assert not any(m._forward_pre_hooks for m in model.modules())
    plain = TinyNet()
    treadle.Trainer(plain, train_dataloader=_loader(16), loss_fn=nn.CrossEntropyLoss(), precision="bf16",
                    optimizer=dict(type="SGD", lr=0.1), max_iters=1, progress=False)
    assert not any(m._forward_pre_hooks for m in plain.modules())


def test_every_hook_imports_from_treadle_hooks():
    import treadle.hooks as hooks

    names = ["CheckpointHook", "EarlyStoppingHook", "EMAHook", "IterTimerHook", "LoggerHook", "ModelSummaryHook",
             "NaNGuardHook", "ParamSchedulerHook", "PhaseTimerHook", "ProfilerHook", "ProgressBarHook",
             "RuntimeEnvHook", "TrainMetricsHook"]
    for name in names:
        cls = getattr(hooks, name)
        assert issubclass(cls, treadle.Hook) and cls.__name__ == name
    assert set(names) <= set(hooks.__all__)
    with pytest.raises(AttributeError, match="NoSuchHook"):
        _ = hooks.NoSuchHook


def test_trainer_log_from_a_step_and_a_hook_joins_the_train_record(tmp_path):
    import json

    class Logs(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            trainer.log("hook/iter", float(trainer.state.iter))

    class M(TinyNet):
        def train_step(self, batch, trainer):
            x, y = batch
            loss = nn.functional.cross_entropy(trainer.model(x), y)
            trainer.optim_wrapper.update(loss)
            trainer.log("step/mean_input", x.mean())
            return {"loss": loss.detach()}

    data = make_data(32)
    t = treadle.Trainer(M(), work_dir=tmp_path, train_dataloader=DataLoader(data, batch_size=8),
                        optimizer=dict(type="SGD", lr=0.1), max_iters=4, log_interval=2, hooks=[Logs()],
                        checkpoint=False, progress=False, log_writers=["jsonl"])
    t.fit()
    train = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in train if r["mode"] == "train"]
    means = [data.tensors[0][i * 8:(i + 1) * 8].mean().item() for i in range(4)]
    assert [r["step/mean_input"] for r in train] == pytest.approx([sum(means[:2]) / 2, sum(means[2:]) / 2])
    assert [r["hook/iter"] for r in train] == [0.5, 2.5]
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        t.log("x", torch.ones(2))
    with pytest.raises(TypeError, match="expected a number"):
        t.log("x", "high")
