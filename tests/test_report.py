"""make_report: plots and a summary with the right best/final numbers, for one and two runs."""

from __future__ import annotations

import json

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.hooks.logger import format_value
from treadle.logging import read_jsonl
from treadle.report import best_and_final, epoch_times, make_report

from support import TinyNet, make_data

pytest.importorskip("matplotlib")

PNGS = ("loss.png", "metrics.png", "throughput.png")  # a constant lr: said in words, no lr.png


def write_log(run_dir, records):
    run_dir.mkdir(parents=True)
    with open(run_dir / "log.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def train(epoch, it, loss, lr=0.1):
    return {"mode": "train", "epoch": epoch, "iter": it, "lr": lr, "loss": loss, "data_time": 0.1, "step_time": 0.4}


def val(epoch, it, acc, loss):
    return {"mode": "val", "epoch": epoch, "iter": it, "val/acc": acc, "val/loss": loss}


RUN_A = [train(1, 2, 2.0), train(1, 4, 1.5), val(1, 4, 0.5, 1.0),
         train(2, 6, 1.2), train(2, 8, 1.0), val(2, 8, 0.7, 0.8),
         train(3, 10, 0.9), train(3, 11, 0.8), val(3, 11, 0.6, 0.9)]


def assert_pngs(out, names=PNGS):
    """Exactly these images are written and embedded in summary.md, each a real PNG."""
    assert sorted(p.name for p in out.glob("*.png")) == sorted(names)
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, name
    embedded = [ln for ln in (out / "summary.md").read_text().splitlines() if ln.startswith("![")]
    assert embedded == [f"![{n[:-4]}]({n})" for n in ("loss.png", "train_metrics.png", "lr.png", "metrics.png",
                                                       "throughput.png") if n in names]


def metric_row(text, section, metric):
    part = text.split(f"## {section}")[1].split("\n## ")[0]
    line = next(ln for ln in part.splitlines() if ln.startswith(f"| {metric} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_one_run_best_final_and_times(tmp_path):
    write_log(tmp_path / "a", RUN_A)
    summary = make_report([tmp_path / "a"], tmp_path / "out")
    assert summary == tmp_path / "out" / "summary.md"
    assert_pngs(tmp_path / "out")
    text = summary.read_text()
    assert metric_row(text, "a", "val/acc") == ["val/acc", "0.7000", "0.6000", "epoch 2, iter 8"]  # best = max
    assert metric_row(text, "a", "val/loss") == ["val/loss", "0.8000", "0.9000", "epoch 2, iter 8"]  # best = min
    # estimate: each record covers (iter - previous iter) x 0.5 s; epoch 3 has 3 iterations
    assert epoch_times(RUN_A)[:2] == ({1: 2.0, 2: 2.0, 3: 1.5}, 5.5)
    assert "total time: 5.5 s (estimated" in text and "mean 1.8 s" in text
    assert "iterations: 11, epochs: 3" in text and "final train loss: 0.8000" in text
    assert "- learning rate: 1.00e-01 throughout" in text


def test_two_runs_one_without_validation_and_with_timestamps(tmp_path):
    write_log(tmp_path / "a", RUN_A)
    b = [dict(train(1, 5, 3.0), timestamp=100.0), dict(train(1, 10, 2.0), timestamp=104.0),
         dict(train(2, 15, 1.0), timestamp=110.0)]
    write_log(tmp_path / "b", b)
    text = make_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out").read_text()
    assert_pngs(tmp_path / "out")  # b has no validation: a's panels only
    assert "Runs: a, b" in text and metric_row(text, "a", "val/acc")[1:3] == ["0.7000", "0.6000"]
    part_b = text.split("## b")[1]
    assert "No validation records." in part_b
    assert "total time: 10.0 s (timestamps)" in part_b and "epoch 1: 4.0 s, epoch 2: 6.0 s" in part_b


def test_real_run_and_nan_values(tmp_path):
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path / "run", train_dataloader=DataLoader(make_data(16), batch_size=4),
                        val_dataloader=DataLoader(make_data(8, seed=1), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=3, log_interval=2,
                        metrics={"acc": treadle.Accuracy()})
    t.fit()
    with open(tmp_path / "run" / "log.jsonl", "a") as f:  # a later NaN: final, never best
        f.write(json.dumps({"mode": "val", "epoch": 4, "iter": 16, "val/loss": "nan", "val/acc": 0.0}) + "\n")
    vals = [r for r in read_jsonl(tmp_path / "run" / "log.jsonl") if r["mode"] == "val"]
    text = make_report([tmp_path / "run"], tmp_path / "out").read_text()
    assert_pngs(tmp_path / "out")
    assert "- learning rate: 1.00e-01 throughout" in text
    best_loss = min(r["val/loss"] for r in vals[:-1])
    assert metric_row(text, "run", "val/loss")[1:3] == [format_value("val/loss", best_loss), "nan"]
    assert metric_row(text, "run", "val/acc")[1:3] == [format_value("val/acc", max(r["val/acc"] for r in vals)), "0.000"]


def errors(epoch, it, mae, mystery):
    return {"mode": "val", "epoch": epoch, "iter": it, "val/mae": mae, "val/mystery": mystery}


RUN_MAE = [train(1, 2, 2.0), errors(1, 2, 0.9, 5.0), train(2, 4, 1.0), errors(2, 4, 0.3, 7.0),
           train(3, 6, 0.9), errors(3, 6, 0.5, 6.0)]


def test_error_metric_best_is_the_minimum(tmp_path):
    write_log(tmp_path / "a", RUN_MAE)
    text = make_report([tmp_path / "a"], tmp_path / "out").read_text()
    assert metric_row(text, "a", "val/mae") == ["val/mae", "0.3000", "0.5000", "epoch 2, iter 4"]
    assert best_and_final(RUN_MAE, "val/mae")[0] == 0.3


def test_a_name_that_does_not_say_gets_no_best_and_a_note(tmp_path):
    write_log(tmp_path / "a", RUN_MAE)
    text = make_report([tmp_path / "a"], tmp_path / "out").read_text()
    assert metric_row(text, "a", "val/mystery") == ["val/mystery", "n/a", "6.000", "n/a"]
    assert "- val/mystery: no best, its name does not say whether higher or lower is better" in text
    assert "val/mae:" not in text  # the name says: no note
    assert best_and_final(RUN_MAE, "val/mystery") == (None, 6.0, None)
    assert best_and_final(RUN_MAE, "val/mystery", higher=True)[0] == 7.0


@pytest.mark.parametrize("rule,best,at", [("max", "7.000", "epoch 2, iter 4"), ("min", "5.000", "epoch 1, iter 2")])
def test_the_runs_checkpoint_rule_decides(tmp_path, rule, best, at):
    write_log(tmp_path / "a", RUN_MAE)
    (tmp_path / "a" / "config.yaml").write_text(f"# resolved by treadle\nmax_epochs: 3\n"
                                                 f"checkpoint:\n  best: val/mystery\n  rule: {rule}\n")
    text = make_report([tmp_path / "a"], tmp_path / "out").read_text()
    assert metric_row(text, "a", "val/mystery") == ["val/mystery", best, "6.000", at]
    word = "maximum" if rule == "max" else "minimum"
    assert f"- val/mystery: best is the {word}, as the checkpoint rule in config.yaml says" in text
    assert metric_row(text, "a", "val/mae")[1] == "0.3000"


def test_an_unreadable_config_is_no_rule(tmp_path):
    write_log(tmp_path / "a", RUN_MAE)
    (tmp_path / "a" / "config.yaml").write_text("checkpoint: [unclosed\n")
    text = make_report([tmp_path / "a"], tmp_path / "out").read_text()
    assert metric_row(text, "a", "val/mystery")[1] == "n/a"


@pytest.mark.parametrize("name", ["val/loss", "val/mae", "val/top1_err", "val/acc", "val/mAP", "val/f1"])
def test_report_ranks_as_best_checkpoints_and_early_stopping_do(name):
    records = [{"mode": "val", "epoch": e, "iter": e, name: v} for e, v in enumerate([0.5, 0.2, 0.9], 1)]
    higher = CheckpointHook(best=name).rule == "max"
    assert (EarlyStoppingHook(monitor=name).rule == "greater") is higher
    assert best_and_final(records, name)[0] == (0.9 if higher else 0.2)


def test_duplicate_names_get_their_parent(tmp_path):
    write_log(tmp_path / "x" / "run", RUN_A)
    write_log(tmp_path / "y" / "run", RUN_A[:3])
    text = make_report([tmp_path / "x" / "run", tmp_path / "y" / "run"], tmp_path / "out").read_text()
    assert "## x/run" in text and "## y/run" in text


def test_missing_log_names_the_path(tmp_path):
    write_log(tmp_path / "a", RUN_A)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "empty" / "log.jsonl")):
        make_report([tmp_path / "a", tmp_path / "empty"], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written before every run was found


def test_a_run_keeps_its_colour_in_every_panel_and_its_best_is_starred(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    figures = {}
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: (figures.__setitem__(path.name, fig),
                                                                     save(fig, path, **kw)))
    only_loss = [{k: v for k, v in r.items() if k != "val/acc"} for r in RUN_A]
    write_log(tmp_path / "a", only_loss)  # first run: no val/acc panel line
    write_log(tmp_path / "b", RUN_MAE + [val(1, 2, 0.4, 1.1), val(2, 4, 0.8, 0.7), val(3, 6, 0.6, 0.9)])
    make_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    colours = {}
    for ax in figures["metrics.png"].axes:
        if not ax.get_visible():
            continue
        metric = ax.get_title().split(" ")[0]
        lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
        for label, line in lines.items():
            colours.setdefault(label, set()).add(line.get_color())
        stars = [ln for ln in ax.get_lines() if ln.get_marker() == "*"]
        if metric in ("val/acc", "val/loss", "val/mae"):
            assert ax.get_title().endswith("best)")
            best = {"val/acc": 0.8, "val/loss": 0.7, "val/mae": 0.3}[metric]
            assert any(list(s.get_ydata()) == [best] for s in stars), (metric, [s.get_ydata() for s in stars])
        if metric == "val/loss":
            assert sorted(list(s.get_ydata()) for s in stars) == [[0.7], [0.8]]  # each run's own minimum
        if metric == "val/mystery":
            assert not stars  # no rule for it: no best marked
    assert colours["a"] == {"C0"} and colours["b"] == {"C1"}
    for name in ("loss.png", "throughput.png"):
        by_label = {ln.get_label().split(" ")[0]: ln.get_color() for ln in figures[name].axes[0].get_lines()}
        assert by_label.get("b") == "C1", name


def test_every_logged_loss_and_every_train_metric_gets_a_panel(tmp_path, monkeypatch):
    """A GAN logs loss_disc/loss_gen and no "loss"; fp16's loss_scale is not a loss;
    train/* metrics have their own image."""
    from matplotlib.figure import Figure

    from treadle.report import IMAGES, is_loss_key

    figures = {}
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: (figures.__setitem__(path.name, fig),
                                                                     save(fig, path, **kw)))
    gan = [{"mode": "train", "epoch": 1, "iter": i, "lr": 0.1, "loss_disc": 1.0 / i, "loss_gen": 2.0 / i,
            "recon_loss": 0.5, "loss_scale": 65536.0, "train/acc": 0.1 * i} for i in (1, 2, 3)]
    write_log(tmp_path / "gan", gan)
    summary = make_report([tmp_path / "gan"], tmp_path / "out")
    titles = [ax.get_title() for ax in figures["loss.png"].axes if ax.get_visible()]
    assert titles == ["train loss_disc", "train loss_gen", "train recon_loss"]
    gen = next(ax for ax in figures["loss.png"].axes if ax.get_title() == "train loss_gen")
    assert list(gen.get_lines()[0].get_ydata()) == [2.0, 1.0, 2.0 / 3]
    metrics = [ax for ax in figures["train_metrics.png"].axes if ax.get_visible()]
    assert [ax.get_title() for ax in metrics] == ["train/acc"]
    assert list(metrics[0].get_lines()[0].get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    assert_pngs(tmp_path / "out", ("loss.png", "train_metrics.png"))  # no timing, no validation, a constant lr
    assert IMAGES == ("loss", "train_metrics", "lr", "metrics", "throughput")
    assert "- learning rate: 1.00e-01 throughout" in summary.read_text()
    assert [k for k in ("loss", "loss_gen", "gen_loss", "loss_scale", "loss_scale/gen", "val/acc") if is_loss_key(k)] \
        == ["loss", "loss_gen", "gen_loss"]


def test_the_total_loss_comes_first_and_no_train_metrics_draws_no_panel(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    figures = {}
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: (figures.__setitem__(path.name, fig),
                                                                     save(fig, path, **kw)))
    write_log(tmp_path / "a", [{"mode": "train", "epoch": 1, "iter": 1, "loss_cls": 1.0, "loss": 1.5}])
    make_report([tmp_path / "a"], tmp_path / "out")
    assert [ax.get_title() for ax in figures["loss.png"].axes if ax.get_visible()] == ["train loss", "train loss_cls"]
    assert list(figures) == ["loss.png"]  # no empty placeholder for what was not logged
    assert_pngs(tmp_path / "out", ("loss.png",))


def test_a_changing_lr_is_drawn_and_a_constant_one_said_in_words(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    figures = {}
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: (figures.__setitem__(path.name, fig),
                                                                     save(fig, path, **kw)))
    # a: two optimizers, one scheduled; b: a constant lr logged as float noise would show it
    write_log(tmp_path / "a", [dict(train(1, i, 1.0 / i), **{"lr/gen": 0.1 / i, "lr/disc": 0.001}) for i in (1, 2, 3)])
    write_log(tmp_path / "b", [train(1, i, 1.0 / i, lr=0.001 * (1 + 1e-12 * i)) for i in (1, 2, 3)])
    text = make_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out").read_text()
    lines = figures["lr.png"].axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["a lr/gen"]  # the changing one alone
    assert list(lines[0].get_ydata()) == pytest.approx([0.1, 0.05, 0.1 / 3])
    part_a, part_b = text.split("## a")[1].split("## b")
    assert "- learning rate disc: 1.00e-03 throughout" in part_a and "gen" not in part_a.split("learning rate")[1]
    assert "- learning rate: 1.00e-03 throughout" in part_b
    assert "- learning rate: 1.00e-01 throughout" in part_a  # "lr" of train(): also constant


def test_the_pause_before_a_resume_is_no_epochs_time(tmp_path):
    """Killed after iteration 4 (epoch 2), resumed an hour later: the resumed fit's first
    record says when it started; the epoch's time is its training, not the pause."""
    records = [dict(train(1, 2, 2.0), timestamp=1000.0), dict(train(1, 4, 1.5), timestamp=1010.0),
               dict(train(2, 6, 1.2), timestamp=1020.0),
               dict(train(2, 8, 1.0), timestamp=4630.0, resumed_at=4625.0),  # 1 h later; 5 s of training
               dict(train(2, 10, 0.9), timestamp=4640.0)]
    times, total, how = epoch_times(records)
    assert times == {1: 10.0, 2: 25.0} and total == 35.0
    assert how == "timestamps; 1 pause(s) before a resume left out"
    write_log(tmp_path / "a", records)
    text = make_report([tmp_path / "a"], tmp_path / "out").read_text()
    assert "total time: 35.0 s (timestamps; 1 pause(s) before a resume left out)" in text
    assert "epoch 1: 10.0 s, epoch 2: 25.0 s" in text


def test_a_real_resumed_run_marks_its_first_record(tmp_path, caplog):
    def trainer(resume, max_epochs):
        return treadle.Trainer(TinyNet(), work_dir=tmp_path / "run", train_dataloader=DataLoader(make_data(16), batch_size=4),
                               loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=max_epochs,
                               log_interval=2, resume=resume, progress=False, log_writers=["jsonl"])

    trainer(False, 1).fit()
    with caplog.at_level("INFO", logger="treadle"):
        trainer(True, 2).fit()
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("epoch 2/2") for m in messages)
    records = read_jsonl(tmp_path / "run" / "log.jsonl")
    marked = [r for r in records if "resumed_at" in r]
    assert len(marked) == 1 and marked[0] is records[2]  # the first record the resumed fit wrote
    assert records[1]["timestamp"] <= marked[0]["resumed_at"] <= marked[0]["timestamp"]
    assert not [m for m in messages if "resumed_at" in m]  # bookkeeping: not on the console
    text = make_report([tmp_path / "run"], tmp_path / "out").read_text()
    assert text.count("- resumed once: ") == 1
    assert f"(its first record: epoch {marked[0]['epoch']}, iter {marked[0]['iter']})" in text


def test_values_are_printed_as_the_console_prints_them(tmp_path):
    records = [train(1, 2, 2.0123456), train(1, 4, 0.049823456, lr=0.002),
               val(1, 4, 0.98765432, 0.052087654)]
    write_log(tmp_path / "a", records)
    text = make_report([tmp_path / "a"], tmp_path / "out").read_text()
    assert "final train loss: 0.04982" in text and format_value("loss", 0.049823456) == "0.04982"
    assert metric_row(text, "a", "val/acc")[1:3] == ["0.9877", "0.9877"]
    assert metric_row(text, "a", "val/loss")[1:3] == ["0.05209", "0.05209"]
    assert "resumed" not in text
