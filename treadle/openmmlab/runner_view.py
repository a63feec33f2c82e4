"""The runner an MMEngine hook receives (treadle/openmmlab/hooks.py adapts the hook): the Trainer
seen as MMEngine's Runner.

A :class:`RunnerView` reads the Trainer's public attributes when asked:

=====================================  =============================================================
``runner.``                            from the Trainer
=====================================  =============================================================
``epoch``, ``iter``                    ``state.epoch`` (0 by iteration), ``state.iter``
``max_epochs``, ``max_iters``          ``state.max_epochs`` (1 by iteration), ``state.max_iters``
``model``                              ``model``, as the strategy wrapped it (torch's DDP is one of
                                       MMEngine's ``MODEL_WRAPPERS``: hooks unwrap it)
``optim_wrapper``                      the ``OptimWrapper`` with MMEngine's ``get_lr()`` /
                                       ``get_momentum()`` dicts (several: a dict of them by name)
``param_schedulers``                   ``strategy.param_schedulers`` (None without any)
``train_dataloader`` (val, test)       the loaders
``train_loop``                         ``dataloader``, counters, ``val_interval``, ``stop_training``
                                       (setting it calls ``state.request_stop``)
``val_loop``, ``test_loop``            ``dataloader`` (None without the loader)
``message_hub``                        a real ``MessageHub`` (MMEngine's current one): ``runtime_info``
                                       ``epoch``, ``iter``, ``max_epochs``, ``max_iters``,
                                       ``loop_stage`` set at each forwarded point; after an evaluation
                                       ``val/<name>`` scalars, as MMEngine's RuntimeInfoHook
``logger``                             treadle's logger (``info``, ``warning``, ``error``)
``work_dir``, ``log_dir``              ``work_dir`` as a str (treadle writes its logs there)
``rank``, ``world_size``,              the strategy's
``distributed``, ``launcher``
``seed``, ``timestamp``,               ``seed``, ``run_timestamp``, ``run_id``
``experiment_name``
``val_interval``, ``cfg``              ``val_interval``; None (the Trainer keeps no config)
=====================================  =============================================================
"""

from __future__ import annotations

import numbers
import uuid
from typing import Any, Mapping

from treadle.openmmlab.mm import import_mmengine

#: The message hub's info that the view writes itself (not kept in checkpoints by a hook's state).
COUNTERS = ("epoch", "iter", "max_epochs", "max_iters", "loop_stage")


class _Optim:
    """treadle's OptimWrapper with MMEngine's ``get_lr()`` / ``get_momentum()`` dicts."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)

    def get_lr(self) -> dict[str, list[float]]:
        return {"lr": list(self._wrapper.get_lr())}

    def get_momentum(self) -> dict[str, list[float]]:
        groups = self._wrapper.param_groups
        return {"momentum": [g["momentum"] if "momentum" in g else g.get("betas", (0.0,))[0] for g in groups]}


class _Optims(dict):
    """Several optimizers by name, as MMEngine's ``OptimWrapperDict`` reads them."""

    def get_lr(self) -> dict[str, list[float]]:
        return {f"{n}.lr": o.get_lr()["lr"] for n, o in self.items()}

    def get_momentum(self) -> dict[str, list[float]]:
        return {f"{n}.momentum": o.get_momentum()["momentum"] for n, o in self.items()}


class TrainLoopView:
    """``runner.train_loop``: counters, loader, and ``stop_training`` (setting it asks treadle to stop)."""

    def __init__(self, runner: "RunnerView") -> None:
        self._runner = runner

    dataloader = property(lambda self: self._runner.train_dataloader)
    epoch = property(lambda self: self._runner.epoch)
    iter = property(lambda self: self._runner.iter)
    max_epochs = property(lambda self: self._runner.max_epochs)
    max_iters = property(lambda self: self._runner.max_iters)
    val_interval = property(lambda self: self._runner.val_interval)

    @property
    def stop_training(self) -> bool:
        return bool(self._runner.trainer.state.should_stop)

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        if value:  # MMEngine's EarlyStoppingHook: the loop ends at the next boundary
            self._runner.trainer.state.request_stop("an MMEngine hook set runner.train_loop.stop_training")


class EvalLoopView:
    """``runner.val_loop`` / ``runner.test_loop``: the loader."""

    def __init__(self, dataloader: Any) -> None:
        self._loader = dataloader

    dataloader = property(lambda self: self._loader)


class RunnerView:
    """What an MMEngine hook receives as ``runner``: the Trainer seen as MMEngine's Runner.

    Read from the Trainer's public attributes when asked (nothing is copied per step; no value is
    read back from the device). The message hub's ``runtime_info`` (``epoch``, ``iter``,
    ``max_epochs``, ``max_iters``, ``loop_stage``) is brought up to date at each forwarded point,
    and after each evaluation its scalars hold ``val/<name>`` (``test/<name>``) as MMEngine's
    RuntimeInfoHook puts them. A hook may set attributes of its own on it."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._hub: Any = None
        self._outer_stage: str | None = None  # the loop stage around a running evaluation

    # counters: by iteration, MMEngine's loop is one epoch (epoch 0 of 1)
    @property
    def epoch(self) -> int:
        s = self.trainer.state
        return s.epoch if s.by_epoch else 0

    @property
    def iter(self) -> int:
        return self.trainer.state.iter

    @property
    def max_epochs(self) -> int:
        s = self.trainer.state
        return (s.max_epochs or 0) if s.by_epoch else 1

    @property
    def max_iters(self) -> int:
        return self.trainer.state.max_iters or 0

    @property
    def val_interval(self) -> int:
        return self.trainer.val_interval

    # the model, its optimization, its data
    model = property(lambda self: self.trainer.model, doc="The model as the strategy wrapped it (DDP: the wrapper).")
    train_dataloader = property(lambda self: self.trainer.train_dataloader)
    val_dataloader = property(lambda self: self.trainer.val_dataloader)
    test_dataloader = property(lambda self: self.trainer.test_dataloader)

    @property
    def optim_wrapper(self) -> Any:
        wrappers = self.trainer.optim_wrappers
        if len(wrappers) == 1:
            return _Optim(next(iter(wrappers.values())))
        return _Optims({name: _Optim(w) for name, w in wrappers.items()}) if wrappers else None

    @property
    def param_schedulers(self) -> Any:
        return self.trainer.strategy.param_schedulers or None

    @property
    def train_loop(self) -> TrainLoopView | None:
        return TrainLoopView(self) if self.trainer.train_dataloader is not None else None

    @property
    def val_loop(self) -> EvalLoopView | None:
        loader = self.trainer.val_dataloader
        return EvalLoopView(loader) if loader is not None else None

    @property
    def test_loop(self) -> EvalLoopView | None:
        loader = self.trainer.test_dataloader
        return EvalLoopView(loader) if loader is not None else None

    # the run
    work_dir = property(lambda self: str(self.trainer.work_dir) if self.trainer.work_dir is not None else None)
    log_dir = property(lambda self: self.work_dir, doc="treadle writes its logs into work_dir itself.")
    rank = property(lambda self: self.trainer.strategy.rank)
    world_size = property(lambda self: self.trainer.strategy.world_size)
    distributed = property(lambda self: bool(self.trainer.strategy.distributed))
    launcher = property(lambda self: self.trainer.strategy.launcher)
    seed = property(lambda self: self.trainer.seed)
    timestamp = property(lambda self: self.trainer.run_timestamp)
    experiment_name = property(lambda self: self.trainer.run_id)
    cfg = property(lambda self: None, doc="The Trainer keeps no resolved config: None.")

    @property
    def logger(self) -> Any:
        from treadle.logging.writers import get_logger

        return get_logger()

    @property
    def message_hub(self) -> Any:
        """A real ``mmengine.logging.MessageHub`` of this run (MMEngine's current one once made)."""
        if self._hub is None:
            hub = import_mmengine("MMEngine's message hub", "logging").MessageHub
            self._hub = hub.get_instance(f"treadle:{self.trainer.run_id}:{uuid.uuid4().hex[:8]}")
        return self._hub

    def sync(self, eval_done: bool = False) -> None:
        """The hub's counters, as MMEngine's RuntimeInfoHook keeps them; ``loop_stage`` is the
        loop's, and at ``after_val``/``after_test`` again the one around the evaluation."""
        hub, s = self.message_hub, self.trainer.state
        mode, by_epoch, update = s.mode, s.by_epoch, hub.update_info
        update("epoch", s.epoch if by_epoch else 0)  # the properties' values, read once (every forwarded point)
        update("iter", s.iter)
        update("max_epochs", (s.max_epochs or 0) if by_epoch else 1)
        update("max_iters", s.max_iters or 0)
        stage = mode if mode in ("train", "val", "test") else None
        if mode in ("val", "test"):
            before = hub.get_info("loop_stage")
            if before != mode:
                self._outer_stage = before
            stage = self._outer_stage if eval_done else mode
        if stage is None:
            hub.pop_info("loop_stage")
        else:
            hub.update_info("loop_stage", stage)

    def results(self, mode: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """A pass's results with MMEngine's names (``val/x`` -> ``x``)."""
        prefix = f"{mode}/"
        return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix)}

    def record(self, mode: str, results: Mapping[str, Any]) -> None:
        """A pass's results into the hub: numbers as scalars, anything else as info (RuntimeInfoHook's rule)."""
        hub = self.message_hub
        for key, value in results.items():
            scalar = isinstance(value, numbers.Real) and not isinstance(value, bool)
            (hub.update_scalar if scalar else hub.update_info)(f"{mode}/{key}", value)

    def meta(self, pos: Any) -> dict[str, Any]:
        """A checkpoint's ``meta``: epochs and iterations done there (MMEngine's), and the run's."""
        mmengine = import_mmengine("MMEngine's checkpoint meta", "")

        pos = pos if isinstance(pos, dict) else {}
        by_epoch = self.trainer.state.by_epoch
        meta = {"epoch": int(pos.get("epoch", 0)) if by_epoch else 0, "iter": int(pos.get("iter", 0)),
                "seed": self.seed, "experiment_name": self.experiment_name, "mmengine_version": mmengine.__version__}
        info = getattr(getattr(self.train_dataloader, "dataset", None), "metainfo", None)
        if info is not None:
            meta["dataset_meta"] = info
        return meta


def plain(value: Any) -> bool:
    """Whether a checkpoint loaded with ``weights_only`` can hold ``value``."""
    import torch

    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    return isinstance(value, dict) and all(isinstance(k, (str, int)) and plain(v) for k, v in value.items())


__all__ = ["COUNTERS", "EvalLoopView", "RunnerView", "TrainLoopView", "plain"]
