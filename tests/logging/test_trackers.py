"""MLflow and W&B writers against the real packages, offline: what they stored reads back as log.jsonl.

Skipped when mlflow / wandb are not installed (the default install has neither):
``pip install mlflow-skinny wandb``. Nothing here touches the network: MLflow writes
a local file store, wandb runs offline with its directories and credentials pointed
into tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.logging import read_jsonl
from treadle.logging.trackers import MlflowWriter, WandbWriter, _mlflow_key, _wandb_default_mode

from faults import CrashAt
from support import TinyNet, make_data


def _trainer(work, writer, hooks=()):
    """Two epochs of 4 iterations, a record every 2, validation per epoch; two param groups (lr, lr/pg1)."""
    return treadle.Trainer(TinyNet(), work_dir=work, train_dataloader=DataLoader(make_data(16), batch_size=4),
                           val_dataloader=DataLoader(make_data(8, seed=1), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                           optimizer=dict(type="SGD", lr=0.1, paramwise=dict(custom_keys={"fc2": dict(lr_mult=0.1)})),
                           max_epochs=2, log_interval=2, metrics={"acc": treadle.Accuracy()},
                           log_writers=("jsonl", writer), hooks=list(hooks), progress=False)


def _raise(error: BaseException) -> CrashAt:
    """Raises ``error`` after iteration 3, i.e. after the first record (iteration 2) was written."""
    return CrashAt(3, error)


def _split(records):
    train = [r for r in records if r["mode"] == "train"]
    val = [r for r in records if r["mode"] == "val"]
    assert len(train) == 4 and len(val) + len(train) == len(records)
    return train, val


# -- MLflow -------------------------------------------------------------------------
@pytest.fixture
def mlflow_env(monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # records its absence: the writer's setdefault is undone
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def _history(client, run_id, key):
    metrics = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return [(m.step, m.value, m.timestamp) for m in metrics]


def test_mlflow_run_reads_back_as_log_jsonl(tmp_path, mlflow_env):
    from mlflow.tracking import MlflowClient

    work = tmp_path / "run"
    params = {"optimizer": {"type": "SGD", "lr": 0.1}, "max_epochs": 2, "schedulers": [{"type": "StepLR", "step_size": 1}]}
    writer = MlflowWriter(work, experiment="treadle-test", run_name="tiny", params=params)
    assert writer.tracking_uri == (work / "mlruns").resolve().as_uri() and writer.run_id is None
    trainer = _trainer(work, writer)
    trainer.fit()
    trainer.validate()  # after close(): the same run again
    train, val = _split(read_jsonl(work / "log.jsonl"))
    assert len(val) == 3  # two during fit(), one from validate()

    client = MlflowClient(tracking_uri=writer.tracking_uri)
    run = client.get_run(writer.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny"
    assert client.get_experiment(run.info.experiment_id).name == "treadle-test"
    assert run.data.params == {"optimizer.type": "SGD", "optimizer.lr": "0.1", "max_epochs": "2",
                               "schedulers.0.type": "StepLR", "schedulers.0.step_size": "1"}
    keys = set(run.data.metrics)
    assert {"loss", "lr", "lr.pg1", "epoch", "data_time", "step_time", "val/loss", "val/acc"} <= keys
    assert not keys & {"mode", "iter", "timestamp", "val/epoch", "val/iter"}
    # One point per record, at step = iter, with the record's timestamp and exactly its value.
    for key, name, recs in (("loss", "loss", train), ("lr/pg1", "lr.pg1", train), ("epoch", "epoch", train),
                            ("val/acc", "val/acc", val), ("val/loss", "val/loss", val)):
        expected = [(r["iter"], float(r[key]), int(r["timestamp"] * 1000)) for r in recs]
        assert _history(client, writer.run_id, name) == expected, key


def test_mlflow_names_never_collide_in_the_file_store():
    assert _mlflow_key("lr/pg1") == "lr.pg1" and _mlflow_key("lr/gen/pg1") == "lr.gen.pg1"
    assert _mlflow_key("val/acc/top1") == "val/acc.top1" and _mlflow_key("loss/cls") == "loss.cls"
    assert _mlflow_key("val/acc@1") == "val/acc_1" and _mlflow_key("time/forward") == "time.forward"


@pytest.mark.parametrize("error,status", [(RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_mlflow_run_of_a_failed_fit_is_marked_failed(tmp_path, mlflow_env, error, status):
    from mlflow.tracking import MlflowClient

    writer = MlflowWriter(tmp_path)
    with pytest.raises(type(error)):
        _trainer(tmp_path, writer, hooks=[_raise(error)]).fit()
    client = MlflowClient(tracking_uri=writer.tracking_uri)
    assert client.get_run(writer.run_id).info.status == status
    (first,) = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert _history(client, writer.run_id, "loss") == [(2, first["loss"], int(first["timestamp"] * 1000))]


def test_mlflow_run_starts_with_the_first_record_and_follows_the_env_uri(tmp_path, mlflow_env, monkeypatch):
    from mlflow.tracking import MlflowClient

    idle = MlflowWriter(tmp_path / "idle")  # e.g. a rank > 0: never written to
    idle.write({"mode": "val", "epoch": 1, "iter": 1, "timestamp": 1.0, "note": "no metrics"})
    idle.close()
    assert idle.run_id is None and not (tmp_path / "idle").exists()

    uri = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    w = MlflowWriter(tmp_path / "run")
    w.write({"mode": "train", "epoch": 1, "iter": 5, "timestamp": 2.5, "loss": float("nan"), "grad_norm": 3})
    w.close()
    w.close()  # idempotent
    assert w.tracking_uri == uri and (tmp_path / "elsewhere").is_dir() and not (tmp_path / "run").exists()
    (loss,) = MlflowClient(tracking_uri=uri).get_metric_history(w.run_id, "loss")
    assert loss.step == 5 and loss.timestamp == 2500 and loss.value != loss.value  # NaN kept


# -- Weights & Biases -----------------------------------------------------------------
@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No credentials, wandb's own directories under tmp_path; a server address that
    refuses connections, so even a wrong "online" could only fail locally."""
    wandb = pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_DIR", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # does not exist
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    wandb.teardown()  # settings are read once per process: start from this environment
    yield wandb
    wandb.teardown()


def _inspect(run_dir, *args):
    """``wandb leet inspect --json``: wandb's own reader of the run's .wandb log."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", *args, str(run_dir)],
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    return out.stdout


def _summary(run_dir):
    """The run's state, config and last values (one JSON object)."""
    return json.loads(_inspect(run_dir, "--summary"))


def _wandb_history(run_dir):
    """{step: the values logged at that step} from the .wandb log."""
    rows: dict[int, dict] = {}
    for line in _inspect(run_dir).splitlines():  # one record per line
        rec = json.loads(line)
        if rec["type"] == "history":
            item = rec["history"]["item"]
            rows.setdefault(item["_step"], {}).update({k: v for k, v in item.items() if not k.startswith("_")})
    return rows


def test_wandb_mode_is_offline_without_credentials(tmp_path, wandb_env, monkeypatch):
    assert _wandb_default_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert _wandb_default_mode() is None  # wandb follows WANDB_MODE
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert _wandb_default_mode() is None  # online
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / "netrc").write_text(f"machine 127.0.0.1:9\n  login user\n  password {'k' * 40}\n")  # `wandb login`
    assert _wandb_default_mode() is None


def test_wandb_offline_run_reads_back_as_log_jsonl(tmp_path, wandb_env):
    work = tmp_path / "run"
    writer = WandbWriter(work, project="treadle-test", name="tiny", config={"optimizer": {"type": "SGD", "lr": 0.1}})
    assert writer.run is None
    trainer = _trainer(work, writer)
    trainer.fit()
    assert writer.run is None  # finished
    (fit_dir,) = (work / "wandb").glob("offline-run-*")
    assert [p.name for p in fit_dir.glob("*.wandb")] == [f"run-{writer.run_id}.wandb"]
    trainer.validate()  # after close(): the same run id, resumed (a second offline segment)
    (val_dir,) = set((work / "wandb").glob("offline-run-*")) - {fit_dir}
    assert _summary(val_dir)["run_id"] == writer.run_id
    train, val = _split(read_jsonl(work / "log.jsonl"))

    # Every value at step = iter, exactly log.jsonl's; the val record of iteration 8 joins that step.
    rows = _wandb_history(fit_dir)
    assert sorted(rows) == [2, 4, 6, 8]
    for r in train:
        assert {k: rows[r["iter"]][k] for k in ("loss", "lr", "lr/pg1", "epoch")} == \
            {k: r[k] for k in ("loss", "lr", "lr/pg1", "epoch")}
        assert "iter" not in rows[r["iter"]] and "timestamp" not in rows[r["iter"]]
    for r in val[:2]:
        assert {k: rows[r["iter"]][k] for k in ("val/acc", "val/loss")} == {k: r[k] for k in ("val/acc", "val/loss")}
        assert "val/epoch" not in rows[r["iter"]]
    assert _wandb_history(val_dir) == {8: {"val/acc": val[2]["val/acc"], "val/loss": val[2]["val/loss"]}}

    summary = _summary(fit_dir)
    assert (summary["run_id"], summary["project"], summary["name"]) == (writer.run_id, "treadle-test", "tiny")
    assert summary["state"] == "finished" and summary["exit_code"] == 0
    assert summary["config"] == {"optimizer": {"type": "SGD", "lr": 0.1}}
    assert summary["summary"]["loss"] == train[-1]["loss"] and summary["summary"]["val/acc"] == val[1]["val/acc"]


def test_wandb_run_of_a_failed_fit_exits_nonzero(tmp_path, wandb_env):
    writer = WandbWriter(tmp_path, project="treadle-test")
    with pytest.raises(RuntimeError, match="boom"):
        _trainer(tmp_path, writer, hooks=[_raise(RuntimeError("boom"))]).fit()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    summary = _summary(run_dir)
    assert summary["exit_code"] == 1 and summary["state"] == "failed"
    (first,) = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert _wandb_history(run_dir)[2]["loss"] == first["loss"]


def test_wandb_run_starts_with_the_first_record(tmp_path, wandb_env):
    idle = WandbWriter(tmp_path / "idle")  # e.g. a rank > 0: never written to
    idle.close()
    assert idle.run is None and idle.run_id is None and not (tmp_path / "idle").exists()
