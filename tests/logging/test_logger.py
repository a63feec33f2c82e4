"""Logged values equal the values computed, and logging reads them only at its interval."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.logging import MetricStore, read_jsonl
from treadle.logging import store as store_module

from support import count_host_reads, TinyNet, make_data


def test_store_flush_means_and_one_transfer():
    store = MetricStore()
    for v in (1.0, 2.0, 6.0):
        store.put("loss", torch.tensor(v))
    store.put_dict({"time": 0.5})
    store.put("time", 1.5)
    assert store.flush() == {"loss": 3.0, "time": 1.0}
    assert store.flush() == {} and store.latest["loss"] == 3.0


def test_store_flush_int_grad_and_mixed_shape_windows(monkeypatch, as_device):
    store = MetricStore()
    w = torch.tensor(2.0, requires_grad=True)
    for v in (1, 2):
        store.put("count", torch.tensor(v))  # integer tensors: a float mean, not a floor
        store.put("aux", w * v)  # not detached by a custom step
    store.put("shapes", torch.tensor(1.0))
    store.put("shapes", torch.tensor([4.0]))
    reads = count_host_reads(monkeypatch)
    out = store.flush()
    assert out == {"count": 1.5, "aux": 3.0, "shapes": 2.5}
    assert all(isinstance(v, float) for v in out.values())
    assert reads["item"] + reads["tolist"] == 1  # every window in one transfer
    store.put("loss", torch.tensor(0.5))
    assert store.flush() == {"loss": 0.5} and reads["item"] + reads["tolist"] == 2  # one 0-d read


def test_store_flush_reads_every_window_in_one_stack(monkeypatch, as_device):
    store = MetricStore()
    for v in (1.0, 2.0, 6.0):
        store.put("loss", torch.tensor(v))
        store.put("aux", torch.tensor(v, dtype=torch.float64) * 10)
    for v in ([1.0, 3.0], [5.0, 7.0]):  # vector values count by their mean
        store.put("vec", torch.tensor(v))
    store.put("time", 0.25)
    stacks = []
    stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda ts, *a, **k: stacks.append(len(ts)) or stack(ts, *a, **k))
    reads = count_host_reads(monkeypatch)
    assert store.flush() == {"loss": 3.0, "aux": 30.0, "vec": 4.0, "time": 0.25}
    assert reads["item"] + reads["tolist"] == 1
    for v in (1.0, 2.0, 6.0):
        store.put("loss", torch.tensor(v))
        store.put("aux", torch.tensor(v) * 10)
    stacks.clear()
    assert store.flush() == {"loss": 3.0, "aux": 30.0}
    assert stacks == [6] and reads["tolist"] == 2  # scalars: one stack of every value, one read


def test_store_flush_reads_host_values_one_by_one(monkeypatch):
    # CPU tensors need no transfer: each is read with item(), no stack (it runs cold at
    # each flush); the means are the same as on the device path.
    def fill(store):
        for v in (1, 2):
            store.put("count", torch.tensor(v))
            store.put("loss", torch.tensor(v * 1.5, dtype=torch.bfloat16))
        store.put("shapes", torch.tensor(1.0))
        store.put("shapes", torch.tensor([4.0]))
        store.put("time", 0.25)

    expected = {"count": 1.5, "loss": 2.25, "shapes": 2.5, "time": 0.25}
    stacks = []
    stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda ts, *a, **k: stacks.append(len(ts)) or stack(ts, *a, **k))
    reads = count_host_reads(monkeypatch)
    store = MetricStore()
    fill(store)
    out = store.flush()
    assert out == expected and all(type(v) is float for v in out.values())
    assert stacks == [] and reads == {"item": 6, "tolist": 0}
    store.put("vec", torch.tensor([1.0, 3.0]))  # a vector: read by its mean, as on a device
    store.put("vec", torch.tensor(6.0))
    assert store.flush() == {"vec": 4.0} and stacks
    monkeypatch.setattr(store_module, "_on_host", lambda values: False)  # the device path agrees
    fill(store)
    assert store.flush() == expected


def test_jsonl_records_equal_the_losses_computed(tmp_path):
    losses = []

    class Grab(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            losses.append(float(outputs["loss"]))

    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(24), batch_size=4),
                        val_dataloader=DataLoader(make_data(8, seed=3), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.05), max_epochs=2, log_interval=4, hooks=[Grab()])
    t.fit()
    records = read_jsonl(tmp_path / "log.jsonl")
    train = [r for r in records if r["mode"] == "train"]
    # 2 epochs of 6 iterations, interval 4 counted inside the epoch (MMEngine's rule), and the last iteration:
    # windows [0:4], [4:10], [10:12]
    assert [r["iter"] for r in train] == [4, 10, 12]
    assert [r["epoch"] for r in train] == [1, 2, 2]
    for r, w in zip(train, (losses[0:4], losses[4:10], losses[10:12])):
        assert r["loss"] == pytest.approx(sum(w) / len(w), rel=1e-6)
        assert r["lr"] == 0.05 and r["data_time"] >= 0 and r["step_time"] > 0 and "eta_s" in r
    val = [r for r in records if r["mode"] == "val"]
    assert [(r["epoch"], r["iter"]) for r in val] == [(1, 6), (2, 12)]
    assert val[-1]["val/loss"] == pytest.approx(t.state.metrics["val/loss"])
    text = (tmp_path / "log.txt").read_text()
    assert "epoch 2/2  iter 12/12" in text and "val (epoch 2, iter 12)" in text


def test_logging_does_not_read_device_values_between_intervals(monkeypatch, as_device):
    # A list of batches, not a DataLoader: the DataLoader itself draws a (CPU) seed per epoch.
    batches = list(DataLoader(make_data(40), batch_size=4))
    t = treadle.Trainer(TinyNet(), train_dataloader=batches, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.05), max_iters=20, log_interval=10)
    calls = count_host_reads(monkeypatch)
    t.fit()
    # per log interval one transfer, shared by the logger and the NaN guard; none per step
    assert calls == {"item": 0, "tolist": 2}


@pytest.mark.parametrize("writers,exc,match", [
    ("jsonl", TypeError, r"LoggerHook writers='jsonl'; expected a list of writers such as \['jsonl'\]"),
    (None, TypeError, r"LoggerHook writers=None; expected a list"),
    (["jsonl", object()], TypeError, r"LoggerHook writers\[1\]=<object object at .*> is neither a writer name nor a "
                                     r"writer object; expected one of \['csv', 'jsonl', 'mlflow', 'tensorboard', "
                                     r"'wandb'\], a dict \{type: name, option: value\}, or an object with "
                                     r"write\(record\) and close\(\)"),
    (["tensorbord"], ValueError, r"LoggerHook writers\[0\]='tensorbord' is not a known log writer"),
    ([{"type": "mlflow", "experiment": "x", "tags": {}}], ValueError,
     r"LoggerHook writers\[0\]: bad options \['experiment', 'tags'\] for the mlflow writer .*; expected some of "
     r"\['experiment', 'run_name', 'tracking_uri', 'params'\]"),
    ([{"type": "csv", "path": "x.csv"}], ValueError,
     r"bad options \['path'\] for the csv writer \(multiple values for argument 'path'\)"),
])
def test_bad_writers_are_refused_at_construction(writers, exc, match):
    from treadle.hooks.logger import LoggerHook

    with pytest.raises(exc, match=match):
        LoggerHook(writers=writers)


class _Writer:
    def __init__(self, fail_write=False, fail_close=False):
        self.fail_write, self.fail_close, self.records = fail_write, fail_close, []

    def write(self, record):
        if self.fail_write:
            raise OSError("write failed: disk full")
        self.records.append(record)

    def close(self):
        if self.fail_close:
            raise OSError("close failed")


def _fit_with(writers, tmp_path):
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(8), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=2, log_interval=1,
                        log_writers=writers, progress=False)
    t.fit()


def test_a_writers_close_error_does_not_hide_its_write_error(tmp_path, caplog):
    broken, fine = _Writer(fail_write=True, fail_close=True), _Writer()
    with caplog.at_level("ERROR", logger="treadle"), pytest.raises(OSError, match="write failed: disk full") as info:
        _fit_with([broken, fine], tmp_path)
    assert not getattr(info.value, "__notes__", None)  # the logger itself kept the first error: no later one to note
    assert "log writer _Writer: close() failed after its write() had failed: OSError: close failed" in caplog.text


def test_a_close_error_of_a_writer_that_wrote_is_raised(tmp_path):
    writer = _Writer(fail_close=True)
    with pytest.raises(OSError, match="close failed"):
        _fit_with([writer], tmp_path)
    assert len(writer.records) == 2


# (iterations an epoch, epochs, interval, ignore_last) -> the iterations MMEngine 0.10.7's LoggerHook logs
# (checked by calling its after_train_iter); treadle also logs the run's last iteration (marked +).
MMENGINE_RULE = [
    ((3, 3, 5, True), [3, 6, 9]),                      # an interval longer than an epoch: every epoch's end
    ((4, 3, 4, True), [4, 8, 12]),
    ((5, 3, 2, True), [2, 4, 7, 9, 12, 14] + [15]),    # counted inside the epoch; leftovers ignored, but the last +
    ((5, 3, 2, False), [2, 4, 5, 7, 9, 10, 12, 14, 15]),
    ((6, 2, 4, True), [4, 10] + [12]),
    ((7, 2, 3, False), [3, 6, 7, 10, 13, 14]),
]


@pytest.mark.parametrize("shape, logged", MMENGINE_RULE)
def test_train_records_follow_mmengine_logger_rule(tmp_path, shape, logged):
    per_epoch, epochs, interval, ignore_last = shape
    batches = list(DataLoader(make_data(4 * per_epoch), batch_size=4))
    hook = treadle.hooks.LoggerHook(interval=interval, writers=("jsonl",), ignore_last=ignore_last)
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=batches, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.05), max_epochs=epochs, hooks=[hook], progress=False)
    t.fit()
    assert [r["iter"] for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"] == logged


def test_iteration_based_records_count_over_the_run(tmp_path):
    batches = list(DataLoader(make_data(20), batch_size=4))  # 5 batches a pass
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=batches, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.05), max_iters=14, log_interval=3, log_writers=("jsonl",),
                        progress=False)
    t.fit()
    assert [r["iter"] for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"] == [3, 6, 9, 12, 14]


def test_ignore_last_must_be_a_bool():
    with pytest.raises(TypeError, match="ignore_last must be true or false, got 1"):
        treadle.hooks.LoggerHook(ignore_last=1)


def test_writer_specs_with_options_are_built_in_the_run_directory(tmp_path):
    from treadle.logging.backends import CsvWriter
    from treadle.logging.specs import build_writer

    csv = build_writer({"type": "csv", "flush_secs": 0.5}, tmp_path)
    assert isinstance(csv, CsvWriter) and csv.path == tmp_path / "log.csv"


def test_mlflow_spec_with_options_is_built_in_the_run_directory(tmp_path):
    pytest.importorskip("mlflow")  # the trackers extra (treadle[trackers]); `make test` installs it
    from treadle.logging.specs import build_writer
    from treadle.logging.trackers import MlflowWriter

    mlflow = build_writer({"type": "mlflow", "experiment": "exp", "run_name": "r1"}, tmp_path)
    assert isinstance(mlflow, MlflowWriter) and (mlflow.experiment, mlflow.run_name) == ("exp", "r1")
    assert mlflow.tracking_uri.endswith("/mlruns") or "MLFLOW_TRACKING_URI" in __import__("os").environ


def test_wandb_spec_with_options_is_built_in_the_run_directory(tmp_path):
    pytest.importorskip("wandb")  # the trackers extra, as above
    from treadle.logging.specs import build_writer
    from treadle.logging.trackers import WandbWriter

    wandb = build_writer({"type": "wandb", "project": "p", "entity": "team"}, tmp_path)
    assert isinstance(wandb, WandbWriter) and wandb.project == "p" and wandb.init_kwargs["entity"] == "team"


def _mmengine_due(state, interval, ignore_last):
    """MMEngine's LoggerHook rule, written out: is the running iteration's record due?"""
    per_epoch = state.iters_per_epoch
    if state.max_iters and state.iter + 1 == state.max_iters:
        return True
    if not state.by_epoch or not per_epoch:
        return (state.iter + 1) % interval == 0
    k = state.inner_iter + 1
    return k % interval == 0 or (k == per_epoch and (not ignore_last or per_epoch <= interval))


@pytest.mark.parametrize("by_epoch", [True, False])
@pytest.mark.parametrize("ignore_last", [True, False])
def test_next_train_iter_names_the_iterations_the_mmengine_rule_logs(by_epoch, ignore_last):
    from treadle.hooks.state import TrainState

    for interval in (1, 2, 3, 5, 7):
        for per_epoch in (1, 3, 5, 6, None):
            hook = treadle.hooks.LoggerHook(interval=interval, writers=(), ignore_last=ignore_last)
            epochs = 4
            max_iters = epochs * per_epoch if per_epoch else 17
            for start in range(max_iters):  # the loop may ask at any iteration of an epoch
                s = TrainState(by_epoch=by_epoch, max_iters=max_iters, iters_per_epoch=per_epoch, iter=start,
                               inner_iter=start % per_epoch if per_epoch else start)
                answer = hook.next_train_iter(s)
                # the first due iteration from `start`, inside the running epoch (epoch-based)
                epoch_end = (start // per_epoch + 1) * per_epoch if by_epoch and per_epoch else max_iters
                expected = None
                for i in range(start, epoch_end):
                    s.iter, s.inner_iter = i, (i % per_epoch if per_epoch else i)
                    if _mmengine_due(s, interval, ignore_last):
                        expected = i
                        break
                if expected is None:  # none left in this epoch: any answer past its end
                    assert answer >= epoch_end, (interval, per_epoch, start, answer)
                else:
                    assert answer == expected, (interval, per_epoch, start, answer, expected)


class _Sleepy(torch.utils.data.Dataset):
    """Takes 4 ms per batch of 4 samples to load."""

    def __init__(self):
        self.data = make_data(16)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        if i % 4 == 0:
            import time
            time.sleep(0.004)
        return self.data[i]


class _SlowHook(treadle.Hook):
    """An after_train_iter hook that takes 6 ms, which step_time must include."""

    priority = "LOWEST"

    def after_train_iter(self, trainer, batch, outputs):
        import time
        time.sleep(0.006)


def test_times_are_the_loops_iterations_hooks_included(tmp_path):
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(_Sleepy(), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.05), max_epochs=3,
                        log_interval=2, log_writers=("jsonl",), hooks=[_SlowHook()], progress=False)
    t.fit()
    train = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert len(train) == 6
    for r in train:
        assert r["data_time"] >= 0.004, r  # the batch's loading
        # the iteration's hooks, a later one's included (it ends after its record is written)
        assert r["step_time"] >= 0.006, r


def test_store_joins_the_loops_step_and_time_records():
    store = MetricStore()
    assert store.recorders() == (None, None)  # nobody reads them: the loop records nothing
    store.record_outputs = store.record_times = True
    record_step, record_time = store.recorders()
    record_step((0, 0, {"loss": torch.tensor(1.0), "acc": 0.5}))
    store.put("extra", 3.0)
    record_step((1, 0, {"loss": torch.tensor(3.0), "acc": 0.7}))
    record_time((0.25, 1.0))
    record_time((0.75, 2.0))
    assert [r[0] for r in store.pending_steps()] == [0, 1]
    assert store.window("loss") == [torch.tensor(1.0), torch.tensor(3.0)]
    state = store.state_dict()  # a checkpoint holds the steps' values too
    assert state["tensors"] == {"loss": [1.0, 3.0]} and state["numbers"]["step_time"] == [1.0, 2.0]
    record_step((2, 1, {"loss": torch.tensor(5.0), "acc": 0.9}))  # after a read: joined once, in order
    assert store.flush() == {"loss": 3.0, "acc": pytest.approx(0.7), "extra": 3.0, "data_time": 0.5,
                             "step_time": 1.5}
    assert [r[0] for r in store.flushed_steps] == [0, 1, 2] and store.pending_steps() == []
    record_step((3, 1, {"loss": torch.tensor(7.0)}))  # the same appends go on after a flush
    assert store.flush() == {"loss": 7.0}


def test_store_joins_steps_whose_keys_differ_in_order():
    store = MetricStore()
    store.record_outputs = True
    record_step, _ = store.recorders()
    record_step((0, 0, {"loss": 1.0}))
    record_step((1, 0, {"loss": 2.0, "aux": 5.0}))  # a key the first step did not return
    record_step((2, 0, {"aux": 7.0}))  # and one without the first's key
    assert store.window("loss") == [1.0, 2.0] and store.window("aux") == [5.0, 7.0]


def test_store_names_a_step_that_returned_no_dict():
    store = MetricStore()
    store.record_outputs = True
    record_step, _ = store.recorders()
    record_step((0, 0, {"loss": 1.0}))
    record_step((1, 0, torch.tensor([1.0, 2.0])))  # a custom step's raw tensor
    with pytest.raises(TypeError, match="train step of iteration 2 returned a Tensor; expected a dict"):
        store.flush()
