"""AspectRatioBatchSampler: mmdet's batches (checked against mmdet's own class where its
package is importable, and against batches written out by hand), resumed inside an epoch
as the uninterrupted epoch goes on, sharded so that each rank groups its own shard."""

from __future__ import annotations

import importlib.util
import shutil
import types
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

import treadle
from support import ON_CPU, SizedData, TinyNet, load_module_file, make_sized_data
from treadle.components.build import build_dataloader
from treadle.components.errors import ConfigError
from treadle.openmmlab.translate import translate
from treadle.data import AspectRatioBatchSampler
from treadle.data.samplers import DefaultSampler
from treadle.data.distributed import shard_eval_loader, shard_train_loader
from treadle.data.feed import DataFeed


class Sizes:
    """get_data_info of a list of (width, height)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __len__(self):
        return len(self.sizes)

    def get_data_info(self, i):
        w, h = self.sizes[i]
        return {"width": w, "height": h}


P, L, S = (3, 4), (4, 3), (5, 5)  # portrait, landscape, square (grouped with landscape, as mmdet does)


def test_batches_written_out_by_hand():
    ds = Sizes([P, L, L, P, S, P, L, P, L])
    batches = list(AspectRatioBatchSampler(SequentialSampler(ds), 2))
    # P: 0 3 | 5 7 ; L: 1 2 | 4 6 | 8 ; leftovers portrait first: [] + [8]
    assert batches == [[1, 2], [0, 3], [4, 6], [5, 7], [8]]
    assert len(AspectRatioBatchSampler(SequentialSampler(ds), 2)) == 5
    three = list(AspectRatioBatchSampler(SequentialSampler(ds), 3))
    # L: 1 2 4 fills at index 4, P: 0 3 5 at index 5; leftovers [7] + [6, 8] in batches of 3
    assert three == [[1, 2, 4], [0, 3, 5], [7, 6, 8]]
    assert list(AspectRatioBatchSampler(SequentialSampler(ds), 4, drop_last=True)) == [[1, 2, 4, 6], [0, 3, 5, 7]]
    assert len(AspectRatioBatchSampler(SequentialSampler(ds), 4, drop_last=True)) == 2


def test_sizes_from_a_function_or_a_list_and_one_line_errors():
    sizes = [P, L, P, L]
    by_list = list(AspectRatioBatchSampler(range(4), 2, sizes=sizes))  # type: ignore[arg-type]
    by_fn = list(AspectRatioBatchSampler(range(4), 2, sizes=lambda i: sizes[i]))  # type: ignore[arg-type]
    assert by_list == by_fn == [[0, 2], [1, 3]]
    with pytest.raises(TypeError, match="has no get_data_info"):
        AspectRatioBatchSampler(SequentialSampler(range(4)), 2)
    with pytest.raises(ValueError, match="batch_size=0"):
        AspectRatioBatchSampler(SequentialSampler(Sizes(sizes)), 0)


def _mmdet_class():
    """mmdet's AspectRatioBatchSampler, its module loaded from the installed package by
    path (mmdet's __init__ needs mmcv's compiled ops; the module needs only its registry)."""
    spec = importlib.util.find_spec("mmdet")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mmdet is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "samplers" / "batch_sampler.py"
    registry = types.SimpleNamespace(register_module=lambda *a, **k: (lambda cls: cls))
    stubs = {"mmdet": types.ModuleType("mmdet"), "mmdet.registry": types.ModuleType("mmdet.registry"),
             "mmdet.datasets": types.ModuleType("mmdet.datasets"),
             "mmdet.datasets.samplers": types.ModuleType("mmdet.datasets.samplers"),
             "mmdet.datasets.samplers.track_img_sampler": types.ModuleType("track_img_sampler")}
    stubs["mmdet.registry"].DATA_SAMPLERS = registry  # type: ignore[attr-defined]
    stubs["mmdet.datasets.samplers.track_img_sampler"].TrackImgSampler = type("TrackImgSampler", (), {})  # type: ignore[attr-defined]
    module = load_module_file("mmdet_batch_sampler", path, stubs)
    return module.AspectRatioBatchSampler


@pytest.mark.parametrize("n, batch, drop_last", [(37, 4, False), (37, 4, True), (50, 3, False), (9, 16, False)])
def test_equal_to_mmdets_class(n, batch, drop_last):
    theirs_cls = _mmdet_class()
    ds = SizedData(n, seed=n)
    for epoch in range(2):
        order = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
        order.set_epoch(epoch)
        theirs = list(theirs_cls(order, batch, drop_last))
        ours = list(AspectRatioBatchSampler(order, batch, drop_last))
        assert ours == theirs
        assert len(AspectRatioBatchSampler(order, batch, drop_last)) == len(theirs_cls(order, batch, drop_last))


def _grouped_loader(n=29, batch=3, shuffle=True):
    ds = SizedData(n)
    order = RandomSampler(ds) if shuffle else SequentialSampler(ds)
    return ds, DataLoader(ds, batch_sampler=AspectRatioBatchSampler(order, batch))


def _ids(batches, ds):
    """The dataset indices of the batches (each sample's x row is unique)."""
    rows = {tuple(x.tolist()): i for i, x in enumerate(ds.tensors[0])}
    return [[rows[tuple(x.tolist())] for x in b[0]] for b in batches]


def test_every_batch_has_one_orientation_and_every_sample_comes_once():
    ds, loader = _grouped_loader()
    feed = DataFeed(loader, seed=5)
    feed.start_epoch(0)
    ids = _ids(list(feed), ds)
    assert sorted(i for b in ids for i in b) == list(range(len(ds)))
    assert len(ids) == len(loader)
    mixed = [b for b in ids if len({ds.portrait[i] for i in b}) > 1]
    assert len(mixed) <= 1  # only the leftovers' batch may join both groups


def test_resume_inside_an_epoch_goes_on_with_the_uninterrupted_batches():
    ds, loader = _grouped_loader()
    whole = DataFeed(loader, seed=5)
    whole.start_epoch(2)
    full = _ids(list(whole), ds)
    resumed = DataFeed(loader, seed=5)
    resumed.start_epoch(2, skip=4)
    assert _ids(list(resumed), ds) == full[4:]


def test_sharding_groups_each_ranks_shard_and_every_rank_takes_as_many_batches():
    ds, loader = _grouped_loader(n=31, batch=3)
    shards = [shard_train_loader(loader, rank, 2) for rank in range(2)]
    per_rank = []
    for rank, shard in enumerate(shards):
        batches = shard.batch_sampler
        assert isinstance(batches, AspectRatioBatchSampler) and isinstance(batches.sampler, DistributedSampler)
        feed = DataFeed(shard, seed=5, rank=rank)
        feed.start_epoch(1)
        ids = _ids(list(feed), ds)
        order = list(batches.sampler)  # the shard's order this epoch (the feed seeded it)
        assert ids == list(AspectRatioBatchSampler(order, 3, dataset=ds))  # type: ignore[arg-type]
        per_rank.append(ids)
    assert len(per_rank[0]) == len(per_rank[1]) == len(shards[0])
    seen = {i for ids in per_rank for b in ids for i in b}
    assert seen == set(range(len(ds)))  # padded as DistributedSampler pads: every sample, some twice
    evals = [shard_eval_loader(_grouped_loader(n=31, shuffle=False)[1], rank, 2) for rank in range(2)]
    got = sorted(i for rank in range(2) for b in evals[rank].batch_sampler for i in b)
    assert got == list(range(31))  # evaluation: every sample once


def test_config_key_and_mmengine_translation_build_the_sampler():
    spec = translate({"default_scope": "mmdet", "train_dataloader": {
        "batch_size": 4, "dataset": {"type": "support.make_sized_data", "n": 12},
        "sampler": {"type": "DefaultSampler", "shuffle": True},
        "batch_sampler": {"type": "AspectRatioBatchSampler"}}})["train_dataloader"]
    assert spec == {"batch_size": 4, "dataset": {"type": "support.make_sized_data", "n": 12},
                    "sampler": {"type": "DefaultSampler", "shuffle": True}, "group_by_aspect_ratio": True}
    loader = build_dataloader(spec, "train_dataloader")
    assert isinstance(loader.batch_sampler, AspectRatioBatchSampler)
    assert isinstance(loader.batch_sampler.sampler, DefaultSampler) and loader.batch_sampler.batch_size == 4
    plain = build_dataloader({**spec, "sampler": None, "shuffle": True}, "train_dataloader")
    assert isinstance(plain.batch_sampler.sampler, RandomSampler)
    with pytest.raises(ConfigError, match="^train_dataloader.group_by_aspect_ratio: .*get_data_info"):
        build_dataloader({"dataset": {"type": "support.make_data", "n": 4}, "group_by_aspect_ratio": True},
                         "train_dataloader")


def test_a_trainer_resumed_inside_an_epoch_equals_the_uninterrupted_run(tmp_path):
    resumed_at = []

    class Resumed(treadle.Hook):
        def after_load_checkpoint(self, trainer, checkpoint):
            resumed_at.append((trainer.state.iter, trainer.train_loop.resume_pos["batch_idx"]))

    def run(work, resume=False):
        torch.manual_seed(0)
        ds = make_sized_data(26)
        loader = DataLoader(ds, batch_sampler=AspectRatioBatchSampler(RandomSampler(ds), 4))
        t = treadle.Trainer(TinyNet(dropout=0.3), work_dir=work, train_dataloader=loader, loss_fn=torch.nn.CrossEntropyLoss(),
                            optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=2, seed=3, strategy=ON_CPU,
                            checkpoint=dict(interval=3, by_epoch=False, keep=None), log_writers=(), resume=resume,
                            progress=False, hooks=[Resumed()])
        t.fit()
        return {k: v.clone() for k, v in t.module.state_dict().items()}

    whole = run(tmp_path / "whole")
    # Stopped at iteration 9 of 14 (inside epoch 2): resumed from iteration 9's checkpoint.
    part = tmp_path / "part"
    run(part)
    for p in (part / "checkpoints").iterdir():
        if p.name != "iter_00000009":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    got = run(part, resume=True)
    assert resumed_at == [(9, 2)]  # 7 batches an epoch: 2 taken in the second
    for k, v in whole.items():
        assert torch.equal(got[k], v), k
