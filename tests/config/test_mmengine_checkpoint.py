"""MMEngine's CheckpointHook ``save_best``, ``rule``, ``greater_keys``/``less_keys`` and ``out_dir``
(treadle/openmmlab/checkpoint.py)."""

from __future__ import annotations

import pytest

from treadle.config import ConfigError, load_config
from treadle.openmmlab.translate import translate
from treadle.openmmlab.checkpoint import MMENGINE_GREATER_KEYS, MMENGINE_LESS_KEYS, mmengine_rule

# (save_best, greater_keys, less_keys, the rule MMEngine 0.10.7's CheckpointHook(save_best=...,
# greater_keys=..., less_keys=...) chose: hook.rules[0], or the error it raised), recorded with it.
MMENGINE_RULES = [
    ("accuracy/top1", None, None, "greater"),
    ("coco/bbox_mAP", None, None, "greater"),
    ("mIoU", None, None, "greater"),
    ("loss", None, None, "less"),
    ("PSNR", ["psnr"], None, "greater"),
    ("err", None, ["err"], "less"),
    ("val/top1_err", None, None, "greater"),  # "top" is one of its greater keys
    ("AR@100", None, None, "greater"),
    ("mDice", None, None, "greater"),
    ("EPE", None, ["EPE"], "less"),
    ("EPE", None, None, "ValueError"),
    ("topk_loss", None, None, "greater"),
    ("mAP", ["x"], ["m"], "less"),
]


@pytest.mark.parametrize("name, greater, less, rule", MMENGINE_RULES)
def test_the_rule_is_inferred_as_mmengine_infers_it(name, greater, less, rule):
    got = mmengine_rule(name, tuple(greater or MMENGINE_GREATER_KEYS), tuple(less or MMENGINE_LESS_KEYS))
    assert got == (None if rule == "ValueError" else rule)


def checkpoint(**hook):
    cfg = {"val_dataloader": {"batch_size": 1}, "metrics": {"accuracy": {"type": "Accuracy"}, "coco": {"type": "M"}},
           "default_hooks": {"checkpoint": {"type": "CheckpointHook", "interval": 1, **hook}}}
    return translate(cfg)["checkpoint"]


def test_save_best_names_the_validation_result_with_mmengines_rule():
    assert checkpoint(save_best="accuracy") == {"interval": 1, "best": "val/accuracy", "rule": "max", "keep": None}
    assert checkpoint(save_best="coco/bbox_mAP")["best"] == "val/coco/bbox_mAP"
    assert checkpoint(save_best="val/accuracy")["best"] == "val/accuracy"  # treadle's own name: kept
    assert checkpoint(save_best=["coco/EPE"], less_keys=["epe"])["rule"] == "min"
    assert checkpoint(save_best="coco/EPE", rule="greater", less_keys="epe")["rule"] == "max"  # the given rule wins
    assert checkpoint(save_best="loss")["best"] == "val/loss"  # a loss may come: checked when built
    assert checkpoint(save_best="auto")["best"] == "auto"
    assert "best" not in checkpoint(greater_keys=["x"], out_dir=None)  # no save_best: the lists do nothing


@pytest.mark.parametrize("hook, message", [
    (dict(save_best="coco_bbox_mAP"), r"^default_hooks\.checkpoint\.save_best: no evaluator produces this result "
                                      r"\(val/coco_bbox_mAP\) \(got 'coco_bbox_mAP'\); expected a result of the config's "
                                      r"metrics \(val/accuracy, val/coco"),
    (dict(save_best="bbox_mAP"), r"save_best: no evaluator produces"),
    (dict(save_best="EPE"), r"^default_hooks\.checkpoint\.save_best: cannot infer whether higher or lower is better"),
    (dict(save_best=["accuracy", "coco/x"]), r"^default_hooks\.checkpoint\.save_best: treadle keeps the best "
                                             r"checkpoints of one metric"),
    (dict(save_best="auto", greater_keys=["psnr"]), r"^default_hooks\.checkpoint\.greater_keys: decides the rule"),
    (dict(save_best="accuracy", less_keys=3), r"^default_hooks\.checkpoint\.less_keys: not a list"),
    (dict(out_dir="s3://bucket/ckpts"), r"^default_hooks\.checkpoint\.out_dir: option has no treadle equivalent "
                                        r"\(got 's3://bucket/ckpts'\); expected no out_dir: treadle writes checkpoints "
                                        r"to work_dir/checkpoints"),
])
def test_what_cannot_be_honoured_is_refused_by_name(hook, message):
    with pytest.raises(ConfigError, match=message):
        checkpoint(**hook)


def test_a_released_style_config_with_a_save_best_no_metric_gives_fails_when_it_loads(tmp_path):
    path = tmp_path / "mm.py"
    path.write_text("model = dict(type='support.TinyNet')\nloss_fn = dict(type='CrossEntropyLoss')\n"
                    "val_dataloader = dict(batch_size=2, dataset=dict(type='support.make_data', n=4))\n"
                    "metrics = dict(acc=dict(type='Accuracy'))\n"
                    "default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, save_best='coco/bbox_mAP'))\n"
                    "custom_hooks = [dict(type='EarlyStoppingHook', monitor='acc', patience=2)]\n")
    with pytest.raises(ConfigError, match=r"^default_hooks\.checkpoint\.save_best: no evaluator produces"):
        load_config(path)
    cfg = load_config(path, ["default_hooks.checkpoint.save_best=acc"])
    assert cfg["checkpoint"]["best"] == "val/acc" and cfg["hooks"][0]["monitor"] == "val/acc"
