"""The parallel layout: the one object that knows how the processes split and which of
them each reduction runs over (treadle/distributed/layout.py)."""

from __future__ import annotations

import treadle
from treadle.distributed.layout import MeshShape, ParallelLayout


def test_a_layout_says_which_shard_each_rank_reads_and_who_leads_it() -> None:
    shape = MeshShape(dp_replicate=2, dp_shard=-1, tp=2).resolve(8)
    layouts = [ParallelLayout(shape, rank) for rank in range(8)]
    assert [lay.dp_rank for lay in layouts] == [0, 0, 1, 1, 2, 2, 3, 3]  # a tp group reads one shard
    assert {(lay.dp_size, lay.tp_size, lay.world_size) for lay in layouts} == {(4, 2, 8)}
    assert layouts[0].data_leaders() == [0, 2, 4, 6]


def test_data_parallel_processes_are_each_a_shard_and_one_process_is_the_default() -> None:
    layout = ParallelLayout.data_parallel(world_size=3, rank=2)
    assert (layout.dp_rank, layout.dp_size, layout.tp_size, layout.data_leaders()) == (2, 3, 1, [0, 1, 2])
    assert layout.data_group is None and layout.data_object_group is None  # the world's groups serve
    one = ParallelLayout()
    assert (one.world_size, one.dp_size, one.distributed) == (1, 1, False)


def test_a_strategy_holds_its_layout_and_the_data_view_is_the_layout_s() -> None:
    strategy = treadle.build_strategy("single")
    assert strategy.layout == ParallelLayout.data_parallel(1, 0)
    assert (strategy.dp_rank, strategy.dp_size, strategy.tp_size) == (0, 1, 1)
    from treadle.distributed import comm

    assert not hasattr(comm, "set_data_group")  # no module-level group: reductions are handed theirs
