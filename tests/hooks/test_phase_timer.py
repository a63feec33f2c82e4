"""timer_breakdown: per-phase times of the default step, logged at the interval, same weights."""

from __future__ import annotations

import copy
import logging
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, TinyNet, count_host_reads, make_data
from treadle.logging import read_jsonl
from treadle.engine.step import make_train_step
from treadle.hooks.phase_timer import PHASES, PhaseTimer, PhaseTimerHook

KEYS = [f"time/{p}" for p in PHASES] + ["time/hooks"]


def _trainer(tmp_path=None, model=None, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(train_dataloader=DataLoader(make_data(32), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=2, log_interval=4, seed=seed,
                log_writers=["jsonl"], checkpoint=False)
    args.update(kw)
    return treadle.Trainer(model if model is not None else TinyNet(), work_dir=tmp_path, **args)


def test_records_hold_phase_times_that_add_up_to_the_iteration(tmp_path):
    # On the CPU: there the phases are host times that add up to step_time; on CUDA they are
    # device times (CUDA events) and time/hooks is clamped at 0 (treadle/hooks/phase_timer.py).
    _trainer(tmp_path, timer_breakdown=True, strategy=ON_CPU).fit()
    train = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert [r["iter"] for r in train] == [4, 8, 12, 16]
    for r in train:
        assert all(r[k] >= 0 for k in KEYS), r
        parts = sum(r[k] for k in KEYS) + r["data_time"]
        assert parts == pytest.approx(r["data_time"] + r["step_time"], rel=1e-6, abs=1e-9)


def test_a_slow_forward_shows_in_time_forward(tmp_path):
    class Slow(TinyNet):
        def forward(self, x):
            time.sleep(0.02)
            return super().forward(x)

    _trainer(tmp_path, model=Slow(), max_epochs=None, max_iters=3, log_interval=3, timer_breakdown=True).fit()
    (r,) = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert r["time/forward"] >= 0.02
    assert r["time/loss"] < 0.02 and r["time/backward"] < 0.02 and r["time/optimizer"] < 0.02


@pytest.mark.parametrize("kw", [
    {},
    dict(accumulate=3, clip_grad=dict(max_norm=0.5)),
    dict(precision="bf16"),
    dict(max_epochs=None, max_iters=10, accumulate=4),
])
def test_weights_equal_with_and_without_breakdown(kw):
    models = []
    for on in (False, True):
        t = _trainer(timer_breakdown=on, **kw)
        t.fit()
        models.append(t.module)
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()):
        assert torch.equal(a, b)


def test_model_returning_loss_dict_is_timed(tmp_path):
    class WithLoss(TinyNet):
        def forward(self, batch):
            x, y = batch
            return {"loss_ce": nn.functional.cross_entropy(super().forward(x), y), "acc": torch.tensor(0.5)}

    _trainer(tmp_path, model=WithLoss(), loss_fn=None, timer_breakdown=True).fit()
    train = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert all(k in r and r[k] >= 0 for r in train for k in KEYS)


def test_off_by_default_and_no_timer_in_the_default_step(tmp_path):
    t = _trainer(tmp_path)
    assert t._phase_timer is None and not any(isinstance(h, PhaseTimerHook) for h in t.hooks)
    t.fit()
    assert not any(k.startswith("time/") for r in read_jsonl(tmp_path / "log.jsonl") for k in r)


def test_mark_callback_is_installed_once(tmp_path):
    t = _trainer(tmp_path, timer_breakdown=True)
    t.register_hook(treadle.Hook())  # rebuilds the dispatch and the step
    t.register_hook(treadle.Hook())
    assert t.optim_wrapper.after_backward_callbacks.count(t._phase_timer.mark) == 1


def test_breakdown_reads_no_device_values_per_step(monkeypatch, as_device):
    batches = list(DataLoader(make_data(40), batch_size=4))
    t = treadle.Trainer(TinyNet(), train_dataloader=batches, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.05), max_iters=20, log_interval=10, timer_breakdown=True)
    calls = count_host_reads(monkeypatch)
    t.fit()
    assert calls == {"item": 0, "tolist": 2}  # as without the breakdown: one read per interval (logger, shared by the NaN guard)


def test_custom_train_step_warns_once(tmp_path, caplog):
    class Custom(TinyNet):
        def train_step(self, batch, trainer):
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            trainer.optim_wrapper.update(loss)
            return {"loss": loss.detach()}

    with caplog.at_level(logging.WARNING, logger="treadle"):
        _trainer(tmp_path, model=Custom(), timer_breakdown=True).fit()
    assert sum("took no phase marks" in r.message for r in caplog.records) == 1
    assert not any(k.startswith("time/") for r in read_jsonl(tmp_path / "log.jsonl") for k in r)


def test_timer_breakdown_must_be_a_bool():
    with pytest.raises(TypeError, match="timer_breakdown: wrong type str"):
        _trainer(timer_breakdown="yes")


def test_phase_timer_drops_unfinished_iterations():
    timer = PhaseTimer("cpu")
    timer.begin()
    for _ in range(3):
        timer.mark()
    timer.end()
    timer.begin()  # a step that failed half-way
    timer.mark()
    timer.end()
    out = timer.drain()
    assert list(out) == list(PHASES) and all(len(v) == 1 and v[0] >= 0 for v in out.values())
    assert timer.drain() == {p: [] for p in PHASES}


def test_timed_and_untimed_steps_are_one_function_with_marks_attached():
    """One step function (no timed copy); without a timer it holds no marks and no
    phase is recorded; with one, the same code computes bit-identical weights."""
    torch.manual_seed(0)
    reference = TinyNet()
    models = [copy.deepcopy(reference) for _ in range(2)]
    wrappers = [treadle.Trainer(m, optimizer=dict(type="SGD", lr=0.1), strategy=ON_CPU).optim_wrapper
                for m in models]  # on the CPU: the test is about the step, not the device
    timer = PhaseTimer()
    plain = make_train_step(models[0], nn.CrossEntropyLoss(), wrappers[0], None)
    wrappers[1].after_backward_callbacks = (timer.mark,)  # as the Trainer attaches it
    timed = make_train_step(models[1], nn.CrossEntropyLoss(), wrappers[1], None, timer=timer)
    assert plain.__code__ is timed.__code__
    marks = {c.cell_contents for c in plain.__closure__ if callable(c.cell_contents)}
    assert not any(getattr(m, "__self__", None) is not None and isinstance(m.__self__, PhaseTimer) for m in marks)
    batch = (torch.randn(8, 6), torch.randint(0, 3, (8,)))
    for _ in range(3):
        plain(batch)
        timed(batch)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    assert all(len(v) == 3 for v in timer.drain().values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_time_the_device(tmp_path):
    class Heavy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2048, 2048)

        def forward(self, x):
            for _ in range(50):
                x = torch.tanh(self.fc(x))
            return x[:, :3]

    data = torch.utils.data.TensorDataset(torch.randn(64, 2048), torch.randint(0, 3, (64,)))
    t = treadle.Trainer(Heavy(), work_dir=tmp_path, train_dataloader=DataLoader(data, batch_size=16),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.01), max_iters=8,
                        log_interval=4, timer_breakdown=True, log_writers=["jsonl"], checkpoint=False)
    assert t._phase_timer.cuda
    t.fit()
    train = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert len(train) == 2 and all(r[k] >= 0 for r in train for k in KEYS)
    assert all(r["time/forward"] > r["time/loss"] for r in train)


def test_drain_can_keep_the_running_iteration_for_the_next_one():
    timer = PhaseTimer("cpu")
    for _ in range(3):
        timer.begin()
        for _ in PHASES[1:]:
            timer.mark()
        timer.end()
    first = timer.drain(keep_last=1)
    assert all(len(v) == 2 for v in first.values())
    assert all(len(v) == 1 for v in timer.drain().values())  # the kept one, once
    assert timer.drain() == {p: [] for p in PHASES}
