"""Several validation sets on 2 gloo processes: each set is sharded as one loader is
(every sample once) and its results, summed over the ranks, equal one process's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from dist_support import run_ranks
from support import ON_CPU, TinyNet, make_data

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
              pytest.mark.slow]  # 2 processes on gloo


class Count(treadle.Hook):
    def __init__(self):
        self.samples = 0

    def before_val_iter(self, trainer, batch):
        self.samples += len(batch[1])


def _validate(rank: int = 0, world_size: int = 1) -> tuple[dict[str, float], int]:
    torch.manual_seed(0)
    count = Count()
    sets = {"odd": DataLoader(make_data(11, seed=1), batch_size=2), "even": DataLoader(make_data(8, seed=2), batch_size=3)}
    strategy = "ddp" if world_size > 1 else ON_CPU
    return treadle.Trainer(TinyNet(), val_dataloader=sets, loss_fn=nn.CrossEntropyLoss(),
                           metrics={"acc": treadle.metrics.Accuracy()}, strategy=strategy, log_writers=(),
                           progress=False, hooks=[count]).validate(), count.samples


def test_each_set_is_sharded_and_summed_over_ranks():
    one, seen = _validate()
    ranks = run_ranks(_validate)
    assert sorted(one) == ["val/even/acc", "val/even/loss", "val/odd/acc", "val/odd/loss"]
    assert seen == 19 and [n for _, n in ranks] == [10, 9]  # every sample once: odd 6 + 5, even 4 + 4
    for got, _ in ranks:
        assert got.keys() == one.keys()
        for k, v in one.items():
            assert got[k] == pytest.approx(v, rel=1e-6), k
