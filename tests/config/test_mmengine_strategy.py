"""FlexibleRunner's ``strategy`` dicts (DDPStrategy, FSDPStrategy) translated to treadle's
strategies; what treadle cannot honour is an error naming the key as written."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
import torch
from torch import nn

from support import fsdp_on_cpu
from treadle.config import ConfigError, build_trainer, load_config
from mm_support import translate  # less the Runner's defaults (test_mmengine.py: test_the_runners_defaults_...)
from treadle.strategies.build import resolve_strategy
from treadle.strategies.ddp import DDPStrategy
from treadle.strategies.fsdp import FSDPStrategy

WRAP_POLICY = "torch.distributed.fsdp.wrap.transformer_auto_wrap_policy"


class Block(nn.Module):
    """A layer for the FSDP wrap policy."""


def strategy_of(spec: dict) -> object:
    return translate({"strategy": spec})["strategy"]


def test_ddp_strategy_keeps_mmengines_default_wrapper_without_buffer_broadcast():
    out = strategy_of({"type": "DDPStrategy"})
    assert out == {"type": "ddp", "sync_buffers": False}  # MMEngine's default wrapper: broadcast_buffers=False
    built = resolve_strategy(out)
    assert isinstance(built, DDPStrategy) and built.sync_buffers is False


def test_ddp_strategy_model_wrapper_options():
    out = strategy_of({"type": "DDPStrategy", "sync_bn": None, "model_wrapper": {
        "type": "MMDistributedDataParallel", "find_unused_parameters": True, "static_graph": False,
        "detect_anomalous_params": False}})
    # a model_wrapper without broadcast_buffers: torch's default (True), treadle's too
    assert out == {"type": "ddp", "find_unused_parameters": True, "static_graph": False}
    built = resolve_strategy(out)
    assert built.find_unused_parameters is True and built.sync_buffers is True
    out = strategy_of({"type": "DDPStrategy", "model_wrapper": {"broadcast_buffers": False,
                                                                "gradient_as_bucket_view": False}})
    assert out == {"type": "ddp", "sync_buffers": False, "gradient_as_bucket_view": False}


def test_fsdp_strategy_options():
    out = strategy_of({"type": "FSDPStrategy", "state_dict_cfg": "local", "skip_init_weights": False, "model_wrapper": {
        "type": "MMFullyShardedDataParallel",
        "auto_wrap_policy": {"type": WRAP_POLICY, "transformer_layer_cls": {Block}},
        "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32", "buffer_dtype": None},
        "sharding_strategy": "SHARD_GRAD_OP", "cpu_offload": True, "use_orig_params": True}})
    assert out == {"type": "fsdp", "wrap": [Block], "cpu_offload": True, "reshard_after_forward": False,
                   "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}
    built = resolve_strategy(out)
    assert isinstance(built, FSDPStrategy) and built.reshard_after_forward is False and built.cpu_offload is True
    assert built.mp_policy.param_dtype is torch.bfloat16 and built.mp_policy.reduce_dtype is torch.float32
    out = strategy_of({"type": "FSDPStrategy", "state_dict_cfg": {"state_dict_type": "SHARDED_STATE_DICT"},
                       "model_wrapper": {"sharding_strategy": "FULL_SHARD", "cpu_offload": {"offload_params": False},
                                         "auto_wrap_policy": {"type": "transformer_auto_wrap_policy",
                                                              "transformer_layer_cls": ["Block", "Attention"]}}})
    assert out == {"type": "fsdp", "wrap": ["Attention", "Block"], "cpu_offload": False, "reshard_after_forward": True}
    assert strategy_of({"type": "FSDPStrategy"}) == {"type": "fsdp"}
    assert strategy_of({"type": "SingleDeviceStrategy"}) == "single"


@pytest.mark.parametrize("sharding, reshard", [("HYBRID_SHARD", True), ("_HYBRID_SHARD_ZERO2", False)])
def test_hybrid_shard_is_hsdp_sharded_within_a_node(sharding, reshard):
    """FSDP1's HYBRID_SHARD shards within a node and replicates across nodes: HSDP on
    dp_shard='node', dp_replicate=-1 (16 processes, 8 per node: 2 replicas of 8 shards)."""
    out = strategy_of({"type": "FSDPStrategy", "model_wrapper": {"sharding_strategy": sharding}})
    assert out == {"type": "fsdp", "reshard_after_forward": reshard, "dp_replicate": -1, "dp_shard": "node"}
    shape = resolve_strategy(out).shape.resolve(16, local_world_size=8)
    assert (shape.dp_replicate, shape.dp_shard, shape.tp) == (2, 8, 1)


def test_deepspeed_strategy_keys_become_the_trainers_settings_and_the_rest_its_config(tmp_path):
    """MMEngine's DeepSpeedStrategy: clipping, accumulation and precision are the Trainer's
    settings (they write DeepSpeed's config); the stage and the rest are the strategy's,
    from the dict and from a JSON file alike. (Building the strategy needs deepspeed.)"""
    spec = {"type": "DeepSpeedStrategy", "gradient_clipping": 1.0, "gradient_accumulation_steps": 2,
            "bf16": {"enabled": True}, "inputs_to_half": ["inputs"], "steps_per_print": 10,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "train_micro_batch_size_per_gpu": 4}
    out = translate({"strategy": spec, "optim_wrapper": {"type": "DeepSpeedOptimWrapper",
                                                         "optimizer": {"type": "AdamW", "lr": 1e-3}}})
    assert out["strategy"] == {"type": "deepspeed", "zero_stage": 3, "config": {
        "zero_optimization": {"stage3_param_persistence_threshold": 0}, "train_micro_batch_size_per_gpu": 4}}
    assert (out["clip_grad"], out["accumulate"], out["precision"]) == ({"max_norm": 1.0}, 2, "bf16")
    assert out["optimizer"] == {"type": "AdamW", "lr": 1e-3}
    built_from = out["strategy"]

    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1}, "fp16": {"enabled": True},
                                                  "gradient_clipping": 0.0}))
    out = translate({"strategy": {"type": "DeepSpeedStrategy", "config": str(tmp_path / "ds.json")}})
    assert out["strategy"] == {"type": "deepspeed", "zero_stage": 1, "config": {}}
    assert out["precision"] == "16" and "clip_grad" not in out
    with pytest.raises(ConfigError, match=r"strategy.gradient_clipping: sets 'clip_grad', which optim_wrapper.clip_grad also"):
        translate({"strategy": {"type": "DeepSpeedStrategy", "gradient_clipping": 1.0},
                   "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}, "clip_grad": {"max_norm": 2.0}}})

    pytest.importorskip("deepspeed")  # an optional extra: the strategy checks it is installed
    from treadle.strategies.deepspeed import DeepSpeedStrategy

    built = resolve_strategy(built_from)  # deepspeed itself is imported by setup() only
    assert isinstance(built, DeepSpeedStrategy) and built.zero_stage == 3


def test_strategy_file_merges_dist_timeout_and_trains_on_one_process(tmp_path):
    (tmp_path / "config.py").write_text(textwrap.dedent("""
        model = dict(type='support.TinyNet')
        loss_fn = dict(type='CrossEntropyLoss')
        train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=16),
                                sampler=dict(type='DefaultSampler', shuffle=True))
        optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
        train_cfg = dict(by_epoch=True, max_epochs=1)
        env_cfg = dict(dist_cfg=dict(backend='gloo', timeout=600))
        strategy = dict(type='DDPStrategy', model_wrapper=dict(type='MMDistributedDataParallel',
                                                               find_unused_parameters=True))
        progress = False
    """))
    cfg = load_config(tmp_path / "config.py", mode="train", work_dir=str(tmp_path / "run"))
    assert cfg["strategy"] == {"type": "ddp", "find_unused_parameters": True, "timeout_s": 600}
    trainer = build_trainer(cfg)
    trainer.fit()
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.strategy.find_unused_parameters is True
    lines = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert lines and lines[-1]["iter"] == 4


@pytest.mark.parametrize("spec, message", [
    ({"type": "DeepSpeedStrategy", "exclude_frozen_parameters": True},
     "strategy.exclude_frozen_parameters: option has no treadle equivalent for this value (got True)"),
    ({"type": "DeepSpeedStrategy", "config": 3}, "strategy.config: must be a mapping or a JSON file's path (got 3)"),
    ({"type": "DeepSpeedStrategy", "config": "/nonexistent/ds.json"},
     "strategy.config: cannot read the DeepSpeed JSON file"),
    ({"type": "ColossalAIStrategy"}, "strategy.type: ColossalAI is not supported"),
    ({"type": "DDPStrategy", "sync_bn": "mmcv"}, "strategy.sync_bn: no such SyncBatchNorm implementation in treadle "
     "(got 'mmcv'); expected 'torch' (torch's SyncBatchNorm; treadle's own on the CPU) or null. mmcv's"),
    ({"type": "DDPStrategy", "sync_bn": True}, "strategy.sync_bn: no such SyncBatchNorm implementation in treadle "
     "(got True)"),
    ({"type": "DDPStrategy", "env_kwargs": {}}, "strategy.env_kwargs: option has no treadle equivalent"),
    ({"type": "DDPStrategy", "model_wrapper": {"type": "MMSeparateDistributedDataParallel"}},
     "strategy.model_wrapper.type: unsupported model wrapper (got 'MMSeparateDistributedDataParallel')"),
    ({"type": "DDPStrategy", "model_wrapper": {"bucket_cap_mb": 25}},
     "strategy.model_wrapper.bucket_cap_mb: option has no treadle equivalent (got 25)"),
    ({"type": "DDPStrategy", "model_wrapper": {"detect_anomalous_params": True}},
     "strategy.model_wrapper.detect_anomalous_params: option has no treadle equivalent for this value"),
    ({"type": "FSDPStrategy", "state_dict_cfg": "full"},
     "strategy.state_dict_cfg: option has no treadle equivalent (got 'full'); expected local"),
    ({"type": "FSDPStrategy", "state_dict_cfg": {"state_dict_type": "FULL_STATE_DICT"}},
     "strategy.state_dict_cfg: option has no treadle equivalent"),
    ({"type": "FSDPStrategy", "state_dict_cfg": {"state_dict_type": "LOCAL_STATE_DICT", "state_dict_config": {}}},
     "strategy.state_dict_cfg.state_dict_config: option has no treadle equivalent"),
    ({"type": "FSDPStrategy", "activation_checkpointing": {"check_fn": "CustomCheckFn"}},
     "strategy.activation_checkpointing.check_fn: a name in MMEngine's FUNCTIONS registry (got 'CustomCheckFn'); "
     "expected the function, its dotted import path, or {type: path, **kwargs}. treadle does not read"),
    ({"type": "FSDPStrategy", "activation_checkpointing": {"check_fn": {"type": "CustomCheckFn", "x": 1}}},
     "strategy.activation_checkpointing.check_fn: a name in MMEngine's FUNCTIONS registry (got 'CustomCheckFn')"),
    ({"type": "FSDPStrategy", "activation_checkpointing": {"check_fn": 3}},
     "strategy.activation_checkpointing.check_fn: not a function (got 3)"),
    ({"type": "FSDPStrategy", "activation_checkpointing": {"check_fn": print, "checkpoint_wrapper_fn": print}},
     "strategy.activation_checkpointing.checkpoint_wrapper_fn: option has no treadle equivalent"),
    ({"type": "FSDPStrategy", "activation_checkpointing": ["Block"]},
     "strategy.activation_checkpointing: must be a mapping (got ['Block']); expected {check_fn: fn}"),
    ({"type": "FSDPStrategy", "model_wrapper": {"auto_wrap_policy": {
        "type": "torch.distributed.fsdp.wrap.size_based_auto_wrap_policy", "min_num_params": 10_000_000}}},
     "strategy.model_wrapper.auto_wrap_policy: wrap policy has no treadle equivalent "
     "(got 'size_based_auto_wrap_policy')"),
    ({"type": "FSDPStrategy", "model_wrapper": {"auto_wrap_policy": "my_policy"}},
     "strategy.model_wrapper.auto_wrap_policy: wrap policy has no treadle equivalent (got 'my_policy')"),
    ({"type": "FSDPStrategy", "model_wrapper": {"auto_wrap_policy": {"type": WRAP_POLICY}}},
     "strategy.model_wrapper.auto_wrap_policy.transformer_layer_cls: not a set of layer classes (got None)"),
    ({"type": "FSDPStrategy", "model_wrapper": {"sharding_strategy": "NO_SHARD"}},
     "strategy.model_wrapper.sharding_strategy: sharding strategy has no treadle equivalent (got 'NO_SHARD')"),
    ({"type": "FSDPStrategy", "model_wrapper": {"mixed_precision": {"buffer_dtype": "float16"}}},
     "strategy.model_wrapper.mixed_precision.buffer_dtype: option has no treadle equivalent (got 'float16')"),
    ({"type": "FSDPStrategy", "model_wrapper": {"use_orig_params": False}},
     "strategy.model_wrapper.use_orig_params: option has no treadle equivalent for this value (got False)"),
    ({"type": "FSDPStrategy", "model_wrapper": {"backward_prefetch": "BACKWARD_PRE"}},
     "strategy.model_wrapper.backward_prefetch: option has no treadle equivalent"),
    ({"type": "SingleDeviceStrategy", "env_kwargs": {}}, "strategy.env_kwargs: option has no treadle equivalent"),
])
def test_strategy_options_treadle_cannot_honour_name_the_key(spec, message):
    with pytest.raises(ConfigError) as e:
        translate({"strategy": spec})
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # two processes through `treadle train --nproc 2`
@pytest.mark.parametrize("strategy, kind", [
    ("dict(type='DDPStrategy', model_wrapper=dict(find_unused_parameters=False))", "DDPStrategy"),
    pytest.param("dict(type='FSDPStrategy', model_wrapper=dict(sharding_strategy='FULL_SHARD'))", "FSDPStrategy",
                 marks=fsdp_on_cpu),
    ("dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=2), gradient_clipping=0.0)", "DeepSpeedStrategy"),
])
def test_translated_strategies_train_on_two_processes_as_one_with_the_doubled_batch(tmp_path, strategy, kind):
    """An MMEngine config with FlexibleRunner's strategy dict trains on 2 gloo processes to
    the weights of one process with the doubled batch (shuffle off: the same samples)."""
    if kind == "DeepSpeedStrategy":
        pytest.importorskip("deepspeed")  # an optional extra
    import os
    import subprocess
    import sys
    from pathlib import Path

    from treadle.checkpoint.weights import read_weights

    root = Path(__file__).resolve().parents[2]
    body = """
        model = dict(type='support.TinyNet')
        loss_fn = dict(type='CrossEntropyLoss')
        train_dataloader = dict(batch_size={batch}, num_workers=0, dataset=dict(type='support.make_data', n=32),
                                sampler=dict(type='DefaultSampler', shuffle=False))
        optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
        train_cfg = dict(by_epoch=True, max_epochs=2)
        randomness = dict(seed=0)
        progress = False
    """
    (tmp_path / "two.py").write_text(textwrap.dedent(body.format(batch=4)) + f"strategy = {strategy}\n")
    (tmp_path / "one.py").write_text(textwrap.dedent(body.format(batch=8)))
    # Both runs on the CPU: 2 ranks would take nccl on a GPU machine (one GPU is not two), and the
    # one-process reference is compared with them.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tests"), str(root)]), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    for name, extra in (("two", ["--nproc", "2"]), ("one", [])):
        proc = subprocess.run([sys.executable, "-m", "treadle", "train", str(tmp_path / f"{name}.py"), "--work-dir",
                               str(tmp_path / name), *extra], capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # aligned to the longest key, which a CUDA build adds
    assert re.search(r"^world size +2$", (tmp_path / "two" / "env.txt").read_text(), re.M)
    two = read_weights(tmp_path / "two" / "checkpoints" / "epoch_0002")
    one = read_weights(tmp_path / "one" / "checkpoints" / "epoch_0002")
    assert set(two) == set(one)
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-5, atol=1e-6, msg=k)


def is_block(module):
    """An MMEngine check_fn: which modules to checkpoint."""
    return isinstance(module, Block)


def test_sync_bn_torch_becomes_the_strategys_sync_bn():
    """DDPStrategy converts BatchNorm layers (MMEngine's convert_model); so does the
    runner-level key when the runner wraps for several processes."""
    out = strategy_of({"type": "DDPStrategy", "sync_bn": "torch"})
    assert out == {"type": "ddp", "sync_buffers": False, "sync_bn": True}
    assert resolve_strategy(out).sync_bn is True
    out = strategy_of({"type": "DDPStrategy", "sync_bn": "torch", "model_wrapper": {"find_unused_parameters": True}})
    assert out == {"type": "ddp", "find_unused_parameters": True, "sync_bn": True}
    assert strategy_of({"type": "DDPStrategy", "sync_bn": None}) == {"type": "ddp", "sync_buffers": False}
    optim = {"optimizer": {"type": "SGD", "lr": 0.1}}
    assert translate({"optim_wrapper": optim, "sync_bn": "torch"})["strategy"] == {"type": "ddp", "sync_buffers": False,
                                                                                   "sync_bn": True}
    out = translate({"optim_wrapper": optim, "sync_bn": "torch", "env_cfg": {"dist_cfg": {"timeout": 600}},
                     "strategy": {"type": "FSDPStrategy"}})
    assert out["strategy"] == {"type": "fsdp", "timeout_s": 600, "sync_bn": True}
    assert "sync_bn" not in translate({"optim_wrapper": optim, "sync_bn": None})
    with pytest.raises(ConfigError, match=r"^sync_bn: no such SyncBatchNorm implementation in treadle \(got 'mmcv'\)"):
        translate({"optim_wrapper": optim, "sync_bn": "mmcv"})


def test_fsdp_strategy_sync_bn_is_dropped_as_mmengine_ignores_it():
    with pytest.warns(UserWarning, match=r"strategy.sync_bn: MMEngine's FSDPStrategy takes sync_bn but never "
                                         r"converts BatchNorm layers"):
        out = strategy_of({"type": "FSDPStrategy", "sync_bn": "torch"})
    assert out == {"type": "fsdp"}


def test_fsdp_strategy_activation_checkpointing_becomes_the_trainers_setting(tmp_path):
    """MMEngine's check_fn (a function, its dotted path, or {type: fn, **kwargs}) is the
    Trainer's activation_checkpointing: {check_fn: ...}; a Python config's function is saved
    in config.yaml by its dotted path, which builds the same run again."""
    from treadle.config import save_config
    from support import checkpointed_modules

    out = translate({"strategy": {"type": "FSDPStrategy", "activation_checkpointing": {"check_fn": is_block}}})
    assert out["activation_checkpointing"] == {"check_fn": is_block} and out["strategy"] == {"type": "fsdp"}
    (tmp_path / "config.py").write_text(textwrap.dedent("""
        from memory_ranks import is_linear
        model = dict(type='support.TinyNet')
        loss_fn = dict(type='CrossEntropyLoss')
        train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=16))
        optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
        train_cfg = dict(by_epoch=True, max_epochs=1)
        strategy = dict(type='FSDPStrategy', activation_checkpointing=dict(check_fn=is_linear))
        progress = False
    """))
    cfg = load_config(tmp_path / "config.py", mode="train")
    assert checkpointed_modules(build_trainer(cfg).module) == ["fc1", "fc2"]
    save_config(cfg, tmp_path / "saved.yaml")
    assert "check_fn: memory_ranks.is_linear" in (tmp_path / "saved.yaml").read_text()
    assert checkpointed_modules(build_trainer(load_config(tmp_path / "saved.yaml", mode="train")).module) == [
        "fc1", "fc2"]
    (tmp_path / "config.py").write_text((tmp_path / "config.py").read_text().replace(
        "dict(check_fn=is_linear)", "dict(check_fn=dict(type='memory_ranks.is_linear', out_features=3))"))
    trainer = build_trainer(load_config(tmp_path / "config.py", mode="train"))
    assert checkpointed_modules(trainer.module) == ["fc2"]  # functools.partial(is_linear, out_features=3)


def test_runner_activation_checkpointing_takes_module_paths(tmp_path):
    """MMEngine's runner-level activation_checkpointing (submodule paths) is treadle's key."""
    from support import checkpointed_modules

    (tmp_path / "config.py").write_text(textwrap.dedent("""
        model = dict(type='support.TinyNet')
        loss_fn = dict(type='CrossEntropyLoss')
        train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=16))
        optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
        train_cfg = dict(by_epoch=True, max_epochs=1)
        activation_checkpointing = ['fc1', 'fc2']
        progress = False
    """))
    cfg = load_config(tmp_path / "config.py", mode="train")
    assert cfg["activation_checkpointing"] == ["fc1", "fc2"]
    trainer = build_trainer(cfg)
    assert checkpointed_modules(trainer.module) == ["fc1", "fc2"]
    trainer.fit()
