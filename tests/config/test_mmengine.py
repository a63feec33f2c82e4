"""MMEngine key names translated to treadle's."""

from __future__ import annotations

from pathlib import Path

import pytest

from treadle.config import ConfigError, is_mmengine_style, load_config, translate

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
    assert cfg["ema"] == {"momentum": 0.999}
    assert cfg["hooks"] == [{"type": "EarlyStoppingHook", "monitor": "val/acc", "rule": "greater", "patience": 3}]
    assert cfg["seed"] == 0 and cfg["deterministic"] is False
    assert cfg["train_dataloader"]["shuffle"] is True and "sampler" not in cfg["train_dataloader"]
    assert not is_mmengine_style(cfg)


def test_amp_accumulation_and_iteration_loop():
    out = translate({"optim_wrapper": {"type": "AmpOptimWrapper", "dtype": "bfloat16", "accumulative_counts": 4,
                                       "optimizer": {"type": "SGD", "lr": 0.1}},
                     "train_cfg": {"type": "IterBasedTrainLoop", "max_iters": 100, "val_interval": 50},
                     "custom_hooks": [{"type": "EMAHook", "momentum": 0.0002, "begin_iter": 10, "priority": 49}],
                     "randomness": {"seed": 1, "diff_rank_seed": True}})
    assert out == {"optimizer": {"type": "SGD", "lr": 0.1}, "accumulate": 4, "precision": "bf16", "max_iters": 100,
                   "val_interval": 50, "ema": {"momentum": 0.9998, "start": 10}, "seed": 1, "seed_per_rank": True}


def test_disabled_and_implicit_default_hooks_are_dropped():
    out = translate({"default_hooks": {"timer": {"type": "IterTimerHook"}, "logger": None,
                                       "sampler_seed": {"type": "DistSamplerSeedHook"},
                                       "runtime_info": {"type": "RuntimeInfoHook"},
                                       "summary": {"type": "ModelSummaryHook", "max_depth": 1}}})
    assert out == {"hooks": [{"type": "ModelSummaryHook", "max_depth": 1}]}


@pytest.mark.parametrize("cfg, message", [
    ({"optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}}, "optimizer": {"type": "SGD", "lr": 0.1}},
     "optim_wrapper.optimizer: sets 'optimizer', which the config also gives directly"),
    ({"train_cfg": {"max_epochs": 3}, "max_epochs": 1},
     "train_cfg.max_epochs: sets 'max_epochs', which the config also gives directly"),
    ({"optim_wrapper": {"type": "DeepSpeedOptimWrapper", "optimizer": {}}},
     "optim_wrapper.type: unsupported optimizer wrapper (got 'DeepSpeedOptimWrapper')"),
    ({"optim_wrapper": {"optimizer": {"type": "SGD"}, "loss_scale": "dynamic"}},
     "optim_wrapper.loss_scale: option has no treadle equivalent (got 'dynamic')"),
    ({"train_cfg": {"by_epoch": True, "max_iters": 10}}, "train_cfg.max_iters: does not fit by_epoch=True"),
    ({"train_cfg": {"max_epochs": 3, "val_begin": 2}}, "train_cfg.val_begin: option has no treadle equivalent"),
    ({"val_cfg": {"type": "ValLoop", "fp16": True}}, "val_cfg: options have no treadle equivalent"),
    ({"default_hooks": {"checkpoint": {"type": "CheckpointHook", "save_best": "auto"}}},
     "default_hooks.checkpoint.save_best: 'auto' is not supported"),
    ({"default_hooks": {"checkpoint": {"type": "CheckpointHook", "out_dir": "s3://x"}}},
     "default_hooks.checkpoint.out_dir: option has no treadle equivalent"),
    ({"custom_hooks": [{"type": "EMAHook", "ema_type": "StochasticWeightAverage"}]},
     "custom_hooks[0].ema_type: unsupported average"),
    ({"custom_hooks": [{"type": "EMAHook", "begin_epoch": 2}]}, "custom_hooks[0].begin_epoch: option has no treadle"),
    ({"train_dataloader": {"dataset": {}, "sampler": {"type": "RepeatAugSampler"}}, "train_cfg": {"max_epochs": 1}},
     "train_dataloader.sampler: unsupported sampler"),
])
def test_untranslatable_options_are_errors(cfg, message):
    with pytest.raises(ConfigError) as e:
        translate(cfg)
    assert str(e.value).startswith(message)


def test_overrides_use_mmengine_names_before_translation(tmp_path):
    cfg = load_config(EXAMPLE, ["train_cfg.max_epochs=1", "optim_wrapper.optimizer.lr=0.01"], mode="train")
    assert cfg["max_epochs"] == 1 and cfg["optimizer"]["lr"] == 0.01
    with pytest.raises(ConfigError, match="train_cfg.max_epochs: sets 'max_epochs'"):
        load_config(EXAMPLE, ["max_epochs=1"], mode="train")
