"""An OpenMMLab project's own hooks on treadle's engine (treadle/openmmlab/hooks.py): each point
called as MMEngine 0.10.7's Runner calls it (compared with a Runner of the same model, data and
hook), the runner view, the refusal before training, priorities and the checkpoint round trip."""

from __future__ import annotations

import functools
import re
import uuid
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.components.build import build_hook
from treadle.components.errors import ConfigError
from treadle.hooks.base import HOOK_POINTS, Hook, build_dispatch, implements
from treadle.openmmlab.hooks import MMEngineHook, adapt_hook
from treadle.openmmlab.scope import ProjectScope

from support import TinyNet, make_data

mmengine_hooks = pytest.importorskip("mmengine.hooks")
MMHook = mmengine_hooks.Hook

DATA = [dict(inputs=torch.randn(2, generator=torch.Generator().manual_seed(i)), labels=torch.tensor(float(i % 3)))
        for i in range(6)]
NO_DEFAULTS = dict(logger=None, checkpoint=None, timer=None, param_scheduler=None)


def loader(n: int = 6) -> DataLoader:
    return DataLoader(DATA[:n], batch_size=2)


def toy() -> Any:
    """An MMEngine BaseModel: MMEngine's Runner and treadle train it alike."""
    from mmengine.model import BaseModel

    class Toy(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(2, 1)

        def forward(self, inputs, labels, mode="tensor"):
            out = self.linear(inputs).squeeze(1)
            if mode == "loss":
                return {"loss": ((out - labels) ** 2).mean()}
            return [dict(pred=o, label=t) for o, t in zip(out, labels)]

    return Toy()


def count_metric() -> Any:
    """An MMEngine metric: ``toy/n``, the samples it saw."""
    from mmengine.evaluator import BaseMetric

    class Count(BaseMetric):
        default_prefix = "toy"

        def process(self, data_batch, data_samples):
            self.results.extend(1 for _ in data_samples)

        def compute_metrics(self, results):
            return {"n": len(results)}

    return Count()


def mm_run(tmp_path, hooks, *, resume=False, default_hooks=None, val=True, **train_cfg) -> Any:
    """MMEngine's own Runner on the toy (validating on 4 samples)."""
    from mmengine.runner import Runner

    evaluation = dict(val_dataloader=loader(4), val_evaluator=[count_metric()], val_cfg=dict()) if val else {}
    runner = Runner(model=toy(), work_dir=str(tmp_path), train_dataloader=loader(), **evaluation,
                    optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
                    train_cfg=train_cfg, custom_hooks=hooks, default_hooks=default_hooks or NO_DEFAULTS,
                    resume=resume, log_level="ERROR", experiment_name=f"mm-{uuid.uuid4().hex[:8]}")
    runner.train()
    return runner


def treadle_run(work_dir, hooks, val=True, **kwargs) -> treadle.Trainer:
    """treadle's Trainer on the toy with the same data, evaluated by the same metric (no
    work_dir: no checkpoint, as the Runner without its CheckpointHook)."""
    from mmengine.evaluator import Evaluator

    from treadle.openmmlab.evaluator import EvaluatorMetric

    evaluation = dict(val_dataloader=loader(4),
                      metrics={"toy": EvaluatorMetric(Evaluator([count_metric()]), DATA[:4])}) if val else {}
    trainer = treadle.Trainer(toy(), work_dir=work_dir, train_dataloader=loader(), **evaluation,
                              optimizer=dict(type="SGD", lr=0.1), hooks=hooks, **kwargs)
    trainer.fit()
    return trainer


class Recorder(MMHook):
    """Every point, with the runner's counters and the point's batch_idx / metrics."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


def _recording(point: str):
    def record(self, runner, batch_idx=None, data_batch=None, outputs=None, metrics=None, checkpoint=None):
        self.calls.append((point, runner.epoch, runner.iter, runner.max_epochs, runner.max_iters, batch_idx,
                           dict(metrics) if metrics is not None else None))

    return record


for _point in MMHook.stages:
    setattr(Recorder, _point, _recording(_point))


@pytest.mark.parametrize("schedule", [dict(by_epoch=True, max_epochs=2, val_interval=1),
                                      dict(by_epoch=False, max_iters=5, val_interval=2)], ids=["epochs", "iterations"])
def test_points_and_arguments_are_mmengines(tmp_path, schedule):
    """The same hook, on MMEngine's Runner and on treadle: the same calls, counters, batch_idx and
    metrics, point for point (by iteration MMEngine's loop is one epoch, and batch_idx the iteration)."""
    theirs = Recorder()
    mm_run(tmp_path / "mm", [theirs], **schedule)
    ours = Recorder()
    length = {"max_epochs": schedule["max_epochs"]} if schedule["by_epoch"] else {"max_iters": schedule["max_iters"]}
    treadle_run(None, [adapt_hook(ours, "custom_hooks[0]")], val_interval=schedule["val_interval"],
                **length)
    assert ours.calls == theirs.calls
    assert {str(c[-1]) for c in ours.calls if c[0] == "after_val_epoch"} == {"{'toy/n': 4}"}  # MMEngine's names


class HubReader(MMHook):
    """What the message hub holds where hooks read it (RuntimeInfoHook keeps it in MMEngine)."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        info = runner.message_hub.runtime_info
        self.seen.append(tuple(info.get(k) for k in ("epoch", "iter", "max_epochs", "max_iters", "loop_stage")))

    def after_val(self, runner):
        self.seen.append(("val", runner.message_hub.get_scalar("val/toy/n").current(),
                          runner.message_hub.get_info("loop_stage")))


def test_message_hub_is_kept_as_mmengines(tmp_path):
    theirs, ours = HubReader(), HubReader()
    mm_run(tmp_path / "mm", [theirs], by_epoch=True, max_epochs=2)
    treadle_run(None, [adapt_hook(ours, "custom_hooks[0]")], max_epochs=2)
    assert ours.seen == theirs.seen and len(ours.seen) == 8


def test_mmengine_early_stopping_hook_stops_as_in_mmengine(tmp_path):
    """MMEngine's own EarlyStoppingHook: its metric stops improving, it sets
    runner.train_loop.stop_training, and training ends after the same epoch."""
    from mmengine.hooks import EarlyStoppingHook

    def hook():
        return EarlyStoppingHook(monitor="toy/n", rule="greater", patience=1)

    runner = mm_run(tmp_path / "mm", [hook()], by_epoch=True, max_epochs=5)
    trainer = treadle_run(None, [adapt_hook(hook(), "custom_hooks[0]")], max_epochs=5)
    assert runner.epoch == trainer.state.epoch == 2


def test_mmengine_iter_timer_and_empty_cache_hooks_run(tmp_path):
    """Two hooks MMEngine ships, on a plain nn.Module: the timer reads iter/max_iters and writes
    the hub (eta, train/time per iteration); EmptyCacheHook (helpers only) does nothing on CPU."""
    from mmengine.hooks import EmptyCacheHook, IterTimerHook

    timer = adapt_hook(IterTimerHook(), "default_hooks.timer")
    empty = adapt_hook(EmptyCacheHook(after_iter=True), "custom_hooks[0]")
    trainer = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4),
                              val_dataloader=DataLoader(make_data(4), batch_size=2), loss_fn=nn.CrossEntropyLoss(),
                              optimizer=dict(type="SGD", lr=0.1), max_epochs=2, hooks=[timer, empty])
    trainer.fit()
    hub = timer.runner(trainer).message_hub
    assert isinstance(hub.get_info("eta"), float)
    assert len(hub.get_scalar("train/time").data[0]) == 4  # one per training iteration
    assert len(hub.get_scalar("val/time").data[0]) == 4  # two passes of two batches
    assert empty.runner(trainer) is timer.runner(trainer)  # one view per trainer


def test_only_the_points_a_hook_overrides_are_dispatched():
    from mmengine.hooks import EmptyCacheHook

    class OnlyVal(MMHook):
        def after_val_epoch(self, runner, metrics=None):
            pass

    only = adapt_hook(OnlyVal(), "custom_hooks[0]")
    assert [p for p in HOOK_POINTS if implements(only, p)] == ["after_val_epoch"]
    table = build_dispatch([only])
    assert all(not fns for point, fns in table.items() if point != "after_val_epoch")
    # EmptyCacheHook overrides MMEngine's helpers _before_epoch, _after_epoch, _after_iter only:
    # no before_*_iter, no per-run point but the ones its epochs need
    empty = adapt_hook(EmptyCacheHook(), "custom_hooks[0]")
    used = {p for p in HOOK_POINTS if implements(empty, p)}
    assert used == {"before_train", "after_train", "before_train_epoch", "after_train_epoch", "after_train_iter",
                    "before_val_epoch", "after_val_epoch", "after_val_iter", "before_test_epoch", "after_test_epoch",
                    "after_test_iter"}
    assert isinstance(only, MMEngineHook) and isinstance(only, Hook)


def test_priorities_map_onto_treadles_and_order_the_calls():
    from mmengine.runner import Priority

    order: list[str] = []

    class Mark(MMHook):
        def __init__(self, name, priority):
            self.name, self.priority = name, priority

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            order.append(self.name)

    class Ours(Hook):  # treadle's own, NORMAL: ties keep registration order, as in MMEngine
        def before_train_iter(self, trainer, batch):
            order.append("treadle")

    marks = [Mark("low", "LOW"), Mark("very_high", "very_high"), Mark("45", 45), Mark("highest", Priority.HIGHEST),
             Mark("normal", "NORMAL")]
    adapters = [adapt_hook(m, f"custom_hooks[{i}]") for i, m in enumerate(marks)]
    assert [a.priority for a in adapters] == [70, 10, 45, 0, 50]
    trainer = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(4), batch_size=4),
                              loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=1,
                              hooks=[*adapters[:4], Ours(), adapters[4]])
    trainer.fit()
    assert order == ["highest", "very_high", "45", "treadle", "normal", "low"]
    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\]\.priority: not an MMEngine priority"):
        adapt_hook(Mark("bad", "MEDIUM"), "custom_hooks[0]")


class Visualize(MMHook):
    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        runner.visualizer.add_datasample("x", None)


def test_a_hook_reading_what_the_view_lacks_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        adapt_hook(Visualize(), "custom_hooks[0]")
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("custom_hooks[0]: Visualize uses runner.visualizer (after_val_iter), which treadle's "
                           "runner view does not have; expected a hook reading only runner.{cfg, distributed, epoch,")
    assert "message_hub" in line and "train_loop" in line


def test_the_rule_follows_helpers_getattr_and_loop_views():
    class Helper(MMHook):  # the runner handed on, by position and by keyword, under other names
        def after_train_epoch(self, runner):
            self._log(1, runner)

        def _log(self, n, r):
            self._deeper(run=r)

        def _deeper(self, run):
            return run.log_processor

    class ByName(MMHook):
        def before_run(self, runner):
            return getattr(runner, "visualizer")  # noqa: B009 - the rule reads constant getattr names too

    class LoopAttr(MMHook):
        def before_train(self, runner):
            return runner.train_loop.val_begin

    class SetsModel(MMHook):
        def before_run(self, runner):
            runner.model = None

    class OwnAttr(MMHook):  # what a hook sets on its runner it may read; hasattr is no read
        def before_run(self, runner):
            runner.my_table = {}

        def after_run(self, runner):
            return runner.my_table, hasattr(runner, "visualizer"), runner.train_loop.stop_training

    for cls, read in [(Helper, "runner.log_processor (_deeper)"), (ByName, "runner.visualizer (before_run)"),
                      (LoopAttr, "runner.train_loop.val_begin (before_train)"),
                      (SetsModel, "runner.model = ... (before_run)")]:
        with pytest.raises(ConfigError, match=rf"^x: {cls.__name__} uses {re.escape(read)},"):
            adapt_hook(cls(), "x")
    assert isinstance(adapt_hook(OwnAttr(), "x"), MMEngineHook)


def test_a_hook_rewriting_the_saved_weights_is_refused():
    from mmengine.hooks import EMAHook

    class SwapWeights(MMHook):
        def before_save_checkpoint(self, runner, checkpoint):
            self._swap(checkpoint)

        def _swap(self, ckpt):
            ckpt["state_dict"] = {}

    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\]: SwapWeights uses checkpoint\['state_dict'\] \(_swap\), "
                                          "which treadle's checkpointer owns"):
        adapt_hook(SwapWeights(), "custom_hooks[0]")
    with pytest.raises(ConfigError, match="EMAHook uses runner._resume"):  # MMEngine's own (ema= is treadle's)
        adapt_hook(EMAHook(), "custom_hooks[0]")


class Keep(MMHook):
    """Counts epochs across a resume: in the checkpoint, its meta and the message hub."""

    def __init__(self) -> None:
        self.count = 0
        self.log: list[tuple[Any, ...]] = []

    def before_run(self, runner):
        self.log.append(("before_run",))

    def before_train(self, runner):
        self.log.append(("before_train", runner.epoch, runner.iter, runner.message_hub.get_info("seen")))

    def after_train_epoch(self, runner):
        self.count += 1
        runner.message_hub.update_info("seen", self.count)

    def before_save_checkpoint(self, runner, checkpoint):
        checkpoint["count"] = self.count
        checkpoint["meta"]["mine"] = "kept"
        self.log.append(("save", checkpoint["meta"]["epoch"], checkpoint["meta"]["iter"]))

    def after_load_checkpoint(self, runner, checkpoint):
        self.count = checkpoint["count"]
        meta = checkpoint["meta"]
        self.log.append(("load", meta["epoch"], meta["iter"], checkpoint["count"], meta["mine"]))


def test_checkpoint_round_trip_as_mmengines(tmp_path, monkeypatch):
    """What the hook stores at a save is back at the resume, at the point MMEngine calls it
    (after before_run), with the meta and the hub's info; the same as MMEngine's own resume.
    (Without validation: treadle's CheckpointHook saves again at the end of a run when a
    validation came after the last save, MMEngine's does not.)"""
    monkeypatch.setattr(torch, "load", functools.partial(torch.load, weights_only=False))  # MMEngine's .pth
    mm_hooks = dict(NO_DEFAULTS, checkpoint=dict(type="CheckpointHook", interval=1))
    theirs = [Keep(), Keep()]
    mm_run(tmp_path / "mm", [theirs[0]], by_epoch=True, max_epochs=1, default_hooks=mm_hooks, val=False)
    mm_run(tmp_path / "mm", [theirs[1]], by_epoch=True, max_epochs=2, default_hooks=mm_hooks, val=False, resume=True)
    monkeypatch.undo()
    ours = [Keep(), Keep()]
    treadle_run(tmp_path / "t", [adapt_hook(ours[0], "custom_hooks[0]")], val=False, max_epochs=1,
                checkpoint=dict(interval=1))
    treadle_run(tmp_path / "t", [adapt_hook(ours[1], "custom_hooks[0]")], val=False, max_epochs=2,
                checkpoint=dict(interval=1), resume=True)
    assert [k.log for k in ours] == [k.log for k in theirs]
    assert ours[1].log == [("before_run",), ("load", 1, 3, 1, "kept"), ("before_train", 1, 3, 1), ("save", 2, 6)]
    assert ours[1].count == 2


def test_a_checkpoint_value_weights_only_cannot_load_is_refused(tmp_path):
    class Odd(MMHook):
        def before_save_checkpoint(self, runner, checkpoint):
            checkpoint["thing"] = object()

    with pytest.raises(ValueError, match=r"custom_hooks\[0\]: Odd.before_save_checkpoint put checkpoint\['thing'\], "
                                         "which is not plain data or tensors"):
        treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(4), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                        hooks=[adapt_hook(Odd(), "custom_hooks[0]")]).fit()


def test_runner_view_attributes(tmp_path):
    from mmengine.logging import MessageHub
    from mmengine.model import is_model_wrapper
    from mmengine.registry import MODEL_WRAPPERS
    from torch.nn.parallel import DistributedDataParallel

    seen: dict[str, Any] = {}

    class Look(MMHook):
        def before_train(self, runner):
            seen.update(model=runner.model, work_dir=runner.work_dir, log_dir=runner.log_dir, hub=runner.message_hub,
                        lr=runner.optim_wrapper.get_lr(), momentum=runner.optim_wrapper.get_momentum(),
                        loaders=(runner.train_dataloader, runner.val_dataloader, runner.test_dataloader),
                        loop=(runner.train_loop.dataloader, runner.train_loop.max_epochs, runner.val_loop.dataloader,
                              runner.test_loop),
                        run=(runner.rank, runner.world_size, runner.distributed, runner.seed, runner.cfg,
                             runner.param_schedulers, runner.timestamp, runner.experiment_name))
            runner.logger.info("hello from an MMEngine hook")

    train, val = DataLoader(make_data(4), batch_size=4), DataLoader(make_data(4), batch_size=4)
    trainer = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=train, val_dataloader=val,
                              loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1, momentum=0.9),
                              max_epochs=1, seed=3, hooks=[adapt_hook(Look(), "custom_hooks[0]")])
    trainer.fit()
    assert seen["model"] is trainer.model and not is_model_wrapper(seen["model"])
    assert DistributedDataParallel in MODEL_WRAPPERS.module_dict.values()  # a strategy's DDP: hooks unwrap it
    assert seen["work_dir"] == seen["log_dir"] == str(tmp_path)
    assert isinstance(seen["hub"], MessageHub) and MessageHub.get_current_instance() is seen["hub"]
    assert seen["lr"] == {"lr": [0.1]} and seen["momentum"] == {"momentum": [0.9]}
    assert seen["loaders"] == (train, val, None) and seen["loop"] == (train, 1, val, None)
    assert seen["run"] == (0, 1, False, 3, None, None, trainer.run_timestamp, trainer.run_id)


def test_the_config_door_builds_and_adapts_a_registered_hook(tmp_path):
    from mmengine.registry import HOOKS

    @HOOKS.register_module(name="TreadleTestEveryEpoch", force=True)
    class EveryEpoch(MMHook):
        priority = "LOW"

        def __init__(self, interval=1):
            self.interval, self.epochs = interval, []

        def after_train_epoch(self, runner):
            if self.every_n_epochs(runner, self.interval):
                self.epochs.append(runner.epoch)

    HOOKS.register_module(name="TreadleTestVisualize", force=True, module=Visualize)
    scope = ProjectScope("mmengine")
    hook = build_hook({"type": "TreadleTestEveryEpoch", "interval": 2}, "custom_hooks[0]", scope=scope)
    assert isinstance(hook, MMEngineHook) and hook.priority == 70 and type(hook).__name__ == "mmengine:EveryEpoch"
    with pytest.raises(ConfigError, match=r"^custom_hooks\[1\]: Visualize uses runner.visualizer"):
        build_hook({"type": "TreadleTestVisualize"}, "custom_hooks[1]", scope=scope)
    treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(4), batch_size=2), loss_fn=nn.CrossEntropyLoss(),
                    optimizer=dict(type="SGD", lr=0.1), max_epochs=4, hooks=[hook]).fit()
    assert hook.hook.epochs == [1, 3]
