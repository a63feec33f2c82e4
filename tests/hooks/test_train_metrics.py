"""train_metrics=: values equal a hand computation over each log window (or epoch), no
host read per step, exact after a resume inside an interval, custom steps, config files."""

from __future__ import annotations


import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.logging import read_jsonl
from treadle.seeding import seed_everything
from treadle.hooks.train_metrics import TrainMetrics, TrainMetricsHook

from cli_support import TINY, run
from faults import Crash, CrashAt
from support import DEVICE, ON_CPU, TinyNet, count_host_reads, make_data


class Recorded:
    """A loss function that keeps every (outputs, targets) it is given: the same tensors
    the default step feeds to the train metrics, for the hand computation."""

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, outputs, targets):
        self.seen.append((outputs.detach().float().clone(), targets.clone()))
        return nn.functional.cross_entropy(outputs, targets)


class SampleCount:
    """A metric of the protocol with state_dict (not treadle's): samples seen since reset."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.n = torch.zeros((), dtype=torch.int64)

    def update(self, outputs, targets) -> None:
        self.n = self.n + targets.new_ones(()).mul(targets.shape[0])

    def compute(self):
        return self.n

    def state_dict(self):
        return {"n": self.n.clone()}

    def load_state_dict(self, state):
        self.n = state["n"].clone()


def hand_accuracy(seen) -> float:
    correct = sum(int((o.argmax(-1) == y).sum()) for o, y in seen)
    return correct / sum(y.numel() for _, y in seen)


def _trainer(work_dir=None, *, loss_fn=None, hooks=(), **kw):
    seed_everything(0)
    args = dict(work_dir=work_dir, train_dataloader=DataLoader(make_data(40), batch_size=4, shuffle=True),
                loss_fn=loss_fn or nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.2), max_epochs=2,
                seed=0, log_interval=3, train_metrics={"acc": treadle.Accuracy(), "n": SampleCount()},
                log_writers=("jsonl",), progress=False, hooks=list(hooks))
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def _train_records(work_dir):
    return [r for r in read_jsonl(work_dir / "log.jsonl") if r["mode"] == "train"]


# -- the values ---------------------------------------------------------------------------
@pytest.mark.parametrize("accumulate", [1, 2])
def test_each_record_is_the_accuracy_of_its_window_by_hand(tmp_path, accumulate):
    loss = Recorded()
    _trainer(tmp_path, loss_fn=loss, accumulate=accumulate).fit()
    records = _train_records(tmp_path)
    # epochs of 10 iterations, interval 3 inside the epoch: records at 3, 6, 9, 13, 16, 19, 20
    assert [r["iter"] for r in records] == [3, 6, 9, 13, 16, 19, 20]
    start = 0
    for r in records:
        window = loss.seen[start:r["iter"]]  # the iterations since the previous record, as the loss
        assert r["train/acc"] == hand_accuracy(window)
        assert r["train/n"] == 4 * len(window)
        start = r["iter"]


def test_reset_per_epoch_gives_the_running_value_over_the_epoch(tmp_path):
    loss = Recorded()
    _trainer(tmp_path, loss_fn=loss, train_metrics_reset="epoch").fit()
    for r in _train_records(tmp_path):
        epoch_start = (r["epoch"] - 1) * 10
        assert r["train/acc"] == hand_accuracy(loss.seen[epoch_start:r["iter"]])
        assert r["train/n"] == 4 * (r["iter"] - epoch_start)


def test_no_host_read_per_step(monkeypatch, as_device):
    # Reads: the store's one transfer and each metric's compute(), once per record.
    def reads(max_iters):
        batches = list(DataLoader(make_data(40), batch_size=4))  # a list: no DataLoader seed per epoch
        t = treadle.Trainer(TinyNet(), train_dataloader=batches, loss_fn=nn.CrossEntropyLoss(),
                            optimizer=dict(type="SGD", lr=0.05), max_iters=max_iters, log_interval=10,
                            train_metrics={"acc": treadle.Accuracy()}, progress=False)
        calls = count_host_reads(monkeypatch)
        bools = {"n": 0}
        original = torch.Tensor.__bool__

        def counted(self):
            bools["n"] += 1
            return original(self)
        monkeypatch.setattr(torch.Tensor, "__bool__", counted)
        t.fit()
        monkeypatch.setattr(torch.Tensor, "__bool__", original)
        return calls["item"] + calls["tolist"] + bools["n"]

    assert reads(20) == 2 * 2  # two records: the store's read and Accuracy.compute()'s
    assert reads(40) == 4 * 2  # twice the steps, twice the records: nothing per step


def test_without_train_metrics_nothing_is_added():
    t = _trainer(train_metrics=None)
    assert t.train_metrics is None
    assert not any(isinstance(h, TrainMetricsHook) for h in t.hooks)
    assert "train_metrics" not in t.checkpoint_states()[1]


def test_bf16_metrics_get_float32_outputs_outside_autocast(tmp_path):
    seen = []

    class Probe(SampleCount):
        def update(self, outputs, targets):
            seen.append((outputs.dtype, torch.is_autocast_enabled(DEVICE.type), outputs.requires_grad))
            super().update(outputs, targets)

    _trainer(tmp_path, precision="bf16", max_epochs=1, train_metrics={"p": Probe()}).fit()
    assert seen and set(seen) == {(torch.float32, False, False)}


def test_the_timed_step_feeds_them_too(tmp_path):
    loss = Recorded()
    _trainer(tmp_path, loss_fn=loss, timer_breakdown=True, max_epochs=1).fit()
    records = _train_records(tmp_path)
    assert records[0]["train/acc"] == hand_accuracy(loss.seen[:3]) and "time/loss" in records[0]


# -- resume -------------------------------------------------------------------------------
def _metric_values(work_dir):
    return [(r["iter"], r["train/acc"], r["train/n"]) for r in _train_records(work_dir)]


@pytest.mark.parametrize("reset", ["interval", "epoch"])
def test_a_run_resumed_inside_an_interval_logs_the_same_values(tmp_path, reset, monkeypatch):
    # Checkpoints every 5 iterations by iteration: at 5 the interval (records at 3, 6) and
    # the epoch (10 iterations) are both open; the crash comes at 7, after the record at 6.
    kw = dict(train_metrics_reset=reset, checkpoint=dict(interval=5, by_epoch=False, keep=10))
    _trainer(tmp_path / "whole", **kw).fit()
    expected = _metric_values(tmp_path / "whole")
    with pytest.raises(Crash):
        _trainer(tmp_path / "cut", hooks=[CrashAt(7)], **kw).fit()
    _trainer(tmp_path / "cut", resume=tmp_path / "cut" / "checkpoints" / "iter_00000005", **kw).fit()
    assert _metric_values(tmp_path / "cut") == expected

    # Negative control: the same resume without restoring the metrics' state differs.
    monkeypatch.setattr(TrainMetrics, "load_state_dict", lambda self, state: None)
    _trainer(tmp_path / "cut", resume=tmp_path / "cut" / "checkpoints" / "iter_00000005", **kw).fit()
    assert _metric_values(tmp_path / "cut") != expected


def test_a_metric_without_state_dict_is_named_once(caplog):
    class Plain:
        def update(self, outputs, targets): ...
        def compute(self): return 0.0
        def reset(self): ...

    with caplog.at_level("WARNING", logger="treadle"):
        _trainer(train_metrics={"plain": Plain()})
    assert any("train_metrics ['plain'] have no state_dict()" in r.getMessage() for r in caplog.records)


# -- custom steps --------------------------------------------------------------------------
class Stepping(TinyNet):
    """A model with its own train step that feeds the train metrics (or not)."""

    feed = True

    def train_step(self, batch, trainer):
        x, y = batch
        outputs = self(x)
        loss = nn.functional.cross_entropy(outputs, y)
        trainer.optim_wrapper.update(loss)
        if self.feed:
            trainer.update_train_metrics(outputs, y)
        return {"loss": loss.detach()}


def test_a_custom_step_feeds_them_with_update_train_metrics(tmp_path):
    _trainer(tmp_path / "default").fit()
    seed_everything(0)
    model = Stepping()
    treadle.Trainer(model, work_dir=tmp_path / "custom", train_dataloader=DataLoader(make_data(40), batch_size=4,
                    shuffle=True), optimizer=dict(type="SGD", lr=0.2), max_epochs=2, seed=0, log_interval=3,
                    train_metrics={"acc": treadle.Accuracy(), "n": SampleCount()}, log_writers=("jsonl",),
                    progress=False).fit()
    assert _metric_values(tmp_path / "custom") == _metric_values(tmp_path / "default")


def test_a_custom_step_that_does_not_feed_them_is_told(caplog):
    model = Stepping()
    model.feed = False
    t = treadle.Trainer(model, train_dataloader=DataLoader(make_data(8), batch_size=4), optimizer=dict(type="SGD", lr=0.1),
                        max_iters=2, train_metrics={"acc": treadle.Accuracy()}, progress=False)
    with caplog.at_level("WARNING", logger="treadle"):
        t.fit()
    assert any("trainer.update_train_metrics(outputs, targets)" in r.getMessage() for r in caplog.records)


def test_update_train_metrics_without_train_metrics_does_nothing():
    t = _trainer(train_metrics=None)
    t.update_train_metrics(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))


# -- errors ---------------------------------------------------------------------------------
def test_the_default_step_without_loss_fn_cannot_feed_them():
    class Lossy(TinyNet):
        def forward(self, batch):
            return nn.functional.cross_entropy(super().forward(batch[0]), batch[1])

    with pytest.raises(ValueError, match=r"train_metrics need the model's outputs.*trainer.update_train_metrics"):
        treadle.Trainer(Lossy(), train_dataloader=DataLoader(make_data(8), batch_size=4),
                        optimizer=dict(type="SGD", lr=0.1), max_iters=2, train_metrics={"acc": treadle.Accuracy()})


@pytest.mark.parametrize("kw,exc,match", [
    (dict(train_metrics={"acc": treadle.Accuracy}), TypeError, r"train_metrics\['acc'\]=Accuracy is a class"),
    (dict(train_metrics={"acc": object()}), TypeError, r"train_metrics\['acc'\] \(object\) lacks"),
    (dict(train_metrics=[treadle.Accuracy()]), TypeError, r"train_metrics"),
    (dict(train_metrics_reset="step"), ValueError, r"train_metrics_reset.*'interval'"),
])
def test_bad_arguments_are_named(kw, exc, match):
    with pytest.raises(exc, match=match):
        _trainer(**kw)


def test_a_metric_error_names_train_metrics():
    class Broken(SampleCount):
        def update(self, outputs, targets):
            raise RuntimeError("boom")

    t = _trainer(train_metrics={"bad": Broken()}, max_epochs=1)
    with pytest.raises(RuntimeError, match="boom") as info:
        t.fit()
    assert "train_metrics['bad'].update(outputs, targets) during the training step" in str(info.value.__notes__)


# -- config files ---------------------------------------------------------------------------
def test_a_config_file_builds_them(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY + "train_metrics: {acc: {type: Accuracy}, top2: {type: Accuracy, topk: 2}}\n"
                      "train_metrics_reset: epoch\n")
    rc, _, err = run(capsys, "train", config, "--work-dir", tmp_path / "run")
    assert rc == 0, err
    records = _train_records(tmp_path / "run")
    assert records and all(0 <= r["train/acc"] <= r["train/top2"] <= 1 for r in records)


@pytest.mark.parametrize("extra,match", [
    ("train_metrics: {acc: 3}\n", r"train_metrics\.acc"),
    ("train_metrics_reset: step\n", r"train_metrics_reset"),
    ("train_metrics: {acc: {type: Acuracy}}\n", r"train_metrics\.acc"),
])
def test_config_errors_name_the_key(tmp_path, capsys, extra, match):
    config = tmp_path / "bad.yaml"
    config.write_text(TINY + extra)
    rc, out, err = run(capsys, "train", config, "--work-dir", tmp_path / "run")
    assert rc != 0
    assert __import__("re").search(match, out + err), out + err


# -- torchmetrics ---------------------------------------------------------------------------
def test_a_torchmetrics_object_is_fed_logged_and_saved(tmp_path):
    torchmetrics = pytest.importorskip("torchmetrics", reason="torchmetrics is not installed in this environment")
    metric = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
    loss = Recorded()
    _trainer(tmp_path, loss_fn=loss, train_metrics={"acc": metric}).fit()
    start = 0
    for r in _train_records(tmp_path):
        assert r["train/acc"] == pytest.approx(hand_accuracy(loss.seen[start:r["iter"]]))
        start = r["iter"]
    assert "tp" in TrainMetrics({"acc": metric}).state_dict()["metrics"]["acc"]  # its states are saved


# -- several processes ----------------------------------------------------------------------
@pytest.mark.slow
def test_two_ranks_log_the_value_over_both_ranks(tmp_path):
    from pathlib import Path

    from support import run_ranks

    script = str(Path(__file__).parent.parent / "train_metrics_ranks.py")
    for rank, (code, output) in enumerate(run_ranks(script, [str(tmp_path / "ddp")])):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    seen = [torch.load(tmp_path / "ddp" / f"seen_rank{r}.pt", weights_only=True) for r in range(2)]
    records = _train_records(tmp_path / "ddp")
    assert [r["iter"] for r in records] == [2, 4, 6, 8, 10, 12]  # 6 iterations of 2 x 4 samples per epoch
    start, local_differs = 0, False
    for r in records:
        both = seen[0][start:r["iter"]] + seen[1][start:r["iter"]]
        assert r["train/acc"] == hand_accuracy(both)  # every rank's samples of the window
        local_differs |= r["train/acc"] != hand_accuracy(seen[0][start:r["iter"]])
        start = r["iter"]
    assert local_differs  # rank 0's own samples alone would give other values

    # One process with the doubled batch (the same samples per step) logs the same values; on
    # the CPU, as the ranks ran (gloo): the same arithmetic, so the same accuracies.
    import train_metrics_ranks

    train_metrics_ranks.build(str(tmp_path / "one"), 8, nn.CrossEntropyLoss(), strategy=ON_CPU).fit()
    assert [(r["iter"], r["train/acc"]) for r in _train_records(tmp_path / "one")] == \
        [(r["iter"], r["train/acc"]) for r in records]

    # Crashed after iteration 4, resumed from the checkpoint at 3 (inside the window 3-4):
    # each rank takes back its own counts, and the records equal the uninterrupted run's.
    assert all(code != 0 for code, _ in run_ranks(script, [str(tmp_path / "cut"), "crash"]))
    for rank, (code, output) in enumerate(run_ranks(script, [str(tmp_path / "cut"), "resume"])):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    assert [(r["iter"], r["train/acc"]) for r in _train_records(tmp_path / "cut")] == \
        [(r["iter"], r["train/acc"]) for r in records]


def test_a_module_metric_is_made_persistent():
    # torchmetrics keeps a Metric's states out of state_dict() until persistent(True);
    # a module shaped that way stands in for it when torchmetrics is not installed.
    class ModuleCount(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n = torch.zeros((), dtype=torch.int64)
            self.saved = False

        def persistent(self, mode: bool = False) -> None:
            self.saved = mode

        def state_dict(self, *args, **kwargs):
            return {"n": self.n} if self.saved else {}

        def load_state_dict(self, state, strict=True):
            self.n = state["n"]

        def update(self, outputs, targets):
            self.n += targets.numel()  # in place, as torchmetrics' states

        def compute(self):
            return self.n

        def reset(self):
            self.n.zero_()

    metric = ModuleCount()
    assert "n" not in metric.state_dict()
    owner = TrainMetrics({"count": metric})
    owner.update(torch.zeros(3, 2), torch.zeros(3))
    state = owner.state_dict()
    assert int(state["metrics"]["count"]["n"]) == 3
    owner.reset()
    owner.load_state_dict(state)
    assert owner.compute() == {"train/count": 3} and owner.updates == 1
