"""Errors name the key as the config file wrote it: a translated MMEngine key by its MMEngine
path (``custom_hooks[1]``, ``param_scheduler[1]``), never by the treadle key it became."""

from __future__ import annotations

import pytest

from treadle.config import ConfigError, build_trainer, load_config
from treadle.config.origins import ResolvedConfig, in_user_terms, user_path
from treadle.config.resolve import dump_config

BASE = """
model = dict(type='support.TinyNet')
loss_fn = dict(type='CrossEntropyLoss')
train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=8),
                        sampler=dict(type='DefaultSampler', shuffle=True))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1), clip_grad=dict(max_norm=1.0))
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, end=2), dict(type='StepLR', step_size=1)]
train_cfg = dict(by_epoch=True, max_epochs=1)
env_cfg = dict(cudnn_benchmark=True)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=2))
custom_hooks = [dict(type='SyncBuffersHook'), dict(type='EarlyStoppingHook', monitor='val/acc', patience=2)]
"""


def build(tmp_path, *overrides):
    path = tmp_path / "mm.py"
    path.write_text(BASE)
    return build_trainer(load_config(path, list(overrides), mode="train", work_dir=str(tmp_path / "w")))


@pytest.mark.parametrize("override, message", [
    # a hook's constructor refuses a value: the hook is the file's custom_hooks[1] (hooks[2] once translated)
    ("custom_hooks.1.patience=0", r"^custom_hooks\[1\]: EarlyStoppingHook\(.*patience=0.*\) failed: ValueError: patience"),
    ("custom_hooks.1.patiense=2", r"^custom_hooks\[1\]\.patiense: unknown argument for EarlyStoppingHook"),
    ("custom_hooks.0.type=SyncBufersHook", r"^custom_hooks\[0\]\.type: unknown hook type"),
    # the Trainer's scheduler builder
    ("param_scheduler.1.step_size=null", r"^param_scheduler\[1\] \(StepLR\): `step_size`=None has the wrong type"),
    ("param_scheduler.0.start_factor=1.5", r"^param_scheduler\[0\] \(LinearLR\): .*start_factor"),
    # the schema's checks of translated keys
    ("optim_wrapper.optimizer.lr=-1", r"^optim_wrapper\.optimizer\.lr: out of range"),
    ("default_hooks.checkpoint.max_keep_ckpts=x", r"^default_hooks\.checkpoint\.max_keep_ckpts must be an int"),
    ("optim_wrapper.clip_grad.max_norm=x", r"^optim_wrapper\.clip_grad"),
    ("train_cfg.max_epochs=0", r"^train_cfg\.max_epochs: "),
])
def test_an_mmengine_files_error_names_its_own_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        build(tmp_path, override)


def test_the_resolved_config_carries_the_origins_and_dumps_as_plain_yaml(tmp_path):
    path = tmp_path / "mm.py"
    path.write_text(BASE)
    cfg = load_config(path, mode="train")
    assert isinstance(cfg, ResolvedConfig) and isinstance(cfg, dict)
    assert cfg["hooks"][0]["type"] == "RuntimeEnvHook" and cfg.origins["hooks[0]"] == "env_cfg"
    assert cfg.origins["hooks[2]"] == "custom_hooks[1]" and cfg.origins["schedulers"] == "param_scheduler"
    assert cfg.origins["checkpoint.keep"] == "default_hooks.checkpoint.max_keep_ckpts"
    assert "origins" not in dump_config(cfg) and "!!python" not in dump_config(cfg)


def test_a_treadle_config_keeps_its_own_paths(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("model: {type: support.TinyNet}\nhooks: [{type: SyncBuffersHook}, {type: EarlyStoppingHook, "
                    "monitor: val/acc, patience: 0}]\n")
    cfg = load_config(path)
    assert cfg.origins == {}
    with pytest.raises(ConfigError, match=r"^hooks\[1\]: EarlyStoppingHook"):
        build_trainer(cfg, "validate")


def test_user_path_takes_the_longest_recorded_prefix_and_only_whole_segments():
    origins = {"hooks": "custom_hooks", "hooks[2]": "custom_hooks[1]", "optimizer": "optim_wrapper.optimizer",
               "optimizer.paramwise": "optim_wrapper.paramwise_cfg"}
    assert user_path("hooks[2].patience", origins) == "custom_hooks[1].patience"
    assert user_path("optimizer.paramwise.norm_decay_mult", origins) == "optim_wrapper.paramwise_cfg.norm_decay_mult"
    assert user_path("optimizer.lr", origins) == "optim_wrapper.optimizer.lr"
    assert user_path("optimizers", origins) == "optimizers"  # not a segment of "optimizer"
    err = ConfigError("", "hooks[2] (EarlyStoppingHook) lacks ...")
    assert str(in_user_terms(err, origins)) == "custom_hooks[1] (EarlyStoppingHook) lacks ..."
    assert in_user_terms(err, {}) is err
    option = ConfigError("", "checkpoint best='x' is not among the validation results")  # the Trainer's style
    origins = {"checkpoint": "default_hooks.checkpoint", "checkpoint.best": "default_hooks.checkpoint.save_best"}
    assert str(in_user_terms(option, origins)) == "default_hooks.checkpoint.save_best='x' is not among the validation results"
