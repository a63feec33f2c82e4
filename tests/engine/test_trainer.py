"""The Trainer against hand-written PyTorch: bit-exact weights, loss dicts, a GAN
with two optimizers, validate/test results, and clear errors for bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.seeding import seed_everything
from treadle.strategies.base import SingleDevice

from support import DEVICE, FUSED, TinyNet, make_data, needs_cuda, to_device


def test_weights_bit_equal_to_hand_written_loop():
    data = make_data(40)
    seed_everything(0)
    model = TinyNet(dropout=0.3)  # dropout: the global RNG stream must match too
    ref = to_device(copy.deepcopy(model))  # the reference runs where the Trainer does

    t = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="AdamW", lr=1e-2, weight_decay=0.01), max_epochs=3, seed=7)
    t.fit()

    # The reference: the loop everyone writes. Its loader has its own generator because
    # treadle keeps data-order randomness out of the global stream (the model's dropout).
    seed_everything(7)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01, **FUSED)
    loss_fn = nn.CrossEntropyLoss()
    ref.train()
    ref_loader = DataLoader(data, batch_size=8, generator=torch.Generator())
    for _ in range(3):
        for x, y in map(to_device, ref_loader):
            loss = loss_fn(ref(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(p, q), name
    assert t.state.iter == 15
    # and the optimizer state matches too
    assert torch.equal(t.optimizer.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


class DictLossNet(nn.Module):
    """Without loss_fn the model takes the batch and returns a dict of losses."""

    def __init__(self):
        super().__init__()
        self.net = TinyNet()

    def forward(self, batch):
        x, y = batch
        out = self.net(x)
        return {"loss_ce": nn.functional.cross_entropy(out, y), "loss_reg": 0.1 * out.pow(2).mean(),
                "acc": (out.argmax(1) == y).float().mean()}


def test_model_returning_loss_dict_sums_loss_keys_and_logs_all(tmp_path):
    data = make_data(16)
    torch.manual_seed(0)
    model = DictLossNet()
    ref = to_device(copy.deepcopy(model))
    seen = []

    class Grab(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            seen.append(outputs)

    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=DataLoader(data, batch_size=8),
                        optimizer=dict(type="SGD", lr=0.1), max_iters=2, hooks=[Grab()], log_interval=2)
    t.fit()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, **FUSED)
    expected = []
    for batch in map(to_device, DataLoader(data, batch_size=8)):
        d = ref(batch)
        (d["loss_ce"] + d["loss_reg"]).backward()  # "acc" has no "loss" in its name: not summed
        opt.step()
        opt.zero_grad()
        expected.append({k: v.detach() for k, v in d.items()})
    for got, exp in zip(seen, expected):
        assert set(got) == {"loss", "loss_ce", "loss_reg", "acc"}
        assert torch.equal(got["loss"], exp["loss_ce"] + exp["loss_reg"])
        assert torch.equal(got["acc"], exp["acc"])
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    rec = treadle.logging.read_jsonl(tmp_path / "log.jsonl")[0]
    assert rec["loss_ce"] == pytest.approx(float((expected[0]["loss_ce"] + expected[1]["loss_ce"]) / 2))


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
        self.disc = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))

    def train_step(self, batch, trainer):
        real = batch[0]
        z = torch.randn(real.shape[0], 2, device=real.device)  # on the batch's device, as the model is
        bce = nn.functional.binary_cross_entropy_with_logits
        d_opt, g_opt = trainer.optim_wrappers["disc"], trainer.optim_wrappers["gen"]
        fake = self.gen(z)
        ones, zeros = torch.ones(len(real), 1, device=real.device), torch.zeros(len(real), 1, device=real.device)
        d_loss = bce(self.disc(real), ones) + bce(self.disc(fake.detach()), zeros)
        d_opt.update(d_loss)
        g_loss = bce(self.disc(fake), ones)
        g_opt.update(g_loss)
        return {"loss_d": d_loss.detach(), "loss_g": g_loss.detach()}


def test_custom_train_step_with_two_optimizers_matches_hand_written():
    data = torch.utils.data.TensorDataset(torch.randn(24, 2, generator=torch.Generator().manual_seed(3)))
    torch.manual_seed(0)
    gan = GAN()
    ref = to_device(copy.deepcopy(gan))
    t = treadle.Trainer(gan, train_dataloader=DataLoader(data, batch_size=8), max_epochs=2, seed=5,
                        optimizer={"gen": dict(type="Adam", lr=1e-3), "disc": dict(type="SGD", lr=1e-2)})
    assert set(t.optim_wrappers) == {"gen", "disc"}
    t.fit()
    assert t.learning_rates == {"lr/gen": 1e-3, "lr/disc": 1e-2}  # a property, like t.optimizer

    seed_everything(5)
    g_opt = torch.optim.Adam(ref.gen.parameters(), lr=1e-3, **FUSED)
    d_opt = torch.optim.SGD(ref.disc.parameters(), lr=1e-2, **FUSED)
    bce = nn.functional.binary_cross_entropy_with_logits
    ones, zeros = torch.ones(8, 1, device=DEVICE), torch.zeros(8, 1, device=DEVICE)
    for _ in range(2):
        for (real,) in map(to_device, DataLoader(data, batch_size=8, generator=torch.Generator())):
            z = torch.randn(real.shape[0], 2, device=DEVICE)
            fake = ref.gen(z)
            d_loss = bce(ref.disc(real), ones) + bce(ref.disc(fake.detach()), zeros)
            d_loss.backward()
            d_opt.step()
            d_opt.zero_grad()
            g_loss = bce(ref.disc(fake), ones)
            g_loss.backward()
            g_opt.step()
            g_opt.zero_grad()
    for (name, p), q in zip(gan.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(p, q), name


def test_two_optimizers_without_custom_step_is_an_error():
    with pytest.raises(ValueError, match="custom step"):
        treadle.Trainer(GANNoStep(), train_dataloader=[1], max_epochs=1,
                        optimizer={"gen": dict(type="SGD", lr=1), "disc": dict(type="SGD", lr=1)})


class GANNoStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen, self.disc = nn.Linear(1, 1), nn.Linear(1, 1)


def test_validate_and_test_return_metrics_equal_to_manual_computation():
    val, test = make_data(20, seed=1), make_data(12, seed=2)
    torch.manual_seed(0)
    model = TinyNet()
    t = treadle.Trainer(model, val_dataloader=DataLoader(val, batch_size=8), test_dataloader=DataLoader(test, batch_size=5),
                        loss_fn=nn.CrossEntropyLoss(), metrics={"acc": treadle.Accuracy(), "top2": treadle.Accuracy(topk=2)})
    for name, ds, res in (("val", val, t.validate()), ("test", test, t.test())):
        x, y = to_device(ds.tensors)  # where the Trainer placed the model
        with torch.no_grad():
            out = model(x)
        assert set(res) == {f"{name}/loss", f"{name}/acc", f"{name}/top2"}
        # the mean over the whole set, although the last batch is smaller
        assert res[f"{name}/loss"] == pytest.approx(nn.functional.cross_entropy(out, y).item(), rel=1e-6)
        assert res[f"{name}/acc"] == pytest.approx((out.argmax(1) == y).float().mean().item())
        top2 = (out.topk(2, dim=1).indices == y[:, None]).any(1).float().mean().item()
        assert res[f"{name}/top2"] == pytest.approx(top2)
    assert t.state.metrics["test/acc"] == res["test/acc"]
    assert model.training  # the model's mode is restored after evaluation


def test_custom_val_step_results_are_averaged():
    class M(TinyNet):
        def val_step(self, batch, trainer):
            x, y = batch
            out = self(x)
            trainer.update_metrics(out, y)
            return {"score": torch.tensor(float(len(y)))}

    t = treadle.Trainer(M(), val_dataloader=DataLoader(make_data(12), batch_size=8), metrics={"acc": treadle.Accuracy()})
    res = t.validate()
    assert res["val/score"] == pytest.approx((8 + 4) / 2)  # a custom step's values: mean over batches
    assert 0.0 <= res["val/acc"] <= 1.0


def test_torchmetrics_style_dict_results_are_flattened():
    class Multi:
        def reset(self):
            self.n = 0

        def update(self, outputs, targets):
            self.n += len(targets)

        def compute(self):
            return {"count": torch.tensor(self.n), "half": self.n / 2}

    t = treadle.Trainer(TinyNet(), val_dataloader=DataLoader(make_data(10), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        metrics={"m": Multi()})
    res = t.validate()
    assert res["val/m/count"] == 10 and res["val/m/half"] == 5.0


def test_subclass_can_override_train_step():
    class MyTrainer(treadle.Trainer):
        def train_step(self, batch):
            x, y = batch
            loss = nn.functional.cross_entropy(self.model(x), y) * 0.0 + 1.0
            return {"loss": loss.detach()}

    t = MyTrainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4), optimizer=dict(type="SGD", lr=0.1),
                  max_iters=3)
    before = copy.deepcopy(t.model.state_dict())
    t.fit()
    assert t.state.iter == 3
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())  # it never stepped


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_epochs=-1), r'max_epochs: out of range \(got -1\); expected an int >= 1'),
    (dict(max_epochs=0), r'max_epochs: out of range \(got 0\); expected an int >= 1'),
    (dict(max_iters=2.5), r'max_iters: wrong type float \(got 2\.5\); expected an int >= 1, or null'),
    (dict(max_epochs=2, max_iters=10), r"either max_epochs or max_iters, not both"),
    (dict(), r"needs max_epochs .* or max_iters"),
    (dict(max_epochs=1, optimizer=dict(type="Adamm", lr=1)), r"^optimizer: unknown optimizer type 'Adamm'.*Did you mean 'Adam'"),
    (dict(max_epochs=1, optimizer=dict(lr=1)), r"has no 'type'"),
    (dict(max_epochs=1, optimizer=dict(type="SGD", lr=1, betas=(0.9, 0.9))), r"SGD rejected arguments"),
    (dict(max_epochs=1, precision="fp8"), r"precision='fp8' is not supported; expected one of '32', 'bf16', '16'"),
    (dict(max_epochs=1, strategy="horovod"),
     r"strategy: not a supported value \(got 'horovod'\); expected one of 'auto', 'single', 'ddp', 'fsdp'"),
    (dict(max_epochs=1, optimizer=None), r"training needs an optimizer"),
    (dict(max_epochs=1, val_interval=0), r'val_interval: out of range \(got 0\); expected an int >= 1'),
    (dict(max_epochs=1, log_interval="10"), r"log_interval: wrong type str \(got '10'\); expected an int >= 1"),
    (dict(max_epochs=1, workflow=[("val", 1)]), r"no 'val_dataloader'|'val' phase but no val_dataloader"),
    (dict(max_epochs=1, workflow=[("train", 0)]), r'workflow\[0\]\[1\]: not a positive count \(got 0\); expected an int >= 1'),
    (dict(max_epochs=1, workflow=[("eval", 1)]),
     r"workflow\[0\]\[0\]: not a supported value \(got 'eval'\); expected one of 'train', 'val'\. Did you mean 'val'\?"),
    (dict(max_epochs=1, clip_grad=dict()), r"exactly one of 'max_norm'"),
    (dict(max_epochs=1, metrics={"acc": object()}), r"metrics\['acc'\] \(object\) lacks"),
    (dict(max_epochs=1, hooks=[object()]), r"hooks\[0\] must be a treadle.Hook"),
    (dict(max_epochs=1, seed=-3), r'seed: out of range \(got -3\); expected an int >= 0'),
    (dict(max_epochs=1, train_dataloader=5), r"train_dataloader=5 \(int\) is not iterable; expected a DataLoader"),
    (dict(max_epochs=1, val_dataloader=5), r"val_dataloader=5 \(int\) is not iterable"),
    (dict(max_epochs=1, test_dataloader="data/test"), r"test_dataloader='data/test' \(str\) is not iterable"),
    (dict(max_epochs=1, metrics={"acc": treadle.Accuracy}),
     r"metrics\['acc'\]=Accuracy is a class, not a metric object; expected an instance such as Accuracy\(\)"),
    (dict(max_epochs=1, hooks=None), r"hooks=None; expected a list of treadle.Hook objects"),
    (dict(max_epochs=1, hooks=treadle.hooks.EMAHook()),
     r"hooks=EMAHook\(...\) is a single hook; expected a list of hooks, e.g. hooks=\[EMAHook"),
    (dict(max_epochs=1, hooks=dict(type="EarlyStoppingHook")), r"hooks=\{'type': 'EarlyStoppingHook'\} is a single hook config"),
    (dict(max_epochs=1, resume=None), r'resume: wrong type NoneType \(got None\); expected true, false, or a checkpoint path'),
    (dict(max_epochs=1, resume=""), r"resume=''; expected False, True"),
    (dict(max_epochs=1, resume=0), r'resume: wrong type int \(got 0\); expected true, false, or a checkpoint path'),
    (dict(max_epochs=1, log_writers=None),
     r'log_writers: wrong type NoneType \(got None\); expected a list of names among jsonl, csv, tensorboard, '
     r'mlflow, wandb, or '),
    (dict(max_epochs=1, log_writers="jsonl"),
     r"log_writers: wrong type str \(got 'jsonl'\); expected a list of names among jsonl, csv, tensorboard, "
     r"mlflow, wandb, or \{t"),
    (dict(max_epochs=1, log_writers=("jsonl", object())),
     r"log_writers\[1\]=<object object at .*> is neither a writer name nor a writer object; expected one of"),
    (dict(max_epochs=1, log_writers=["jsonl", "jsonll"]),
     r"log_writers\[1\]: not a supported value \(got 'jsonll'\); "
     r"expected one of 'jsonl', 'csv', 'tensorboard', 'mlflow', 'wandb'\. "),
    (dict(max_epochs=1, deterministic="false"), r"deterministic: wrong type str \(got 'false'\); expected true or false"),
    (dict(max_epochs=1, compile="no"), r"compile: wrong type str \(got 'no'\); expected true or false"),
    (dict(max_epochs=1, seed_per_rank="no"), r"seed_per_rank: wrong type str \(got 'no'\); expected true or false"),
    (dict(max_epochs=1, nan_guard=0),
     r"nan_guard: wrong type int \(got 0\); "
     r"expected 'raise', 'skip', false, or \{mode: raise\|skip, check_interval: N\}"),
    (dict(max_epochs=1, nan_guard=None),
     r"nan_guard: wrong type NoneType \(got None\); "
     r"expected 'raise', 'skip', false, or \{mode: raise\|skip, check_interval: N\}"),
    (dict(max_epochs=1, nan_guard=dict(check_interval=0)), r"nan_guard=\{'check_interval': 0\}: check_interval must be"),
    (dict(max_epochs=1, auto_scale_lr=dict(base_batch_size=4, enable="no")),
     r"auto_scale_lr enable must be True or False, got 'no'"),
    (dict(max_epochs=1, strategy=dict(devices=2)),
     r"strategy\.type: not a supported value \(got None\); expected one of 'auto', 'single', 'ddp', 'fsdp'"),
])
def test_bad_arguments_fail_before_training_with_clear_message(kwargs, match, tmp_path):
    args = dict(train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), work_dir=tmp_path / "run")
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        treadle.Trainer(TinyNet(), **args)
    assert not (tmp_path / "run").exists()  # nothing written


def test_batch_the_default_step_cannot_unpack_names_what_it_got():
    loader = [{"image": torch.randn(2, 6), "label": torch.tensor([0, 1])}]
    model = TinyNet()
    before = copy.deepcopy(model.state_dict())
    t = treadle.Trainer(model, train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1)
    with pytest.raises(TypeError,
                       match=r"cannot unpack the batch: got a dict with keys \['image', 'label'\]; expected \(inputs, targets\)"):
        t.fit()
    assert all(torch.equal(before[k], v.cpu()) for k, v in model.state_dict().items())  # nothing was trained


def test_dict_batches_with_inputs_and_targets():
    loader = [{"inputs": torch.randn(4, 6), "targets": torch.tensor([0, 1, 2, 0])}] * 3
    t = treadle.Trainer(TinyNet(), train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=2)
    t.fit()
    assert t.state.iter == 6 and t.state.epoch == 2


def test_optimizer_object_and_any_torch_optim_class():
    model = TinyNet()
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    t = treadle.Trainer(model, train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=opt, max_iters=1)
    assert t.optimizer is opt
    t2 = treadle.Trainer(TinyNet(), train_dataloader=[1], loss_fn=nn.CrossEntropyLoss(),
                         optimizer=dict(type="Adagrad", lr=0.5), max_iters=1)
    assert isinstance(t2.optimizer, torch.optim.Adagrad) and t2.optimizer.param_groups[0]["lr"] == 0.5


class _FailsAtIter(treadle.Hook):
    def after_train_iter(self, trainer, batch, outputs):
        raise RuntimeError("the run failed")


class _FailsAtRunEnd(treadle.Hook):
    def after_run(self, trainer):
        raise OSError("closing failed")


class _RunEnd(treadle.Hook):
    def __init__(self):
        self.called = False

    def after_run(self, trainer):
        self.called = True


def _trainer_with(*hooks):
    return treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                           optimizer=dict(type="SGD", lr=0.1), max_epochs=1, hooks=list(hooks), progress=False)


def test_an_after_run_failure_does_not_hide_the_error_of_the_run(caplog):
    last = _RunEnd()
    t = _trainer_with(_FailsAtIter(), _FailsAtRunEnd(), last)
    with caplog.at_level("ERROR", logger="treadle"), pytest.raises(RuntimeError, match="the run failed") as info:
        t.fit()
    assert info.value.__notes__ == ["_FailsAtRunEnd.after_run also failed: OSError: closing failed"]
    assert "_FailsAtRunEnd.after_run also failed: OSError: closing failed" in caplog.text
    assert last.called  # the other after_run hooks still ran (they close files, wait for saves)


def test_an_after_run_failure_is_raised_when_the_run_succeeded():
    last = _RunEnd()
    t = _trainer_with(_FailsAtRunEnd(), last)
    with pytest.raises(OSError, match="closing failed"):
        t.fit()
    assert last.called


def test_monitors_without_a_val_dataloader_are_warned_about_at_construction(caplog):
    args = dict(train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), max_epochs=1, progress=False)
    with caplog.at_level("WARNING", logger="treadle"):
        treadle.Trainer(TinyNet(), checkpoint=dict(best="val/acc"),
                        schedulers=[dict(type="ReduceOnPlateauLR", monitor="val/loss")], **args)
    assert ("ReduceOnPlateauLR monitor='val/loss', checkpoint best='val/acc' need validation results, but there is "
            "no val_dataloader, so they will never act") in caplog.text  # in hook priority order
    caplog.clear()
    with caplog.at_level("WARNING", logger="treadle"):
        treadle.Trainer(TinyNet(), checkpoint=dict(best="val/acc"), val_dataloader=DataLoader(make_data(4), batch_size=4),
                        metrics={"acc": treadle.Accuracy()}, **args)
        treadle.Trainer(TinyNet(), **args)
    assert "needs validation results" not in caplog.text


class _Moved(tuple):
    """A batch that went through the strategy's mover."""


class _TaggingMover(SingleDevice):
    """On the CPU, with a batch mover that tags what it moves (a CPU run has no mover):
    shows which steps get the moved batch, as they would on CUDA."""

    def __init__(self) -> None:
        super().__init__("cpu")

    def batch_mover(self):
        return lambda batch: _Moved(batch)


class _Records(TinyNet):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, type]] = []

    def train_step(self, batch, trainer):
        self.seen.append(("train_step", type(batch)))
        x, y = batch
        trainer.optim_wrapper.update(nn.functional.cross_entropy(self(x), y))

    def val_step(self, batch, trainer):
        self.seen.append(("val_step", type(batch)))


@pytest.mark.parametrize("move_batch", [True, False])
def test_custom_steps_get_the_batch_the_default_step_gets(move_batch):
    loader = DataLoader(make_data(8), batch_size=4)
    model = _Records()
    t = treadle.Trainer(model, train_dataloader=loader, val_dataloader=loader, optimizer=dict(type="SGD", lr=0.1),
                        max_iters=2, val_interval=2, strategy=_TaggingMover(), move_batch=move_batch, progress=False)
    t.fit()
    kind = _Moved if move_batch else list
    assert model.seen == [("train_step", kind)] * 2 + [("val_step", kind)] * 2

    seen = []

    class Own(treadle.Trainer):
        def train_step(self, batch):
            seen.append(type(batch))
            return {}

    Own(TinyNet(), train_dataloader=loader, optimizer=dict(type="SGD", lr=0.1), max_iters=2,
        strategy=_TaggingMover(), move_batch=move_batch, progress=False).fit()
    assert seen == [kind] * 2


@needs_cuda
def test_a_custom_step_gets_cuda_tensors_on_cuda():
    loader = DataLoader(make_data(8), batch_size=4, pin_memory=True)
    model = _Records()
    got = []
    model.train_step = lambda batch, trainer: got.append({t.device.type for t in batch})
    treadle.Trainer(model, train_dataloader=loader, optimizer=dict(type="SGD", lr=0.1), max_iters=1,
                    progress=False).fit()
    assert got == [{"cuda"}]
