"""More places for log records to go: CSV, TensorBoard, MLflow and Weights & Biases.

Every writer has the interface of :class:`treadle.logging.writers.JsonlWriter`::

    writer.write(record)   # one log.jsonl object: {"mode", "epoch", "iter", ...}
    writer.close()

They are called only at the log interval (records are plain Python values by
then), so none of them touches the device. The optional packages (tensorboard,
mlflow, wandb) are imported when a writer is built, never when treadle is.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from numbers import Real
from pathlib import Path
from typing import Any

# Record keys that say where a record belongs rather than what was measured.
_META_KEYS = ("mode", "iter")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric values of ``record`` keyed ``"{mode}/{key}"``.

    Keys that already start with the mode (``"val/acc"`` in a val record) keep their
    name, so the prefix is never doubled. ``mode`` and ``iter`` (the step) are left
    out, as are booleans, strings (including the ``"nan"`` strings of log.jsonl) and
    any other non-numeric value.
    """
    mode = str(record.get("mode", "train"))
    prefix = mode + "/"
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in _META_KEYS or isinstance(value, bool) or not isinstance(value, Real):
            continue
        tag = key if key.startswith(prefix) else prefix + key
        out[tag] = float(value)
    return out


def _step(record: dict[str, Any]) -> int:
    step = record.get("iter", 0)
    return int(step) if isinstance(step, Real) and not isinstance(step, bool) else 0


def _require(module: str, package: str, writer: str) -> Any:
    """Import an optional dependency or say which pip package provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{writer} needs the '{package}' package, which is not installed: "
                          f"pip install {package}") from e


# -- CSV ----------------------------------------------------------------------------
class CsvWriter:
    """One CSV file, one row per record, readable with ``csv.DictReader``.

    Design: a single file with the union of all columns (train and val rows share
    it; the ``mode`` column tells them apart, a value a record lacks is empty). When
    a record brings a key not yet in the header -- in practice only the first train
    and the first val record -- the file is rewritten once with the wider header
    (to a temporary file, then renamed, so a crash never leaves half a file);
    otherwise rows are appended and flushed. An existing file is appended to, its
    header adopted (the JSONL writer appends too, e.g. on resume).

    Lists and dicts are written as JSON; NaN/inf as ``nan``/``inf`` (``float()``
    reads them back).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields: list[str] = []
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, newline="", encoding="utf-8") as f:
                self.fields = next(csv.reader(f), [])
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=self.fields)

    def write(self, record: dict[str, Any]) -> None:
        row = {k: _cell(v) for k, v in record.items()}
        new = [k for k in row if k not in self.fields]
        if new:
            self._widen(self.fields + new)
        self._writer.writerow(row)
        self._file.flush()

    def _widen(self, fields: list[str]) -> None:
        """Rewrite the file under a header with more columns (old rows keep their values)."""
        self._file.close()
        rows: list[dict[str, str]] = []
        if self.fields:
            with open(self.path, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, self.path)
        self.fields = fields
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=fields)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf": float() parses them
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


# -- TensorBoard --------------------------------------------------------------------
class TensorBoardWriter:
    """Scalars into TensorBoard event files under ``log_dir``.

    Each numeric value becomes the scalar ``"{mode}/{key}"`` (see :func:`scalars`)
    at global step ``record["iter"]``. Needs the ``tensorboard`` package.
    """

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch raises this when tensorboard is missing
            raise ImportError("TensorBoardWriter needs the 'tensorboard' package, which is not installed: "
                              "pip install tensorboard") from e
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))
        self._closed = False

    def write(self, record: dict[str, Any]) -> None:
        # One event holding every scalar of the record: a tenth of the cost of one
        # add_scalar call per value, and the same data for TensorBoard's reader.
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(record).items()]
        if values:
            self._writer._get_file_writer().add_summary(Summary(value=values), global_step=_step(record))

    def close(self) -> None:
        if not self._closed:
            self._writer.flush()
            self._writer.close()
            self._closed = True


# -- MLflow -------------------------------------------------------------------------
class MlflowWriter:
    """Metrics into an MLflow run, offline by default.

    Args:
        run_dir: the training run's directory; unless ``tracking_uri`` is given the
            metrics go to a local MLflow file store in ``run_dir/mlruns`` (no server;
            ``mlflow ui --backend-store-uri <run_dir>/mlruns`` shows them).
        experiment: experiment name (created when missing).
        run_name: name of the MLflow run.
        tracking_uri: any MLflow tracking URI, e.g. ``http://host:5000``.
        params: hyperparameters to record once (values become strings).

    Uses an ``MlflowClient`` rather than ``mlflow.start_run`` so it leaves MLflow's
    global "active run" alone. Needs the ``mlflow`` package.
    """

    def __init__(self, run_dir: str | Path, experiment: str = "treadle", run_name: str | None = None,
                 tracking_uri: str | None = None, params: dict[str, Any] | None = None) -> None:
        _require("mlflow", "mlflow", "MlflowWriter")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric_cls = Metric
        if tracking_uri is None:
            store = Path(run_dir).resolve() / "mlruns"
            store.mkdir(parents=True, exist_ok=True)
            tracking_uri = store.as_uri()
        self.tracking_uri = tracking_uri
        self._client = MlflowClient(tracking_uri=tracking_uri)
        found = self._client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found is not None else self._client.create_experiment(experiment)
        self.run_id: str = self._client.create_run(exp_id, run_name=run_name).info.run_id
        if params:
            self._client.log_batch(self.run_id, params=[Param(str(k), str(v)) for k, v in params.items()])
        self._closed = False

    def write(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        if not values:
            return
        now, step = int(time.time() * 1000), _step(record)
        metrics = [self._metric_cls(key, value, now, step) for key, value in values.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        if not self._closed:
            self._client.set_terminated(self.run_id)
            self._closed = True


# -- Weights & Biases -----------------------------------------------------------------
class WandbWriter:
    """Metrics into a Weights & Biases run, offline by default.

    Args:
        run_dir: the training run's directory; wandb writes its files under it.
        project: wandb project name.
        name: run name.
        mode: "offline" (default: nothing leaves the machine; ``wandb sync`` uploads
            later), "online" or "disabled".
        config: hyperparameters for the run's config.
        **init_kwargs: anything else for ``wandb.init``.

    Steps are ``record["iter"]``; a val record logged at the iteration of the last
    train record joins that step. Needs the ``wandb`` package.
    """

    def __init__(self, run_dir: str | Path, project: str = "treadle", name: str | None = None,
                 mode: str = "offline", config: dict[str, Any] | None = None, **init_kwargs: Any) -> None:
        wandb = _require("wandb", "wandb", "WandbWriter")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, name=name, dir=str(run_dir), mode=mode, config=config, **init_kwargs)
        self._closed = False

    def write(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        if values:
            self._run.log(values, step=_step(record))

    def close(self) -> None:
        if not self._closed:
            self._run.finish()
            self._closed = True


__all__ = ["CsvWriter", "MlflowWriter", "TensorBoardWriter", "WandbWriter", "scalars"]
