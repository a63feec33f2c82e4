"""MMEngine's runtime keys (env_cfg, visualizer, log_level, launcher, log_processor,
tta_model, visualization hooks, helper variables) translated, not refused.

The configs below are the released ``default_runtime.py`` and ``schedules/`` files of
OpenMMLab's classification, detection and segmentation projects (``openmmlab/``), with
a few more of MMEngine's documented keys; only the model, the data and the
classification schedule are small ones.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from treadle.config import ConfigError, build_trainer, load_config, resolve_config
from mm_support import translate  # less the Runner's defaults (test_mmengine.py: test_the_runners_defaults_...)
from treadle.openmmlab.runtime import MMENGINE_MEAN_PATTERN
from treadle.hooks.runtime_env import RuntimeEnvHook
from treadle.logging.writers import LOGGER_NAME

MODEL_DATA = """
model = dict(type='support.TinyNet')
loss_fn = dict(type='CrossEntropyLoss')
dataset_type = 'support.make_data'
num_samples = 16
train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type=dataset_type, n=num_samples),
                        sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type=dataset_type, n=8, seed=1),
                      sampler=dict(type='DefaultSampler', shuffle=False))
metrics = dict(acc=dict(type='Accuracy'))
progress = False
"""

#: The released runtime and schedule files of OpenMMLab projects (openmmlab/README.md).
OPENMMLAB = Path(__file__).resolve().parent / "openmmlab"
CLS_RUNTIME = (OPENMMLAB / "mmpretrain" / "_base_" / "default_runtime.py").read_text()

CLS_SCHEDULE = """
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=0.0001))
param_scheduler = dict(type='MultiStepLR', by_epoch=True, milestones=[1], gamma=0.1)
train_cfg = dict(by_epoch=True, max_epochs=2, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=256)
"""

# The detection runtime with more of MMEngine's keys: a TensorBoard backend, a process-group
# timeout, a helper variable and the launcher.
DET_RUNTIME = (OPENMMLAB / "mmdet" / "_base_" / "default_runtime.py").read_text() + """
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
               dist_cfg=dict(backend='nccl', timeout=3600))
backend_args = None
launcher = 'none'
"""
DET_SCHEDULE = (OPENMMLAB / "mmdet" / "_base_" / "schedules" / "schedule_1x.py").read_text()
SEG_RUNTIME = (OPENMMLAB / "mmseg" / "_base_" / "default_runtime.py").read_text()
SEG_SCHEDULE = (OPENMMLAB / "mmseg" / "_base_" / "schedules" / "schedule_20k.py").read_text()


def write_config(tmp_path, runtime: str, schedule: str, extra: str = "") -> str:
    """A project's layout: ``_base_`` runtime, schedule and (replaced) model/data files."""
    for name, text in (("default_runtime.py", runtime), ("schedule.py", schedule), ("model_data.py", MODEL_DATA)):
        (tmp_path / name).write_text(textwrap.dedent(text))
    main = tmp_path / "config.py"
    main.write_text("_base_ = ['model_data.py', 'schedule.py', 'default_runtime.py']\n" + textwrap.dedent(extra))
    return str(main)


def records(work_dir):
    return [json.loads(line) for line in (work_dir / "log.jsonl").read_text().splitlines()]


def test_classification_runtime_runs_unchanged_and_logs_every_epoch_end(tmp_path):
    path = write_config(tmp_path, CLS_RUNTIME, CLS_SCHEDULE)
    cfg = load_config(path, mode="train", work_dir=str(tmp_path / "run"))
    assert cfg["log_writers"] == ["jsonl", "csv"]  # LocalVisBackend
    assert cfg["hooks"] == [{"type": "RuntimeEnvHook", "mp_start_method": "fork", "opencv_num_threads": 0}]
    assert cfg["log_interval"] == 100 and cfg["strategy"] == {"type": "auto", "sync_buffers": False}  # the Runner's DDP
    assert "vis_backends" not in cfg and "dataset_type" not in cfg and "num_samples" not in cfg  # helpers
    before = multiprocessing.get_start_method(allow_none=True)
    trainer = build_trainer(cfg)
    trainer.fit()
    assert multiprocessing.get_start_method(allow_none=True) == before  # put back after the run
    # 2 epochs of 4 iterations, a logger interval of 100: one record at each epoch's end, as MMEngine
    assert [r["iter"] for r in records(tmp_path / "run") if r["mode"] == "train"] == [4, 8]
    assert (tmp_path / "run" / "log.csv").is_file() and not (tmp_path / "run" / "tensorboard").exists()


def test_detection_runtime_translation():
    path_cfg = {}
    exec(textwrap.dedent(DET_RUNTIME + DET_SCHEDULE), {}, path_cfg)
    out = translate(path_cfg)
    assert out["log_writers"] == ["jsonl", "csv", "tensorboard"]
    # dist_cfg.timeout; backend nccl: treadle's on CUDA; the Runner's wrapper broadcasts no buffers
    assert out["strategy"] == {"type": "ddp", "timeout_s": 3600, "sync_buffers": False}
    assert out["hooks"] == [{"type": "RuntimeEnvHook", "mp_start_method": "fork", "opencv_num_threads": 0},
                            {"type": "LoggerHook", "interval": 50, "window": 50, "by_epoch": True,
                             "mean_keys": MMENGINE_MEAN_PATTERN, "writers": ["jsonl", "csv", "tensorboard"]}]
    assert out["log_interval"] == 50  # log_processor.window_size == interval: MMEngine's last 50 values
    for key in ("visualizer", "vis_backends", "log_processor", "launcher", "log_level", "env_cfg", "backend_args"):
        assert key not in out


def test_detection_runtime_timeout_merges_into_a_given_strategy(tmp_path):
    path = write_config(tmp_path, DET_RUNTIME, DET_SCHEDULE, "strategy = dict(type='ddp', find_unused_parameters=True)\n")
    cfg = load_config(path, mode="train")
    assert cfg["strategy"] == {"type": "ddp", "find_unused_parameters": True, "timeout_s": 3600, "sync_buffers": False}
    path = write_config(tmp_path, DET_RUNTIME, DET_SCHEDULE, "strategy = 'single'\n")
    with pytest.raises(ConfigError, match=r"^env_cfg.dist_cfg.timeout: needs a strategy that starts a process group"):
        load_config(path, mode="train")


def test_segmentation_runtime_runs_unchanged(tmp_path):
    path = write_config(tmp_path, SEG_RUNTIME, SEG_SCHEDULE)
    cfg = load_config(path, mode="train")
    assert cfg["hooks"] == [
        {"type": "RuntimeEnvHook", "cudnn_benchmark": True, "mp_start_method": "fork", "opencv_num_threads": 0},
        # log_processor without window_size: MMEngine's 10 iterations, less than the interval
        {"type": "LoggerHook", "interval": 50, "window": 10, "by_epoch": False, "mean_keys": MMENGINE_MEAN_PATTERN,
         "writers": ["jsonl", "csv"]}]
    assert "tta_model" not in cfg and cfg["checkpoint"] == {"interval": 2000, "by_epoch": False, "keep": None}
    # run it short: 12 iterations, a record every 6 (the mean of the last 2 iterations)
    short = ["train_cfg.max_iters=12", "train_cfg.val_interval=6", "default_hooks.logger.interval=6",
             "log_processor.window_size=2", "default_hooks.checkpoint.interval=6", "param_scheduler.0.end=12"]
    cfg = load_config(path, short, mode="train", work_dir=str(tmp_path / "run"))
    assert cfg["hooks"][1] == {"type": "LoggerHook", "interval": 6, "window": 2, "by_epoch": False,
                               "mean_keys": MMENGINE_MEAN_PATTERN, "writers": ["jsonl", "csv"]}
    benchmark = torch.backends.cudnn.benchmark
    build_trainer(cfg).fit()
    assert torch.backends.cudnn.benchmark == benchmark  # set for the run, put back after it
    train = [r for r in records(tmp_path / "run") if r["mode"] == "train"]
    assert [r["iter"] for r in train] == [6, 12]


def test_segmentation_window_is_the_mean_of_the_last_iterations(tmp_path):
    from torch import nn
    from torch.utils.data import DataLoader

    import treadle
    from support import TinyNet, make_data

    losses = []

    class Grab(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            losses.append(float(outputs["loss"]))

    hook = treadle.hooks.LoggerHook(interval=6, writers=("jsonl",), window=2)
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(48), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.05), max_iters=12,
                        hooks=[hook, Grab()], progress=False)
    t.fit()
    train = [r for r in records(tmp_path) if r["mode"] == "train"]
    assert [r["loss"] for r in train] == pytest.approx([sum(losses[4:6]) / 2, sum(losses[10:12]) / 2], rel=1e-6)
    with pytest.raises(ValueError, match=r"LoggerHook window=0; expected an int >= 1"):
        treadle.hooks.LoggerHook(interval=6, window=0)


@pytest.mark.parametrize("backend, writers", [
    ({"type": "WandbVisBackend", "init_kwargs": {"project": "cls", "entity": "team"}},
     [{"type": "wandb", "project": "cls", "entity": "team"}]),
    ({"type": "WandbVisBackend", "init_kwargs": None, "commit": True, "watch_kwargs": None}, [{"type": "wandb"}]),
    ({"type": "MLflowVisBackend", "exp_name": "cls", "run_name": "r1", "tracking_uri": None, "tags": None},
     [{"type": "mlflow", "experiment": "cls", "run_name": "r1"}]),
    ({"type": "TensorboardVisBackend"}, ["tensorboard"]),
])
def test_vis_backends_become_log_writers(backend, writers):
    out = translate({"visualizer": {"type": "Visualizer", "vis_backends": [backend]}})
    assert out == {"log_writers": writers}


def test_mlflow_backend_runs_into_the_run_directory(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")  # an optional extra (treadle[trackers])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    path = write_config(tmp_path, CLS_RUNTIME, CLS_SCHEDULE, "visualizer = dict(type='UniversalVisualizer', "
                        "vis_backends=[dict(type='MLflowVisBackend', exp_name='cls')])\n")
    cfg = load_config(path, ["train_cfg.max_epochs=1"], mode="train", work_dir=str(tmp_path / "run"))
    assert cfg["log_writers"] == [{"type": "mlflow", "experiment": "cls"}]
    build_trainer(cfg).fit()
    assert (tmp_path / "run" / "mlruns").is_dir() and not (tmp_path / "run" / "log.jsonl").exists()


@pytest.mark.parametrize("cfg, message", [
    ({"default_hooks": {"visualization": {"type": "VisualizationHook", "enable": True}}},
     "default_hooks.visualization.enable: drawing is not supported (got True). treadle draws no images"),
    ({"default_hooks": {"visualization": {"type": "DetVisualizationHook", "draw": True, "interval": 1}}},
     "default_hooks.visualization.draw: drawing is not supported"),
    ({"custom_hooks": [{"type": "SimSiamHook"}], "default_scope": None},  # with a scope: its registries are asked
     "custom_hooks[0].type: unknown hook type (got 'SimSiamHook')"),
    ({"custom_hooks": [{"type": "EMAHook", "ema_type": "StochasticWeightAverage"}], "default_scope": "mmpretrain"},
     "custom_hooks[0].ema_type: unsupported average"),
    ({"env_cfg": {"dist_cfg": {"backend": "hccl"}}}, "env_cfg.dist_cfg.backend: unsupported process-group backend"),
    ({"env_cfg": {"dist_cfg": {"backend": "nccl", "port": 29500}}}, "env_cfg.dist_cfg.port: option has no treadle"),
    ({"env_cfg": {"dist_cfg": {"timeout": "1h"}}}, "env_cfg.dist_cfg.timeout: not a positive number of seconds"),
    ({"env_cfg": {"mp_cfg": {"mp_start_method": "thread"}}}, "env_cfg: mp_start_method='thread'; expected one of"),
    ({"env_cfg": {"cudnn_benchmark": "yes"}}, "env_cfg.cudnn_benchmark: not a bool"),
    ({"env_cfg": {"omp_num_threads": 1}}, "env_cfg.omp_num_threads: option has no treadle equivalent"),
    ({"log_level": "VERBOSE"}, "log_level: not a log level (got 'VERBOSE'); expected DEBUG or INFO"),
    ({"visualizer": {"type": "Visualizer", "vis_backends": [{"type": "ClearMLVisBackend"}]}},
     "visualizer.vis_backends[0].type: no treadle log writer for this backend (got 'ClearMLVisBackend')"),
    ({"visualizer": {"vis_backends": [{"type": "LocalVisBackend"}, {"type": "LocalVisBackend", "save_dir": "x"}]}},
     "visualizer.vis_backends[1].save_dir: option has no treadle equivalent"),
    ({"visualizer": {"vis_backends": [{"type": "WandbVisBackend", "watch_kwargs": {"log": "all"}}]}},
     "visualizer.vis_backends[0].watch_kwargs: option has no treadle equivalent"),
    ({"visualizer": {"type": "Visualizer", "save_dir": "vis"}}, "visualizer.save_dir: option has no treadle"),
    ({"visualizer": {"type": "DetLocalDrawer"}}, "visualizer.type: not a visualizer"),
    ({"launcher": "ray"}, "launcher: unsupported launcher (got 'ray'); expected one of none, pytorch, slurm, mpi"),
    ({"log_processor": {"window_size": "last"}},
     "log_processor.window_size: not a window (got 'last'); expected an int >= 1 (the last that many values), "
     "'epoch' or 'global'"),
    ({"log_processor": {"custom_cfg": [{"data_src": "loss", "method_name": "median"}]}},
     "log_processor.custom_cfg[0].method_name: no such statistic in treadle (got 'median')"),
    ({"log_processor": {"mean_pattern": 3}}, "log_processor.mean_pattern: not a regular expression"),
    ({"log_processor": {"log_with_hierarchy": True}}, "log_processor.log_with_hierarchy: option has no treadle"),
])
def test_runtime_values_treadle_cannot_honour_name_the_users_key(cfg, message):
    with pytest.raises(ConfigError) as e:
        translate({"default_scope": "x", **cfg})
    assert str(e.value).startswith(message)


def test_deterministic_wins_over_cudnn_benchmark_as_in_mmengine():
    out = translate({"env_cfg": {"cudnn_benchmark": True}, "randomness": {"seed": 0, "deterministic": True}})
    assert out == {"seed": 0, "deterministic": True}
    assert translate({"env_cfg": {"cudnn_benchmark": True}, "log_level": "WARNING"})["hooks"] == [
        {"type": "RuntimeEnvHook", "cudnn_benchmark": True, "log_level": "WARNING"}]


def test_helper_variables_and_unused_names_are_dropped_but_misspelt_keys_stay_errors(tmp_path, caplog):
    base = {"default_scope": "x", "data_root": "data/cifar10/", "crop": (32, 32),
            "train_dataloader": {"dataset": {"root": "data/cifar10/train", "size": [32, 32]}}}
    assert translate(base) == {"default_scope": "x", "train_dataloader": base["train_dataloader"]}
    assert "vis_backends" not in resolve_config({"default_scope": "x", "vis_backends": [{"type": "LocalVisBackend"}]})
    path = write_config(tmp_path, CLS_RUNTIME, CLS_SCHEDULE, "unknown_thing = dict(a=1)\n")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        assert "unknown_thing" not in load_config(path, mode="train")  # a variable nothing uses: MMEngine ignores it
    said = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    names = "dataset_type, num_samples, unknown_thing, vis_backends"
    assert len(said) == 1 and said[0] == f"{path}: not used (config variables that no treadle key takes): {names}"
    with pytest.raises(ConfigError, match=r"^--set unknown_thing.a: no treadle key, and nothing in the config uses"):
        load_config(path, ["unknown_thing.a=2"], mode="train")
    with pytest.raises(ConfigError, match=r"^max_epoch: unknown key.*Did you mean 'max_epochs'"):  # misspelt: kept
        load_config(write_config(tmp_path, CLS_RUNTIME, CLS_SCHEDULE, "max_epoch = 3\n"), mode="train")
    # a helper named like the key it feeds, beside that key (mmdet's grounding_dino): a variable
    helper = CLS_SCHEDULE.replace("max_epochs=2", "max_epochs=max_epoch") + (
        "param_scheduler = dict(type='MultiStepLR', by_epoch=True, milestones=[1], end=max_epoch)\n")
    cfg = load_config(write_config(tmp_path, CLS_RUNTIME, "max_epoch = 3\n" + helper), mode="train")
    assert cfg["max_epochs"] == 3 and "max_epoch" not in cfg
    cfg = load_config(write_config(tmp_path, CLS_RUNTIME, "max_epoch = 3\n" + helper), ["train_cfg.max_epochs=1"],
                      mode="train")  # the scheduler's end still uses it
    assert cfg["max_epochs"] == 1 and "max_epoch" not in cfg
    # evaluators are keys, never helpers, even when one reuses the other
    text = "val_evaluator = dict(type='Accuracy', topk=(1, 5))\ntest_evaluator = val_evaluator\n"
    cfg = load_config(write_config(tmp_path, CLS_RUNTIME, CLS_SCHEDULE, text), mode="train")
    assert cfg["val_evaluator"] == cfg["test_evaluator"] == {"type": "Accuracy", "topk": [1, 5]}


def test_runtime_env_hook_sets_and_restores(monkeypatch):
    calls = []
    fake_cv2 = types.SimpleNamespace(getNumThreads=lambda: 8, setNumThreads=calls.append)
    monkeypatch.setitem(sys.modules, "cv2", fake_cv2)
    logger = logging.getLogger(LOGGER_NAME)
    before = (torch.backends.cudnn.benchmark, multiprocessing.get_start_method(allow_none=True), logger.level,
              torch.get_num_threads())
    threads = 1 if before[3] > 1 else 2
    hook = RuntimeEnvHook(cudnn_benchmark=not before[0], mp_start_method="spawn", opencv_num_threads=0,
                          log_level="WARNING", open_files=64, torch_num_threads=threads)
    hook.before_run(None)
    assert torch.backends.cudnn.benchmark is (not before[0]) and multiprocessing.get_start_method() == "spawn"
    assert logger.level == logging.WARNING and calls == [0] and torch.get_num_threads() == threads
    hook.after_run(None)
    assert (torch.backends.cudnn.benchmark, multiprocessing.get_start_method(allow_none=True), logger.level,
            torch.get_num_threads()) == before
    assert calls == [0, 8]


@pytest.mark.parametrize("kwargs, match", [
    ({"mp_start_method": "thread"}, "mp_start_method='thread'; expected one of"),
    ({"opencv_num_threads": -1}, "opencv_num_threads must be an int >= 0"),
    ({"log_level": "debug"}, "log_level='debug'; expected one of"),
    ({"cudnn_benchmark": 1}, "cudnn_benchmark must be true, false or null"),
    ({"torch_num_threads": 0}, "torch_num_threads must be an int >= 1"),
])
def test_runtime_env_hook_errors(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        RuntimeEnvHook(**kwargs)


def test_a_short_string_is_a_helper_only_where_it_is_used_whole():
    cfg = {"default_scope": "x", "opt_name": "SG", "train_dataloader": {"dataset": {"kind": "SGD"}}}
    assert translate(cfg)["opt_name"] == "SG"  # not a helper: resolve_config drops it as an unused name
    assert "opt_name" not in resolve_config(cfg)
    assert "opt_name" not in translate({**cfg, "opt_name": "SGD"})


def test_a_helper_named_after_the_key_it_feeds_is_no_typo_but_a_near_miss_is():
    cfg = {"default_scope": "x", "interval": 10, "train_cfg": {"max_epochs": 20, "val_interval": 10}}
    assert resolve_config(cfg)["val_interval"] == 10  # interval = 10 used as val_interval (mmpose's rtmpose files)
    with pytest.raises(ConfigError, match=r"^interval: unknown key.*Did you mean"):
        resolve_config({**cfg, "interval": 3})  # used nowhere: read as a misspelt log_interval/val_interval
    with pytest.raises(ConfigError, match=r"^val_intervall: unknown key.*Did you mean 'val_interval'"):
        resolve_config({**cfg, "val_intervall": 5})  # a value the run would not get
    # the value val_interval has anyway: nothing is lost by leaving it out (max_epoch = 20 beside
    # train_cfg = dict(max_epochs=max_epoch), mmdet's grounding_dino)
    assert "val_intervall" not in resolve_config({**cfg, "val_intervall": 10})
