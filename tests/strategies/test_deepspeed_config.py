"""DeepSpeed's config is written from treadle's settings; a raw entry that contradicts one
is an error naming both; the ZeRO state reads back with weights_only and no allowlist.
No process group here (treadle/strategies/deepspeed_config.py, deepspeed_optim.py).
Only the tests marked ``needs_deepspeed`` need the deepspeed package."""

from __future__ import annotations

import importlib.util
import io

import pytest
import torch

from treadle.strategies.build import resolve_strategy
from treadle.strategies.deepspeed import DeepSpeedStrategy
from treadle.strategies.deepspeed_config import build_config, check_options

# A skipif, not importorskip: importing deepspeed fixes its accelerator for the whole process
# (test_deepspeed.py's one-process runs need the CPU one).
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="needs the deepspeed package: pip install 'treadle[deepspeed]'")


def _build(user=None, **kw):
    args = dict(zero_stage=2, offload_optimizer=None, offload_param=None, micro_batch=4, accumulate=1, world_size=2,
                precision="32", clip_grad=None, device_type="cpu")
    args.update(kw)
    return build_config(check_options(args["zero_stage"], user, args["offload_optimizer"], args["offload_param"]),
                        **args)


def test_treadle_settings_write_the_config_and_clipping_is_off_unless_asked():
    cfg = _build(accumulate=2)
    assert cfg["gradient_clipping"] == 0.0  # DeepSpeed's own default is 1.0: it would clip every other run
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and cfg["gradient_accumulation_steps"] == 2
    assert cfg["managed_gradient_accumulation"] is False  # treadle's windows (short last ones too)
    assert cfg["zero_optimization"] == {"stage": 2}
    assert cfg["bf16"] == {"enabled": False} and cfg["fp16"] == {"enabled": False}
    assert cfg["zero_allow_untested_optimizer"] is True and "zero_force_ds_cpu_optimizer" not in cfg
    cfg = _build(precision="bf16", clip_grad={"max_norm": 0.5}, offload_optimizer=True)
    assert cfg["bf16"]["enabled"] is True and cfg["gradient_clipping"] == 0.5
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["zero_force_ds_cpu_optimizer"] is False  # a torch optimizer over offloaded state
    # User entries that agree are kept, others merged in.
    cfg = _build({"gradient_clipping": 0.5, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
                  "train_batch_size": 16}, zero_stage=3, accumulate=2, clip_grad={"max_norm": 0.5})
    assert cfg["zero_optimization"] == {"stage": 3, "stage3_param_persistence_threshold": 0}
    assert cfg["train_batch_size"] == 16


@pytest.mark.parametrize("user, kw, message", [
    ({"gradient_clipping": 1.0}, {}, "config['gradient_clipping']=1.0 contradicts clip_grad=None (which means 0.0)"),
    ({"bf16": {"enabled": True}}, {}, "config['bf16']['enabled']=True contradicts precision='32'"),
    ({"gradient_accumulation_steps": 4}, {"accumulate": 2}, "config['gradient_accumulation_steps']=4 contradicts "
                                                            "accumulate=2"),
    ({"train_micro_batch_size_per_gpu": 8}, {}, "config['train_micro_batch_size_per_gpu']=8 contradicts the training "
                                                "loader's batch_size=4"),
    ({"train_batch_size": 32}, {}, "config['train_batch_size']=32 contradicts batch_size x accumulate x processes = 8"),
    ({"managed_gradient_accumulation": True}, {}, "config['managed_gradient_accumulation']=True contradicts treadle's"),
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, {"offload_optimizer": False},
     "config['zero_optimization']['offload_optimizer']={'device': 'cpu'} contradicts offload_optimizer=False"),
    (None, {"precision": "16"}, "precision='16' under DeepSpeed needs a GPU"),
    (None, {"clip_grad": {"value": 0.5}}, "clip_grad={'value': 0.5}: DeepSpeed clips by norm only"),
    (None, {"clip_grad": {"max_norm": 1.0, "norm_type": "inf"}},
     "clip_grad={'max_norm': 1.0, 'norm_type': 'inf'}: DeepSpeed clips by the 2-norm only"),
])
def test_a_config_entry_that_contradicts_a_treadle_setting_names_both(user, kw, message):
    with pytest.raises(ValueError) as e:
        _build(user, **kw)
    assert str(e.value).startswith(message), str(e.value)


@needs_deepspeed  # the constructor checks for the package first, then the options
@pytest.mark.parametrize("options, error, message", [
    (dict(zero_stage=4), ValueError, "zero_stage=4; expected 0, 1, 2 or 3"),
    (dict(config={"optimizer": {"type": "Adam"}}), ValueError, "config['optimizer'] is not taken under treadle: "
                                                              "treadle builds the optimizer"),
    (dict(config={"scheduler": {"type": "WarmupLR"}}), ValueError, "config['scheduler'] is not taken under treadle"),
    (dict(config={"amp": {"enabled": True}}), ValueError, "config['amp'] is not taken under treadle"),
    (dict(config={"zero_optimization": {"stage": 3}}), ValueError,
     "config['zero_optimization']['stage']=3 contradicts zero_stage=2"),
    (dict(config=[1]), TypeError, "config=[1]; expected a dict of DeepSpeed config entries"),
    (dict(offload_param=True), ValueError, "offload_param=True needs zero_stage=3"),
    (dict(offload_optimizer="yes"), TypeError, "offload_optimizer='yes'; expected True, False or None"),
])
def test_bad_strategy_options_fail_at_construction(options, error, message):
    with pytest.raises(error) as e:
        DeepSpeedStrategy(**options)
    assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(error, match="strategy 'deepspeed'"):  # the same through the Trainer's strategy= dict
        resolve_strategy(dict(type="deepspeed", **options))


@needs_deepspeed
def test_zero_state_reads_back_with_weights_only_and_no_allowlist(monkeypatch):
    """The three DeepSpeed classes inside a ZeRO optimizer's state_dict become plain data
    and come back as themselves; an unknown loss-scaler class is refused, not built."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # in case this is deepspeed's first import: see test_deepspeed.py
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from treadle.strategies.deepspeed_optim import from_plain, to_plain

    scaler = DynamicLossScaler(init_scale=2.0**8, scale_window=10, min_scale=1.0, delayed_shift=2,
                               consecutive_hysteresis=False)
    scaler.cur_iter = 7
    state = {"loss_scaler": scaler, "zero_stage": ZeroStageEnum.gradients, "clip_grad": 0.5,
             "param_slice_mappings": [{"w": fragment_address(numel=6, start=2)}],
             "single_partition_of_fp32_groups": [torch.arange(4.0)]}
    buf = io.BytesIO()
    torch.save(state, buf)
    with pytest.raises(Exception, match="Unsupported global"):  # DeepSpeed's objects as they are
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    buf = io.BytesIO()
    torch.save(to_plain(state), buf)
    back = from_plain(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    assert type(back["loss_scaler"]) is DynamicLossScaler and vars(back["loss_scaler"]) == vars(scaler)
    assert back["zero_stage"] is ZeroStageEnum.gradients
    assert back["param_slice_mappings"] == [{"w": fragment_address(numel=6, start=2)}]
    assert torch.equal(back["single_partition_of_fp32_groups"][0], torch.arange(4.0))
    assert type(from_plain(to_plain({"loss_scaler": LossScaler(1.0)}))["loss_scaler"]) is LossScaler
    with pytest.raises(ValueError, match="loss scaler 'os.system'"):
        from_plain({"loss_scaler": {"__class__": "os.system"}})


@pytest.mark.parametrize("layout", [("latest", "zero_to_fp32.py", "t6/mp_rank_00_model_states.pt"),
                                    ("zero_pp_rank_0_mp_rank_00_optim_states.pt",)])
def test_a_deepspeed_checkpoint_directory_is_refused_never_unpickled(tmp_path, layout):
    """DeepSpeed's own files need weights_only=False: treadle says so and reads none of them."""
    from treadle.checkpoint.io import CheckpointError
    from treadle.checkpoint.weights import read_weights

    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"not a pickle treadle may open")
    with pytest.raises(CheckpointError, match=r"is a DeepSpeed checkpoint \(engine.save_checkpoint\), not treadle's: "
                                              r"treadle never reads it, because DeepSpeed's files need a full unpickle"):
        read_weights(tmp_path)


def test_without_the_deepspeed_package_the_strategy_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'treadle\[deepspeed\]'"):
        DeepSpeedStrategy()
