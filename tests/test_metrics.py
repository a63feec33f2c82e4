"""treadle.metrics: Accuracy against hand counts, and which way a metric's name says is better."""

from __future__ import annotations

import pytest
import torch

from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.metrics import Accuracy, higher_is_better


def _accuracy(outputs, targets, topk=1):
    m = Accuracy(topk=topk)
    m.update(outputs, targets)
    return m.compute()


def test_multiclass_top1_and_top2_against_counting_by_hand():
    outputs = torch.tensor([[0.1, 0.7, 0.2], [0.8, 0.15, 0.05], [0.2, 0.3, 0.5], [0.4, 0.35, 0.25]])
    targets = torch.tensor([1, 1, 2, 1])
    assert _accuracy(outputs, targets) == 2 / 4  # rows 0 and 2
    assert _accuracy(outputs, targets, topk=2) == 4 / 4
    assert _accuracy(outputs, torch.nn.functional.one_hot(targets, 3).float()) == 2 / 4


def test_top1_is_the_argmax_with_ties_to_the_first_class_and_equals_topk_otherwise():
    g = torch.Generator().manual_seed(0)
    outputs, targets = torch.randn(500, 7, generator=g), torch.randint(0, 7, (500,), generator=g)
    by_hand = (outputs.topk(1, dim=-1).indices.squeeze(-1) == targets).sum().item() / 500
    assert _accuracy(outputs, targets) == pytest.approx(by_hand, abs=0)
    tied = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.3, 0.3]])  # first maximum: classes 0 and 1
    assert _accuracy(tied, torch.tensor([0, 1])) == 1.0 and _accuracy(tied, torch.tensor([1, 2])) == 0.0


@pytest.mark.parametrize("shape", [(8,), (8, 1)])
def test_a_single_output_is_a_binary_classifier(shape):
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, -0.2, 4.0, -2.0])
    targets = torch.tensor([1, 0, 0, 0, 1, 1, 1, 1])  # wrong at 2, 5, 7
    assert _accuracy(logits.reshape(shape), targets.reshape(shape)) == 5 / 8
    probabilities = torch.sigmoid(logits)  # in [0, 1]: thresholded at 0.5, the same predictions
    assert _accuracy(probabilities.reshape(shape), targets.reshape(shape).float()) == 5 / 8


def test_targets_of_the_wrong_shape_are_an_error():
    with pytest.raises(ValueError, match=r"outputs of shape \(4, 3\) \(N, C\) need targets of shape \(4,\)"):
        Accuracy().update(torch.randn(4, 3), torch.zeros(4, 2, 2))
    with pytest.raises(ValueError, match="a binary output of 4 values needs as many 0/1 targets"):
        Accuracy().update(torch.randn(4, 1), torch.zeros(3))


@pytest.mark.parametrize("name,higher", [
    ("val/loss", False), ("val/loss_cls", False), ("val/top1_err", False), ("val/mae", False), ("val/wer", False),
    ("test/perplexity", False), ("val/acc", True), ("val/top5", True), ("val/mAP", True), ("val/mIoU", True),
    ("val/f1", True), ("val/psnr", True), ("val/s", None), ("val/mystery", None),
])
def test_which_way_a_name_says_is_better(name, higher):
    assert higher_is_better(name) is higher


def test_hooks_infer_the_rule_or_refuse_to_guess():
    assert CheckpointHook(best="val/top1_err").rule == "min" and CheckpointHook(best="val/mAP").rule == "max"
    assert EarlyStoppingHook(monitor="val/mae").rule == "less" and EarlyStoppingHook(monitor="val/acc").rule == "greater"
    with pytest.raises(ValueError, match=r"best='val/mystery': its name does not say .* rule='max' or rule='min'"):
        CheckpointHook(best="val/mystery")
    with pytest.raises(ValueError, match=r"monitor='val/mystery': its name does not say .* rule='greater'"):
        EarlyStoppingHook(monitor="val/mystery")
    assert CheckpointHook(best="val/mystery", rule="min").rule == "min"


def test_a_metric_of_yours_sums_over_the_group_its_compute_is_handed(monkeypatch):
    """sum_over_ranks() without a group, inside metrics.compute(metric, group): over that
    group (under tensor parallelism, the ranks that read different batches), as the
    Trainer computes every metric; outside it over every process; a group given wins."""
    from treadle.distributed import comm
    from treadle.metrics import compute, sum_over_ranks

    asked = []
    monkeypatch.setattr(comm, "is_distributed", lambda: True)
    monkeypatch.setattr(comm, "all_gather_object", lambda obj, group=None: asked.append(group) or [obj, obj])
    shards, own = object(), object()

    class Count:
        def __init__(self, group=None):
            self.group = group

        def compute(self):
            return sum_over_ranks(3, group=self.group)[0]

    assert compute(Count(), shards) == 6 and asked == [shards]
    assert Count().compute() == 6 and asked[-1] is None  # outside compute(): every process
    assert compute(Count(own), shards) == 6 and asked[-1] is own
    with pytest.raises(ZeroDivisionError):
        compute(type("Bad", (), {"compute": lambda self: 1 / 0})(), shards)
    assert Count().compute() == 6 and asked[-1] is None  # the group does not outlive a failing compute()
