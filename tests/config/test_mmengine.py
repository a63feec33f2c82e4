"""MMEngine key names translated to treadle's."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from treadle.config import ConfigError, build_trainer, is_mmengine_style, load_config, resolve_config
from mm_support import translate  # less the Runner's defaults (test_mmengine.py: test_the_runners_defaults_...)
from treadle.openmmlab.translate import translate as translate_all

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mmengine_style" / "digits_mmengine.yaml"


def test_example_translates_to_treadle_keys():
    cfg = load_config(EXAMPLE, mode="train")
    assert cfg["optimizer"] == {"type": "AdamW", "lr": 2e-3, "weight_decay": 1e-4,
                                "paramwise": {"norm_decay_mult": 0.0, "bias_decay_mult": 0.0}}
    assert cfg["clip_grad"] == {"max_norm": 10.0}
    assert cfg["schedulers"] == [  # unchanged
        {"type": "LinearLR", "start_factor": 0.1, "by_epoch": False, "begin": 0, "end": 30},
        {"type": "CosineAnnealingLR", "by_epoch": True, "begin": 0, "T_max": 6, "convert_to_iter_based": True}]
    assert (cfg["max_epochs"], cfg["max_iters"], cfg["val_interval"]) == (6, None, 1)
    assert cfg["log_interval"] == 15
    assert cfg["checkpoint"] == {"interval": 1, "keep": 2, "best": "val/acc", "rule": "max"}
    assert cfg["ema"] == {"momentum": 0.99, "gamma": 100, "convention": "mmengine"}  # ExpMomentumEMA
    assert cfg["hooks"] == [{"type": "EarlyStoppingHook", "monitor": "val/acc", "rule": "greater", "patience": 3,
                             "min_delta": 0.001},
                            {"type": "RuntimeEnvHook", "torch_num_threads": 1}]
    assert cfg["seed"] == 0 and cfg["deterministic"] is False
    assert cfg["train_dataloader"]["sampler"] == {"type": "DefaultSampler", "shuffle": True}  # MMEngine's order
    assert not is_mmengine_style(cfg)


def test_amp_accumulation_and_iteration_loop():
    out = translate({"optim_wrapper": {"type": "AmpOptimWrapper", "dtype": "bfloat16", "accumulative_counts": 4,
                                       "optimizer": {"type": "SGD", "lr": 0.1}},
                     "train_cfg": {"type": "IterBasedTrainLoop", "max_iters": 100, "val_interval": 50},
                     "custom_hooks": [{"type": "EMAHook", "momentum": 0.0002, "begin_iter": 10, "priority": 49}],
                     "randomness": {"seed": 1, "diff_rank_seed": True}})
    assert out == {"optimizer": {"type": "SGD", "lr": 0.1}, "accumulate": 4, "accumulate_across_epochs": True,
                   "precision": "bf16", "max_iters": 100, "val_interval": 50,
                   "ema": {"momentum": 0.9998, "start": 10, "convention": "mmengine"}, "seed": 1, "seed_per_rank": True}


def test_disabled_and_implicit_default_hooks_are_dropped():
    out = translate({"default_hooks": {"timer": {"type": "IterTimerHook"}, "logger": None,
                                       "sampler_seed": {"type": "DistSamplerSeedHook"},
                                       "runtime_info": {"type": "RuntimeInfoHook"},
                                       "summary": {"type": "ModelSummaryHook", "max_depth": 1}}})
    assert out == {"hooks": [{"type": "ModelSummaryHook", "max_depth": 1}]}


@pytest.mark.parametrize("cfg, message", [
    ({"optim_wrapper": {"type": "ApexOptimWrapper", "optimizer": {}}},
     "optim_wrapper.type: unsupported optimizer wrapper (got 'ApexOptimWrapper')"),
    ({"optim_wrapper": {"optimizer": {"type": "SGD"}, "loss_scale": "dynamic"}},
     "optim_wrapper.loss_scale: option has no treadle equivalent (got 'dynamic')"),
    ({"train_cfg": {"by_epoch": True, "max_iters": 10}}, "train_cfg.max_iters: does not fit by_epoch=True"),
    ({"train_cfg": {"max_iters": 30, "val_begin": 20, "val_interval": 10}},
     "train_cfg.val_begin: has no treadle equivalent in an iteration-based loop (got 20)"),
    ({"val_cfg": {"type": "ValLoop", "fp16": True}}, "val_cfg: options have no treadle equivalent"),
    ({"default_hooks": {"checkpoint": {"type": "CheckpointHook", "out_dir": "s3://x"}}},
     "default_hooks.checkpoint.out_dir: option has no treadle equivalent"),
    ({"custom_hooks": [{"type": "EMAHook", "ema_type": "StochasticWeightAverage"}]},
     "custom_hooks[0].ema_type: unsupported average"),
    ({"custom_hooks": [{"type": "EMAHook", "begin_epoch": 2}]}, "custom_hooks[0].begin_epoch: option has no treadle"),
    ({"train_dataloader": {"dataset": {}, "sampler": "DefaultSampler"}, "train_cfg": {"max_epochs": 1}},
     "train_dataloader.sampler: unsupported sampler"),
])
def test_untranslatable_options_are_errors(cfg, message):
    with pytest.raises(ConfigError) as e:
        translate(cfg)
    assert str(e.value).startswith(message)


def test_overrides_use_mmengine_names_before_translation(tmp_path):
    cfg = load_config(EXAMPLE, ["train_cfg.max_epochs=1", "optim_wrapper.optimizer.lr=0.01"], mode="train")
    assert cfg["max_epochs"] == 1 and cfg["optimizer"]["lr"] == 0.01
    with pytest.raises(ConfigError, match=r"^--set max_epochs: max_epochs is a variable of this config: the run's "
                                          r"max_epochs comes from train_cfg.max_epochs .*expected --set "
                                          r"train_cfg.max_epochs=\.\.\."):
        load_config(EXAMPLE, ["max_epochs=1"], mode="train")


def test_a_runner_key_wins_over_a_top_level_variable_of_the_same_name_as_in_mmengine():
    replaced: dict[str, str] = {}
    out = translate({"optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}}, "optimizer": {"type": "SGD", "lr": 0.2},
                     "train_cfg": {"max_epochs": 3}, "max_epochs": 1}, replaced)
    assert out == {"optimizer": {"type": "SGD", "lr": 0.1}, "max_epochs": 3}
    assert replaced == {"optimizer": "optim_wrapper.optimizer", "max_epochs": "train_cfg.max_epochs"}
    # two MMEngine keys that disagree stay an error
    with pytest.raises(ConfigError, match=r"^strategy.gradient_clipping: sets 'clip_grad', which optim_wrapper.clip_grad also"):
        translate({"strategy": {"type": "DeepSpeedStrategy", "gradient_clipping": 1.0},
                   "optim_wrapper": {"optimizer": {"type": "SGD"}, "clip_grad": {"max_norm": 2.0}}})


def test_set_of_the_runner_key_works_where_the_file_has_a_helper_variable(tmp_path):
    path = tmp_path / "c.py"
    path.write_text(f"_base_ = [{str(EXAMPLE)!r}]\nmax_epochs = 7\ntrain_cfg = dict(max_epochs=max_epochs)\n")
    assert load_config(path, mode="train")["max_epochs"] == 7
    assert load_config(path, ["train_cfg.max_epochs=2"], mode="train")["max_epochs"] == 2


# -- MMEngine's defaults and semantics that differ from treadle's -------------------------
TINY_MM = {
    "model": {"type": "support.TinyNet"},
    "train_dataloader": {"dataset": {"type": "support.make_data", "n": 16}, "batch_size": 8,
                         "sampler": {"type": "DefaultSampler", "shuffle": False}},
    "loss_fn": {"type": "CrossEntropyLoss"},
    "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}},
    "train_cfg": {"by_epoch": True, "max_epochs": 2},
    "default_hooks": {"logger": {"type": "LoggerHook", "interval": 1}},
    "log_writers": ["jsonl"],
    "progress": False,
}


def _mm(**changes):
    return {**TINY_MM, **changes}


def test_auto_scale_lr_without_enable_is_off_as_in_mmengine():
    out = translate(_mm(auto_scale_lr={"base_batch_size": 256}))
    assert out["auto_scale_lr"] == {"base_batch_size": 256, "enable": False}
    for enable in (True, False):  # given: kept as it is
        assert translate(_mm(auto_scale_lr={"base_batch_size": 256, "enable": enable}))["auto_scale_lr"] == \
            {"base_batch_size": 256, "enable": enable}
    assert translate(_mm(auto_scale_lr=None))["auto_scale_lr"] is None
    # The built optimizer keeps the configured lr (MMEngine leaves it at 0.1 too).
    trainer = build_trainer(resolve_config(_mm(auto_scale_lr={"base_batch_size": 256}), mode="train"))
    assert trainer.optimizer.param_groups[0]["lr"] == 0.1
    trainer = build_trainer(resolve_config(_mm(auto_scale_lr={"base_batch_size": 256, "enable": True}), mode="train"))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 8 / 256)


@pytest.mark.parametrize("hook, keep", [
    ({"type": "CheckpointHook", "interval": 1}, None),  # MMEngine's default max_keep_ckpts=-1 keeps all
    ({"type": "CheckpointHook", "interval": 1, "max_keep_ckpts": -1}, None),
    ({"type": "CheckpointHook", "interval": 1, "max_keep_ckpts": 2}, 2),
])
def test_checkpoint_keep_follows_max_keep_ckpts(hook, keep):
    assert translate_all({"default_hooks": {"checkpoint": hook}})["checkpoint"] == {"interval": 1, "keep": keep}


@pytest.mark.parametrize("cfg, want", [
    ({}, {"strategy": {"type": "auto", "sync_buffers": False}, "checkpoint": {"interval": 1, "keep": None},
          "log_interval": 10}),
    ({"train_cfg": {"type": "IterBasedTrainLoop", "max_iters": 3000}},  # the default checkpoint: the last one
     {"strategy": {"type": "auto", "sync_buffers": False}, "checkpoint": {"interval": None, "keep": None},
      "log_interval": 10, "max_iters": 3000, "val_interval": 1000}),
    ({"default_hooks": {"checkpoint": None, "logger": {"type": "LoggerHook", "interval": 5}}, "strategy": "ddp",
      "find_unused_parameters": True},  # the CheckpointHook switched off: no checkpoint
     {"strategy": {"type": "ddp", "sync_buffers": False, "find_unused_parameters": True}, "log_interval": 5,
      "checkpoint": False}),
    ({"model_wrapper_cfg": {"type": "MMDistributedDataParallel", "find_unused_parameters": True}},
     {"strategy": {"type": "auto", "find_unused_parameters": True}, "checkpoint": {"interval": 1, "keep": None},
      "log_interval": 10}),
    ({"strategy": {"type": "fsdp"}, "default_hooks": {"checkpoint": {"type": "CheckpointHook"}}},
     {"strategy": {"type": "fsdp"}, "checkpoint": {"interval": None, "keep": None}, "log_interval": 10}),
])
def test_the_runners_defaults_hold_where_the_config_says_nothing(cfg, want):
    """MMEngine's Runner wraps the model in MMDistributedDataParallel without a buffer broadcast
    (or as model_wrapper_cfg says), saves each epoch and logs every 10 iterations by default
    (a CheckpointHook of its own saves the last only), and validates an iteration loop every 1000."""
    assert translate_all({"randomness": {"seed": 0}, **cfg}) == {"seed": 0, **want}


def test_early_stopping_and_value_clipping_take_mmengines_defaults():
    out = translate({"custom_hooks": [{"type": "EarlyStoppingHook", "monitor": "accuracy/top1"}],
                     "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1},
                                       "clip_grad": {"type": "value", "clip_value": 0.5}}})
    assert out["hooks"] == [{"type": "EarlyStoppingHook", "monitor": "val/accuracy/top1", "min_delta": 0.1}]
    assert out["clip_grad"] == {"value": 0.5}
    assert translate({"optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1},
                                        "clip_grad": {"type": "norm", "max_norm": 1.0}}})["clip_grad"] == {"max_norm": 1.0}
    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\].stopping_threshold: option has no treadle equivalent"):
        translate({"custom_hooks": [{"type": "EarlyStoppingHook", "monitor": "acc", "stopping_threshold": 0.9}]})


def test_checkpoint_hook_without_max_keep_ckpts_keeps_every_checkpoint(tmp_path):
    cfg = _mm(work_dir=str(tmp_path), train_cfg={"max_epochs": 5},
              default_hooks={"checkpoint": {"type": "CheckpointHook", "interval": 1}})
    build_trainer(resolve_config(cfg, mode="train")).fit()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("epoch_")) == \
        [f"epoch_{i:04d}" for i in range(1, 6)]


def test_resume_true_with_load_from_resumes_from_it(tmp_path):
    first = tmp_path / "first"
    build_trainer(resolve_config(_mm(work_dir=str(first), default_hooks={
        "checkpoint": {"type": "CheckpointHook", "interval": 1}}), mode="train")).fit()
    ckpt = str(first / "checkpoints" / "epoch_0001")
    out = translate(_mm(resume=True, load_from=ckpt))
    assert out["resume"] == ckpt and "load_from" not in out
    # MMEngine: the full state of epoch 1 (iteration 2) is restored and only epoch 2 is trained.
    second = tmp_path / "second"
    trainer = build_trainer(resolve_config(_mm(work_dir=str(second), resume=True, load_from=ckpt), mode="train"))
    trainer.fit()
    records = [json.loads(line) for line in (second / "log.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if r["mode"] == "train"] == [3, 4]
    assert (trainer.state.epoch, trainer.state.iter) == (2, 4)


def test_load_from_without_resume_stays_weights_only(tmp_path):
    for cfg in (_mm(load_from="ckpt"), _mm(resume=False, load_from="ckpt")):
        out = translate(cfg)
        assert out["load_from"] == "ckpt" and out.get("resume", False) is False
    assert translate(_mm(resume=True))["resume"] is True  # no load_from: the latest checkpoint in work_dir


def test_ema_update_buffers():
    # treadle averages buffers: what MMEngine does with update_buffers=True.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = translate({"custom_hooks": [{"type": "EMAHook", "momentum": 0.001, "update_buffers": True}]})
    assert out == {"ema": {"momentum": 0.999, "convention": "mmengine"}}
    with pytest.raises(ConfigError) as e:  # copying buffers is not something treadle's EMA can do
        translate({"custom_hooks": [{"type": "EMAHook", "update_buffers": False}]})
    assert str(e.value).startswith("custom_hooks[0].update_buffers: option has no treadle equivalent for this value "
                                   "(got False); expected update_buffers: true (what treadle does), or no "
                                   "update_buffers. treadle's EMA averages the buffers")
    # MMEngine's default (False) differs from treadle's averaging: said, not dropped silently.
    with pytest.warns(UserWarning, match=r"custom_hooks\[0\]: EMAHook without update_buffers: MMEngine then copies"):
        assert translate({"custom_hooks": [{"type": "EMAHook", "momentum": 0.001}]}) == {
            "ema": {"momentum": 0.999, "convention": "mmengine"}}


def test_logger_hook_options_treadle_matches_are_dropped_and_the_others_refused():
    hook = {"type": "LoggerHook", "interval": 5, "ignore_last": True, "log_metric_by_epoch": False,
            "interval_exp_name": 100}
    assert translate({"default_hooks": {"logger": hook}}) == {"log_interval": 5}
    with pytest.raises(ConfigError) as e:
        translate({"default_hooks": {"logger": {"type": "LoggerHook", "log_metric_by_epoch": True}}})
    assert str(e.value).startswith("default_hooks.logger.log_metric_by_epoch: option has no treadle equivalent for "
                                   "this value (got True); expected log_metric_by_epoch: false (what treadle does)")
    assert "validation results at the iteration" in str(e.value)
    with pytest.raises(ConfigError, match=r"^default_hooks.logger.ignore_last: not a bool \(got 1\)"):
        translate({"default_hooks": {"logger": {"type": "LoggerHook", "ignore_last": 1}}})


def test_logger_hook_ignore_last_false_logs_every_epoch_end(tmp_path):
    out = translate({"default_hooks": {"logger": {"type": "LoggerHook", "interval": 3, "ignore_last": False}},
                     "visualizer": {"type": "Visualizer", "vis_backends": [{"type": "LocalVisBackend"}]}})
    assert out == {"log_interval": 3, "log_writers": ["jsonl", "csv"], "hooks": [
        {"type": "LoggerHook", "interval": 3, "ignore_last": False, "writers": ["jsonl", "csv"]}]}
    # 2 epochs of 5 iterations: records at 3 and 5 (the epoch's leftovers), 8 and 10
    cfg = _mm(work_dir=str(tmp_path), train_dataloader={**TINY_MM["train_dataloader"], "dataset": {
        "type": "support.make_data", "n": 40}}, default_hooks={"logger": {"type": "LoggerHook", "interval": 3,
                                                                       "ignore_last": False}})
    build_trainer(resolve_config(cfg, mode="train")).fit()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if r["mode"] == "train"] == [3, 5, 8, 10]
