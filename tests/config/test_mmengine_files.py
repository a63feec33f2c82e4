"""What real MMEngine config files need besides key names (#36): references to their
bases, loaders' samplers and collate functions, validation schedules, hooks that are off."""

from __future__ import annotations

import textwrap
from collections import namedtuple

import pytest
import torch

from treadle.config import ConfigError, load_file
from mm_support import translate  # less the Runner's defaults (test_mmengine.py: test_the_runners_defaults_...)
from treadle.openmmlab.loop import val_schedule, validation_points
from treadle.data.collate import COLLATE_FUNCTIONS, pseudo_collate
from treadle.hooks.checkpoint import CheckpointHook


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


# -- _base_ references ----------------------------------------------------------------
def test_python_base_references_read_write_and_delete_the_merged_bases(tmp_path):
    write(tmp_path / "base.py", """
        model = dict(type='Net', backbone=dict(depth=50), head=dict(classes=10))
        train_pipeline = [dict(type='Load'), dict(type='Resize', size=(1, 2))]
        lr = 0.1
        """)
    cfg = load_file(write(tmp_path / "child.py", """
        _base_ = ['base.py']
        detector = _base_.model            # a variable: its own copy of the base's
        detector.backbone.depth = 101
        _base_.model.head.classes = 3      # written into the merged bases, as MMEngine
        pipeline = {{_base_.train_pipeline}}
        optimizer = dict(type='SGD', lr=_base_.lr * 2)
        """))
    assert cfg["model"] == {"type": "Net", "backbone": {"depth": 101}, "head": {"classes": 3}}
    assert cfg["pipeline"] == [{"type": "Load"}, {"type": "Resize", "size": (1, 2)}]
    assert cfg["optimizer"] == {"type": "SGD", "lr": 0.2}
    cfg = load_file(write(tmp_path / "del.py", "_base_ = 'base.py'\ndel _base_.model\nmodel = dict(type='Other')\n"))
    assert cfg["model"] == {"type": "Other"} and "detector" not in cfg  # replaced, not merged


def test_yaml_base_references_are_data_and_a_missing_one_names_itself(tmp_path):
    write(tmp_path / "base.yaml", "sizes: {train: [1, 2]}\nname: x\n")
    cfg = load_file(write(tmp_path / "c.yaml", "_base_: base.yaml\na: {{_base_.sizes.train}}\nb: '{{ _base_.name }}'\n"))
    assert cfg == {"sizes": {"train": [1, 2]}, "name": "x", "a": [1, 2], "b": "x"}
    with pytest.raises(ConfigError, match=r"_base_.sizes.val: not found: sizes has no 'val'"):
        load_file(write(tmp_path / "bad.yaml", "_base_: base.yaml\na: {{_base_.sizes.val}}\n"))


# -- loaders ---------------------------------------------------------------------------
@pytest.mark.parametrize("loader, want", [
    ({"batch_sampler": None, "sampler": {"type": "DefaultSampler", "round_up": True}},
     {"sampler": {"type": "DefaultSampler"}}),
    ({"batch_sampler": {"type": "BatchSampler", "drop_last": True}, "sampler": {"type": "mmengine.DefaultSampler",
                                                                                "shuffle": False, "seed": 3}},
     {"sampler": {"type": "DefaultSampler", "shuffle": False, "seed": 3}, "drop_last": True}),
    ({"sampler": {"type": "InfiniteSampler", "shuffle": False}}, {"sampler": {"type": "InfiniteSampler",
                                                                              "shuffle": False}}),
    ({"sampler": {"type": "RepeatAugSampler", "num_repeats": 3}},  # a project's: its registries build it
     {"sampler": {"type": "RepeatAugSampler", "num_repeats": 3}}),
    ({"collate_fn": {"type": "pseudo_collate"}}, {"collate_fn": "pseudo_collate"}),
    ({"collate_fn": {"type": "default_collate", "x": 1}}, {"collate_fn": {"type": "default_collate", "x": 1}}),
    ({"batch_sampler": {"type": "AspectRatioBatchSampler"}}, {"group_by_aspect_ratio": True}),
    ({"batch_sampler": {"type": "mmdet.AspectRatioBatchSampler", "drop_last": True}},
     {"group_by_aspect_ratio": True, "drop_last": True}),
])
def test_mmengine_loader_keys(loader, want):
    out = translate({"default_scope": "x", "train_dataloader": {"batch_size": 2, **loader}})
    assert out["train_dataloader"] == {"batch_size": 2, **want}


@pytest.mark.parametrize("loader, message", [
    ({"batch_sampler": {"type": "TrackAspectRatioBatchSampler"}},
     "train_dataloader.batch_sampler.type: unsupported batch sampler"),
    ({"batch_sampler": {"type": "AspectRatioBatchSampler", "seed": 1}},
     "train_dataloader.batch_sampler.seed: option has no treadle equivalent"),
    ({"sampler": {"type": "DefaultSampler", "round_up": False}},
     "train_dataloader.sampler.round_up: option has no treadle equivalent for this value"),
    ({"sampler": {"type": "InfiniteSampler", "round_up": True}},
     "train_dataloader.sampler.round_up: option has no treadle equivalent"),
    ({"collate_fn": {"x": 1}}, "train_dataloader.collate_fn: unsupported collate_fn"),
])
def test_mmengine_loader_keys_treadle_cannot_honour(loader, message):
    with pytest.raises(ConfigError) as e:
        translate({"default_scope": "x", "train_dataloader": loader})
    assert str(e.value).startswith(message)


def test_pseudo_collate_transposes_without_stacking():
    Pair = namedtuple("Pair", "a b")
    x, y = torch.zeros(2), torch.ones(3)
    assert pseudo_collate([{"img": x, "id": 1}, {"img": y, "id": 2}]) == {"img": [x, y], "id": [1, 2]}
    assert pseudo_collate([(x, "a"), (y, "b")]) == [[x, y], ["a", "b"]]
    assert pseudo_collate([Pair(1, 2), Pair(3, 4)]) == Pair([1, 3], [2, 4])
    assert COLLATE_FUNCTIONS["default_collate"]([(x, 1), (x, 2)])[1].tolist() == [1, 2]


# -- the validation schedule -------------------------------------------------------------
def test_dynamic_intervals_validate_on_mmengines_epochs():
    # rtmdet: val_interval=10, then every epoch from epoch 281 (MMEngine bisects on the epoch about to run)
    assert validation_points(1, [(280, 1)], 10, 300) == [*range(10, 281, 10), *range(281, 301)]
    assert validation_points(5, [], 2, 9) == [6, 8, 9]  # val_begin 5, multiples of 2, and the last epoch
    workflow = val_schedule(1, [(4, 1)], 2, 6, True, "train_cfg")
    assert workflow == [("train", 2), ("val", 1), ("train", 2), ("val", 1), ("train", 1), ("val", 1), ("train", 1),
                        ("val", 1)]
    assert val_schedule(2, None, 3, 12, True, "train_cfg") is None  # the first validation is at 3 anyway


def test_val_begin_becomes_a_workflow_only_with_a_validation_loader():
    cfg = {"train_cfg": {"max_epochs": 4, "val_interval": 1, "val_begin": 3}}
    assert "workflow" not in translate(cfg)
    out = translate({**cfg, "val_dataloader": {"batch_size": 1}})
    assert out["workflow"] == [("train", 3), ("val", 1), ("train", 1), ("val", 1)]


# -- hooks and the optimizer wrapper -------------------------------------------------------
def test_disabled_hooks_sync_buffers_and_wrapper_options():
    out = translate({"default_hooks": {"badcase": {"type": "BadCaseAnalysisHook", "enable": False, "out_dir": "x"}},
                     "custom_hooks": [{"type": "SyncBuffersHook"}],
                     "optim_wrapper": {"type": "AmpOptimWrapper", "loss_scale": "dynamic", "optimizer": {"type": "SGD"},
                                       "constructor": "DefaultOptimWrapperConstructor"}})
    assert out == {"hooks": [{"type": "SyncBuffersHook"}], "optimizer": {"type": "SGD"}, "precision": "16"}


def test_save_best_auto_takes_the_first_metric_at_the_first_validation():
    hook = CheckpointHook(best="auto")
    hook._choose_best({"val/loss": 0.3, "val/acc": 0.5, "val/top5": 0.9})
    assert (hook.best, hook.rule) == ("val/acc", "max")
    with pytest.raises(ValueError, match="chose 'val/x'"):
        CheckpointHook(best="auto")._choose_best({"val/loss": 1.0, "val/x": 2.0})


def test_an_evaluator_is_a_project_key_and_none_is_left_out():
    from treadle.config import resolve_config

    cfg = {"model": {"type": "support.TinyNet"}, "val_evaluator": None, "test_evaluator": None}
    assert "val_evaluator" not in resolve_config(cfg) and "test_evaluator" not in resolve_config(cfg)
    resolved = resolve_config({**cfg, "default_scope": "mmpretrain", "val_evaluator": {"type": "Accuracy"}})
    assert resolved["val_evaluator"] == {"type": "Accuracy"} and resolved["default_scope"] == "mmpretrain"
