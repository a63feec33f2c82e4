"""Experiment trackers as log writers: MLflow and Weights & Biases.

Same interface as the file writers (:mod:`treadle.logging.backends`)::

    writer.write(record)   # one log.jsonl object: {"mode", "epoch", "iter", ...}
    writer.close()

Each run starts with the first record, so a run that fails before logging anything
leaves no empty run behind. The packages are imported when a writer is built, never
when treadle is.
"""

from __future__ import annotations

import os
import time
from numbers import Real
from pathlib import Path
from typing import Any

from treadle.logging.writers import _require, _step


def _tracker_values(record: dict[str, Any]) -> dict[str, float]:
    """The numeric values of ``record`` for MLflow and W&B, under their log.jsonl names.

    A train record's values keep their names (``loss``, ``lr``, ``epoch``, ...). A val
    or test record's metrics are already named ``val/...`` or ``test/...`` (any other
    key gets that prefix); its ``epoch`` is left out (the train records carry it).
    ``mode``, ``iter`` (the step), ``timestamp`` and ``resumed_at`` are never values;
    booleans and non-numbers are skipped; NaN and inf are kept.
    """
    mode = str(record.get("mode", "train"))
    prefix = mode + "/"
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("mode", "iter", "timestamp", "resumed_at") or isinstance(value, bool) or not isinstance(value, Real):
            continue
        if mode == "train" or key.startswith(prefix):
            out[key] = float(value)
        elif key != "epoch":
            out[prefix + key] = float(value)
    return out


def _propagating_error() -> BaseException | None:
    """The exception propagating while close() runs (the hook's ``finally``), if any.

    ``SystemExit(0)`` does not count.
    """
    import sys

    error = sys.exc_info()[1]
    return None if isinstance(error, SystemExit) and error.code in (None, 0) else error


def _mlflow_key(name: str) -> str:
    """An MLflow metric or param name for ``name``.

    MLflow's file store keeps each metric in a file named after it, so a name cannot
    also be a folder: ``lr`` and ``lr/pg1`` (two param groups) or ``loss`` and
    ``loss/cls`` would collide. Every ``/`` but a ``val/``, ``test/`` or ``train/``
    prefix becomes ``.`` (``lr.pg1``, ``time.forward``, ``val/acc.top1``), the same
    on every backend; characters MLflow refuses become ``_``.
    """
    import re

    head, slash, rest = name.partition("/")
    key = f"{head}/{rest.replace('/', '.')}" if slash and head in ("train", "val", "test") else name.replace("/", ".")
    return re.sub(r"[^\w.\- /]", "_", key)[:250]


def _flat_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts (and lists of dicts, e.g. schedulers) as ``a.b.0.c`` keys; values as strings."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat_params(value, name + "."))
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
            out.update(_flat_params({str(i): v for i, v in enumerate(value)}, name + "."))
        else:
            out[_mlflow_key(name)] = str(value)[:6000]  # MLflow's limit for a param value
    return out


def _is_local_file_uri(uri: str) -> bool:
    from urllib.parse import urlparse

    return urlparse(uri).scheme in ("", "file")


class MlflowWriter:
    """Metrics into an MLflow run, in a local file store unless told otherwise.

    Args:
        run_dir: the training run's directory (usually the trainer's ``work_dir``).
            Without ``tracking_uri`` and without ``MLFLOW_TRACKING_URI`` in the
            environment, the run goes to the file store ``file:<run_dir>/mlruns``:
            no server, nothing leaves the machine.
        experiment: experiment name (created when missing).
        run_name: name of the MLflow run.
        tracking_uri: any MLflow tracking URI (``http://host:5000``, ``sqlite:///x.db``).
        params: hyperparameters recorded once, e.g. the resolved config; nested dicts
            become ``optimizer.lr``-style keys, values strings.

    Metric names and steps: the train records' numeric values under their own names
    (``loss``, ``lr``, ``epoch``, ...), val/test metrics under theirs (``val/acc``),
    at step ``record["iter"]``, with the record's timestamp. A ``/`` inside a name
    becomes ``.`` (``lr.pg1``, ``time.forward``): see :func:`_mlflow_key`.

    The run starts with the first record, so a writer built on every rank of a
    distributed job only ever creates a run on rank 0 (the only one that writes);
    ``run_id`` is None until then. :meth:`close` ends the run: ``FINISHED``, or
    ``FAILED`` (``KILLED`` on Ctrl-C) when training raised. A record after
    :meth:`close` (``trainer.validate()`` after ``fit()``) reopens the same run.

    Since MLflow 3 the file store needs ``MLFLOW_ALLOW_FILE_STORE=true``; for a
    ``file:`` URI the writer sets it in this process when it is unset (set it too for
    ``mlflow ui --backend-store-uri file:<run_dir>/mlruns`` or an ``MlflowClient`` in
    another process). Uses an ``MlflowClient`` rather than ``mlflow.start_run``, so
    it leaves MLflow's global "active run" alone. Needs ``mlflow`` or ``mlflow-skinny``.
    """

    def __init__(self, run_dir: str | Path, experiment: str = "treadle", run_name: str | None = None,
                 tracking_uri: str | None = None, params: dict[str, Any] | None = None) -> None:
        _require("mlflow", "mlflow", "MlflowWriter")
        if tracking_uri is None:
            tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or (Path(run_dir).resolve() / "mlruns").as_uri()
        self.tracking_uri: str = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.params = _flat_params(dict(params)) if params else {}
        self.run_id: str | None = None
        self._client: Any = None
        self._open = False

    def _start(self) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        if self._client is None:
            if _is_local_file_uri(self.tracking_uri):
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.x refuses it otherwise
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        if self.run_id is None:
            self.run_id = self._client.create_run(self._experiment_id(), run_name=self.run_name).info.run_id
            params = [Param(k, v) for k, v in self.params.items()]
            for i in range(0, len(params), 100):  # MLflow's limit per batch
                self._client.log_batch(self.run_id, params=params[i:i + 100])
        else:
            self._client.update_run(self.run_id, status="RUNNING")
        self._open = True

    def _experiment_id(self) -> str:
        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(self.experiment)
        except Exception:  # another process created it in between
            found = self._client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def write(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        values = _tracker_values(record)
        if not values:
            return
        if not self._open:
            self._start()
        stamp = record.get("timestamp")
        ms = int(stamp * 1000) if isinstance(stamp, Real) and not isinstance(stamp, bool) else int(time.time() * 1000)
        step = _step(record)
        metrics = [Metric(_mlflow_key(k), v, ms, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self) -> None:
        """End the run (idempotent): FINISHED, or FAILED/KILLED while an exception propagates."""
        if not self._open:
            return
        self._open = False
        error = _propagating_error()
        status = "FINISHED" if error is None else "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        self._client.set_terminated(self.run_id, status=status)


# -- Weights & Biases -----------------------------------------------------------------
def _wandb_default_mode() -> str | None:
    """``wandb.init``'s mode when the writer is given none.

    None (wandb decides: WANDB_MODE, else "online") when W&B is configured here:
    WANDB_MODE set, or credentials in WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE,
    ``.netrc`` (``wandb login``) or wandb's settings. "offline" otherwise, so a
    machine without credentials never tries the network.
    """
    if any(os.environ.get(v) for v in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE")):
        return None
    try:  # wandb's own lookup (its internals: a failure means "no key")
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth

        settings = wandb_setup.singleton().settings
        if settings.api_key or wbauth.read_netrc_auth(host=settings.base_url):
            return None
    except Exception:
        pass
    return "offline"


class WandbWriter:
    """Metrics into a Weights & Biases run, offline unless W&B is configured.

    Args:
        run_dir: the training run's directory (usually the trainer's ``work_dir``):
            ``wandb.init(dir=run_dir)``, so the run's files go to ``run_dir/wandb/``.
        project: wandb project name.
        name: run name.
        mode: "offline" (nothing leaves the machine; ``wandb sync run_dir/wandb/offline-run-*``
            uploads later, ``wandb leet`` shows it), "online" or "disabled". None
            (default): what WANDB_MODE says if set; else "online" if an API key is
            configured (WANDB_API_KEY, ``wandb login``), else "offline".
        config: hyperparameters for the run's config (nested dicts are fine).
        **init_kwargs: anything else for ``wandb.init`` (entity, tags, group, settings,
            ...). ``reinit`` defaults to "create_new", so a run of your own stays
            untouched (this run is not ``wandb.run``; log extra things to ``writer.run``).

    Values and steps as for :class:`MlflowWriter`, names unchanged (``loss``, ``lr/pg1``,
    ``val/acc``), ``step=record["iter"]``: a val record at the iteration of the last
    train record joins that step.

    The run starts with the first record (only rank 0 writes, so only rank 0 starts
    one) and ``run`` is the ``wandb.Run`` while it is open. :meth:`close` calls
    ``finish()`` (exit code 1 while an exception propagates). A record after
    :meth:`close` (``trainer.validate()`` after ``fit()``) resumes the same run id.
    Needs the ``wandb`` package.
    """

    def __init__(self, run_dir: str | Path, project: str = "treadle", name: str | None = None,
                 mode: str | None = None, config: dict[str, Any] | None = None, **init_kwargs: Any) -> None:
        self._wandb = _require("wandb", "wandb", "WandbWriter")
        self.run_dir = Path(run_dir)
        self.project, self.name, self.mode, self.config = project, name, mode, config
        self.init_kwargs = {"reinit": "create_new", **init_kwargs}
        self.run: Any = None
        self.run_id: str | None = None

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        kwargs = dict(project=self.project, name=self.name, dir=str(self.run_dir), config=self.config,
                      mode=self.mode if self.mode is not None else _wandb_default_mode())
        if self.run_id is not None:  # reopened after close(): the same run
            kwargs.update(id=self.run_id, resume="allow")
        self.run = self._wandb.init(**{**kwargs, **self.init_kwargs})
        self.run_id = self.run.id

    def write(self, record: dict[str, Any]) -> None:
        values = _tracker_values(record)
        if not values:
            return
        if self.run is None:
            self._start()
        self.run.log(values, step=_step(record))

    def close(self) -> None:
        """``finish()`` the run (idempotent); exit code 1 while an exception propagates."""
        if self.run is None:
            return
        run, self.run = self.run, None
        run.finish(exit_code=0 if _propagating_error() is None else 1)


__all__ = ["MlflowWriter", "WandbWriter"]
