"""``log_processor`` as MMEngine means it: ``window_size`` smooths over that many values
whatever the log interval (values from before the previous record count), ``custom_cfg``
adds statistics over int, ``epoch`` and ``global`` windows, ``by_epoch`` shapes the line.

The expected numbers are MMEngine 0.10.7's (``files/mmengine_refs.json``, written by
``files/make_mmengine_refs.py``): a Runner whose loss is the batch's value, 7 values in
order, batch size 1, the LoggerHook interval and log_processor of each case, read from
its ``scalars.json``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import treadle
from treadle.components.errors import ConfigError
from treadle.openmmlab.translate import translate
from treadle.hooks.logger import LoggerHook
from mm_support import ValueLoss, loader
from support import ON_CPU, count_host_reads

REFS = json.loads((Path(__file__).parent / "files" / "mmengine_refs.json").read_text())
VALUES = [((i * 37) % 11) + 0.25 * i for i in range(7)]  # as the MMEngine run's data
CUSTOM = [dict(data_src="loss", log_name="loss_global", method_name="mean", window_size="global"),
          dict(data_src="loss", log_name="loss_epoch", method_name="mean", window_size="epoch"),
          dict(data_src="loss", log_name="loss_max", method_name="max", window_size=4),
          dict(data_src="loss", log_name="loss_cur", method_name="current")]
CASES = {
    "window5_interval1": dict(interval=1, train_cfg=dict(by_epoch=True, max_epochs=3),
                              log_processor=dict(window_size=5, by_epoch=True)),
    "window5_interval3": dict(interval=3, train_cfg=dict(by_epoch=True, max_epochs=3),
                              log_processor=dict(window_size=5, by_epoch=True)),
    "custom_interval2": dict(interval=2, train_cfg=dict(by_epoch=True, max_epochs=3),
                             log_processor=dict(window_size=3, by_epoch=True, custom_cfg=CUSTOM)),
    "iter_based_window4_interval3": dict(interval=3, train_cfg=dict(type="IterBasedTrainLoop", max_iters=17),
                                         log_processor=dict(window_size=4, by_epoch=False,
                                                            custom_cfg=[CUSTOM[0], CUSTOM[2]])),
}


def _train(tmp_path, case: dict) -> list[dict]:
    cfg = translate({"default_hooks": {"logger": {"type": "LoggerHook", "interval": case["interval"]}},
                     "log_processor": case["log_processor"], "train_cfg": case["train_cfg"],
                     "visualizer": {"type": "Visualizer", "vis_backends": [{"type": "LocalVisBackend"}]},
                     "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}}})
    cfg = {k: v for k, v in cfg.items() if k not in ("log_writers", "strategy", "checkpoint")}
    treadle.Trainer(ValueLoss(), work_dir=tmp_path, train_dataloader=loader(VALUES), strategy=ON_CPU, **cfg).fit()
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["mode"] == "train"]


@pytest.mark.parametrize("name", list(CASES))
def test_logged_values_equal_mmengines(tmp_path, name):
    records = {r["iter"]: r for r in _train(tmp_path, CASES[name])}
    expected = REFS[name]
    assert expected and {r["step"] for r in expected} <= set(records)  # treadle adds the run's last iteration
    for ref in expected:
        got = records[ref["step"]]
        for key, value in ref.items():
            if key != "step":
                assert got[key] == pytest.approx(value, rel=1e-12), (ref["step"], key)


def test_the_logger_interval_override_works_with_a_larger_window(tmp_path):
    """The issue's case: window_size 50 and the debug override interval=1 (refused before)."""
    cfg = translate({"default_hooks": {"logger": {"type": "LoggerHook", "interval": 1}},
                     "log_processor": {"type": "LogProcessor", "window_size": 50, "by_epoch": True}})
    (hook,) = [h for h in cfg["hooks"] if h["type"] == "LoggerHook"]
    assert hook["interval"] == 1 and hook["window"] == 50 and hook["by_epoch"] is True


def test_keys_out_of_mean_pattern_show_their_last_value(tmp_path):
    """MMEngine smooths only names matching its mean_pattern; others (here ``lr``-like
    ``value``) are logged as they are now."""
    hook = LoggerHook(interval=2, window=3, mean_keys="loss", writers=("jsonl",))

    class TwoOutputs(ValueLoss):
        def forward(self, x):
            loss = super().forward(x)
            return {"loss": loss, "value": x.mean()}

    treadle.Trainer(TwoOutputs(), work_dir=tmp_path, train_dataloader=loader(VALUES), max_epochs=1,
                    optimizer=dict(type="SGD", lr=0.1), hooks=[hook], strategy=ON_CPU).fit()
    records = [json.loads(r) for r in (tmp_path / "log.jsonl").read_text().splitlines()]
    by_iter = {r["iter"]: r for r in records if r["mode"] == "train"}
    assert by_iter[4]["value"] == VALUES[3] and by_iter[4]["loss"] == pytest.approx(sum(VALUES[1:4]) / 3)


def test_windows_read_the_device_once_per_record(tmp_path, monkeypatch, as_device):
    """The history is fed from the store's one transfer per record: no read per step."""
    reads = count_host_reads(monkeypatch)
    hook = LoggerHook(interval=7, window=50, statistics=[{"key": "loss", "method": "max", "window": "global"}],
                      writers=())
    treadle.Trainer(ValueLoss(), train_dataloader=loader(VALUES), max_epochs=2, optimizer=dict(type="SGD", lr=0.1),
                    hooks=[hook], strategy=ON_CPU, nan_guard=False).fit()
    # two records, one transfer each; the only item() calls are the DataLoader's seed draw, one per epoch
    assert reads["tolist"] == 2 and reads["item"] <= 2


def test_resume_logs_what_the_uninterrupted_run_logs(tmp_path):
    """The kept values are in the checkpoint: a run resumed in the middle smooths over the
    values from before the interruption."""
    def run(work, epochs, resume=False):
        hook = LoggerHook(interval=2, window=5, statistics=[{"key": "loss", "window": "global", "name": "g"}],
                          writers=("jsonl",))
        treadle.Trainer(ValueLoss(), work_dir=work, train_dataloader=loader(VALUES), max_epochs=epochs,
                        optimizer=dict(type="SGD", lr=0.1), hooks=[hook], strategy=ON_CPU, resume=resume,
                        checkpoint=dict(interval=1)).fit()
        return [json.loads(r) for r in (work / "log.jsonl").read_text().splitlines() if '"train"' in r]

    whole = [(r["iter"], r["loss"], r["g"]) for r in run(tmp_path / "a", 3) if r["iter"] > 7]
    run(tmp_path / "b", 1)  # its last record (iteration 7, the end of that run) stays in the file
    resumed = [(r["iter"], r["loss"], r["g"]) for r in run(tmp_path / "b", 3, resume=True) if r["iter"] > 7]
    assert resumed == whole and len(whole) == 7


def test_by_epoch_shapes_the_console_line(tmp_path, caplog):
    lines = {}
    for by_epoch in (True, False, None):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="treadle"):
            treadle.Trainer(ValueLoss(), train_dataloader=loader(VALUES), max_epochs=2,
                            optimizer=dict(type="SGD", lr=0.1), strategy=ON_CPU,
                            hooks=[LoggerHook(interval=3, window=3, by_epoch=by_epoch, writers=())]).fit()
        lines[by_epoch] = [r.getMessage() for r in caplog.records if "lr " in r.getMessage()][2]
    assert lines[True].startswith("epoch 2/2  batch 3/7  lr ")
    assert lines[False].startswith("iter 10/14  lr ")
    assert lines[None].startswith("epoch 2/2  iter 10/14  lr ")


@pytest.mark.parametrize("spec, message", [
    ({"window_size": 0}, "log_processor.window_size: not a window"),
    ({"custom_cfg": [{"data_src": "loss", "method_name": "median"}]},
     "log_processor.custom_cfg[0].method_name: no such statistic in treadle"),
    ({"custom_cfg": [{"data_src": "loss"}, {"data_src": "loss", "window_size": 4}]},
     "log_processor.custom_cfg: logs a name twice"),
    ({"log_with_hierarchy": True}, "log_processor.log_with_hierarchy"),
])
def test_what_treadle_cannot_do_is_refused_by_name(spec, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        translate({"log_processor": spec})
