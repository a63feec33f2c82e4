"""fp16 ``loss_scale`` (treadle/optim/loss_scale.py): a fixed scale as MMEngine's
``AmpOptimWrapper(loss_scale=512.)`` keeps it (``scaler.update(512.)`` after every step;
inf/NaN steps still skipped), GradScaler options as a dict, and their checks. Each run
is compared with the hand-written GradScaler loop it stands for, on the CPU (pinned:
``torch.amp.GradScaler("cpu")`` and CPU fp16 autocast)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, TinyNet, make_data
from treadle.openmmlab.translate import translate
from treadle.logging.writers import read_jsonl
from treadle.optim.loss_scale import check_loss_scale
from treadle.optim.wrapper import OptimWrapper, build_optim_wrapper
from treadle.seeding import seed_everything


class InfLossOnCall:
    """Cross-entropy, times inf on the ``bad``-th call (0-based): inf/NaN gradients."""

    def __init__(self, bad: int) -> None:
        self.bad, self.calls = bad, 0

    def __call__(self, out, y):
        loss = F.cross_entropy(out, y)
        if self.calls == self.bad:
            loss = loss * float("inf")
        self.calls += 1
        return loss


def _run(tmp_path, loss_scale):
    """A Trainer run and the hand-written loop with ``scaler``/``update_arg``."""
    data = make_data(40)
    torch.manual_seed(0)
    model = TinyNet()
    ref = copy.deepcopy(model)
    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=DataLoader(data, batch_size=8),
                        loss_fn=InfLossOnCall(bad=1), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                        precision="16", loss_scale=loss_scale, log_interval=1, seed=0, nan_guard=False,
                        strategy=ON_CPU, log_writers=("jsonl",))
    t.fit()
    records = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    return t, model, ref, data, records


def _reference(ref, data, scaler, update_arg):
    seed_everything(0)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = InfLossOnCall(bad=1)
    scales = []
    for x, y in DataLoader(data, batch_size=8, generator=torch.Generator()):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(ref(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update(update_arg)
        opt.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return scales


def _same_weights(model, ref):
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("loss_scale", [512.0, 512])
def test_fixed_scale_is_mmengines_static_scaling(tmp_path, loss_scale):
    """The scale stays 512 through an inf step, which is skipped (MMEngine's static
    scaling: GradScaler(init_scale=512.) and ``scaler.update(512.)`` after every step)."""
    t, model, ref, data, records = _run(tmp_path, loss_scale)
    scales = _reference(ref, data, torch.amp.GradScaler("cpu", init_scale=512.0), 512.0)
    _same_weights(model, ref)
    assert scales == [512.0] * 5
    assert [r["loss_scale"] for r in records] == scales
    assert [r["skipped_steps"] for r in records] == [0, 1, 1, 1, 1]
    assert (t.optim_wrapper.step_count, t.optim_wrapper.skipped_steps) == (4, 1)
    assert t.optim_wrapper.scaler.get_scale() == 512.0


def test_dict_is_grad_scalers_options(tmp_path):
    """A dict configures a dynamic GradScaler: halved by the inf step, doubled after
    every 2 clean ones (growth_interval=2) as the same GradScaler by hand."""
    options = dict(init_scale=512, growth_interval=2)
    t, model, ref, data, records = _run(tmp_path, options)
    scales = _reference(ref, data, torch.amp.GradScaler("cpu", **options), None)
    _same_weights(model, ref)
    assert scales == [512.0, 256.0, 256.0, 512.0, 512.0]
    assert [r["loss_scale"] for r in records] == scales
    assert t.optim_wrapper.skipped_steps == 1


def test_translated_amp_optim_wrapper_loss_scale():
    def ow(**kw):
        return translate({"optim_wrapper": {"type": "AmpOptimWrapper", "optimizer": {"type": "SGD", "lr": 0.1}, **kw}})

    assert ow(loss_scale=512.0)["loss_scale"] == 512.0
    assert ow(loss_scale={"init_scale": 512})["loss_scale"] == {"init_scale": 512}
    assert "loss_scale" not in ow(loss_scale="dynamic") and "loss_scale" not in ow()
    assert ow(loss_scale=512.0)["precision"] == "16"


def test_optim_wrapper_dict_takes_loss_scale():
    ow = build_optim_wrapper({"type": "AmpOptimWrapper", "optimizer": {"type": "SGD", "lr": 0.1},
                              "loss_scale": 128.0}, nn.Linear(2, 2))
    assert ow.loss_scale == 128.0 and ow.scaler.get_scale() == 128.0


@pytest.mark.parametrize("value, match", [
    ("static", r"loss_scale='static'; expected 'dynamic', a fixed scale \(a number > 0"),
    (0, r"loss_scale=0; expected 'dynamic'"),
    (float("inf"), r"loss_scale=inf; expected"),
    (True, r"loss_scale=True; expected"),
    ({"init_scale": 512, "enabled": False}, r"loss_scale has unknown keys \['enabled'\]; expected GradScaler options"),
    ({"init_scale": -1}, r"loss_scale init_scale=-1; expected a number > 0"),
    ({"growth_factor": 1.0}, r"loss_scale growth_factor=1.0; expected a number > 1"),
    ({"backoff_factor": 1.5}, r"loss_scale backoff_factor=1.5; expected a number in \(0, 1\)"),
    ({"growth_interval": 0}, r"loss_scale growth_interval=0; expected an int >= 1"),
])
def test_bad_loss_scale(value, match):
    with pytest.raises(ValueError, match=match):
        check_loss_scale(value)


def test_loss_scale_needs_fp16():
    with pytest.raises(ValueError, match=r"loss_scale=512.0 needs precision='16' .*precision='bf16' scales no loss"):
        treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                        precision="bf16", loss_scale=512.0, strategy=ON_CPU, log_writers=())
    with pytest.raises(ValueError, match=r"loss_scale=512.0 needs precision='16'"):
        OptimWrapper(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), loss_scale=512.0)
    with pytest.raises(ValueError, match=r"loss_scale: loss_scale='x'; expected 'dynamic'"):
        treadle.Trainer(TinyNet(), loss_scale="x")
