"""MMEngine's ``Runner`` on treadle's engine: a script written for MMEngine runs with one import
changed::

    from treadle.mmengine import Runner      # was: from mmengine.runner import Runner

    runner = Runner(model=MyBaseModel(), work_dir="./work_dir", train_dataloader=train_loader,
                    optim_wrapper=dict(optimizer=dict(type=SGD, lr=0.001, momentum=0.9)),
                    train_cfg=dict(by_epoch=True, max_epochs=5, val_interval=1),
                    val_dataloader=val_loader, val_cfg=dict(), val_evaluator=dict(type=Accuracy))
    runner.train()

The arguments are MMEngine's, with its meanings: each is translated as a config file's key of
the same name is (treadle/openmmlab/translate.py; docs/mmengine.md has the table), objects given
from Python (a model, DataLoaders, metrics, hooks) are used as they are, and the Trainer that
runs them is ``runner.trainer``. ``Runner.from_cfg(cfg)`` takes a config (an ``mmengine.Config``,
a dict, or a file's path) as ``treadle train`` reads one. What the Runner adds to MMEngine's:
exact resume after a crash (``resume=True``), checkpoints that are atomic and load with
``weights_only``, a stuck process named.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

#: MMEngine's ``Runner.__init__`` arguments this Runner takes, with MMEngine's defaults.
RUNNER_ARGS: dict[str, Any] = {
    "train_dataloader": None, "val_dataloader": None, "test_dataloader": None, "train_cfg": None, "val_cfg": None,
    "test_cfg": None, "auto_scale_lr": None, "optim_wrapper": None, "param_scheduler": None, "val_evaluator": None,
    "test_evaluator": None, "default_hooks": None, "custom_hooks": None, "data_preprocessor": None,
    "load_from": None, "resume": False, "launcher": "none", "env_cfg": None, "log_processor": None,
    "log_level": "INFO", "visualizer": None, "default_scope": "mmengine", "randomness": None, "experiment_name": None,
    "cfg": None,
}


class Runner:
    """MMEngine's ``Runner`` (its arguments: see :data:`RUNNER_ARGS` and MMEngine's documentation)
    running on a :class:`treadle.Trainer` (``self.trainer``). ``experiment_name`` and ``cfg`` are
    accepted and not used (treadle names a run by its ``run_id``; the config a run used is
    ``work_dir/config.yaml`` when it came from a file)."""

    def __init__(self, model: Any, work_dir: str | os.PathLike, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(RUNNER_ARGS))
        if unknown:
            from treadle.suggest import did_you_mean

            raise TypeError(f"Runner() got unexpected arguments {unknown}; MMEngine's Runner takes model, work_dir "
                            f"and {', '.join(RUNNER_ARGS)}.{did_you_mean(unknown[0], list(RUNNER_ARGS))}")
        given = {**RUNNER_ARGS, **kwargs}
        raw = {k: v for k, v in given.items() if v is not None and k not in ("experiment_name", "cfg", "launcher")}
        if raw.get("resume") is False:
            raw.pop("resume")
        raw.update(model=model, work_dir=os.fspath(work_dir))
        for key in ("train_dataloader", "val_dataloader", "test_dataloader"):
            if isinstance(raw.get(key), Mapping) and "collate_fn" not in raw[key]:  # the Runner's default
                raw[key] = {**raw[key], "collate_fn": {"type": "pseudo_collate"}}
        self.trainer = _trainer(_translated(raw))

    @classmethod
    def from_cfg(cls, cfg: Any) -> "Runner":
        """A Runner for a whole config: an ``mmengine.Config``, a mapping, or a config file's path,
        read as ``treadle train`` reads it (``work_dir`` from the config)."""
        from treadle.config import load_config, resolve_config

        if isinstance(cfg, (str, os.PathLike)):
            resolved = load_config(cfg)
        else:
            raw = cfg.to_dict() if callable(getattr(cfg, "to_dict", None)) else dict(cfg)
            raw.pop("filename", None)
            resolved = resolve_config(raw, source="cfg")
        self = cls.__new__(cls)
        self.trainer = _trainer(dict(resolved))
        return self

    # -- what MMEngine's Runner offers -------------------------------------------------------
    @property
    def model(self) -> Any:
        """The model (unwrapped)."""
        return self.trainer.module

    @property
    def work_dir(self) -> str | None:
        return str(self.trainer.work_dir) if self.trainer.work_dir is not None else None

    @property
    def epoch(self) -> int:
        return self.trainer.state.epoch

    @property
    def iter(self) -> int:
        return self.trainer.state.iter

    @property
    def max_epochs(self) -> int | None:
        return self.trainer.state.max_epochs

    @property
    def max_iters(self) -> int | None:
        return self.trainer.state.max_iters

    @property
    def train_dataloader(self) -> Any:
        return self.trainer.train_dataloader

    @property
    def val_dataloader(self) -> Any:
        return self.trainer.val_dataloader

    @property
    def test_dataloader(self) -> Any:
        return self.trainer.test_dataloader

    @property
    def optim_wrapper(self) -> Any:
        return self.trainer.optim_wrapper

    @property
    def seed(self) -> int | None:
        return self.trainer.seed

    def train(self) -> Any:
        """Train as configured (validating per ``train_cfg``); returns the model, as MMEngine's."""
        self.trainer.fit()
        return self.model

    def val(self) -> dict[str, Any]:
        """One validation pass; its results under MMEngine's names (``accuracy/top1``)."""
        return _named(self.trainer.validate(), "val")

    def test(self) -> dict[str, Any]:
        """One test pass; its results under MMEngine's names."""
        return _named(self.trainer.test(), "test")


def _translated(raw: dict[str, Any]) -> dict[str, Any]:
    from treadle.openmmlab.translate import translate

    return translate(raw)


def _trainer(cfg: dict[str, Any]) -> Any:
    """The Trainer a translated (or resolved) config describes, its objects used as they are."""
    from treadle.config.assemble import trainer_kwargs
    from treadle.engine.trainer import Trainer

    kw = trainer_kwargs(cfg, "train")
    if isinstance(kw.get("work_dir"), Path):
        kw["work_dir"] = str(kw["work_dir"])
    return Trainer(**kw)


def _named(results: Mapping[str, Any], mode: str) -> dict[str, Any]:
    prefix = f"{mode}/"
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in results.items()}


__all__ = ["RUNNER_ARGS", "Runner"]
