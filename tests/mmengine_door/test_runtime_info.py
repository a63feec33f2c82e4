"""A project's model reads MMEngine's current message hub while it trains (mmdet's TOOD head, YOLOX's
random resize): the run keeps its epoch and iteration up to date, as the Runner's RuntimeInfoHook
does (treadle/openmmlab/hooks.py, RuntimeInfo)."""

from __future__ import annotations

from treadle.config import build_trainer, resolve_config


def test_a_projects_model_sees_the_epoch_and_iteration_in_the_hub(tmp_path):
    import mm_faults  # registers HubReader in MMEngine's registry (this folder skips without MMEngine)

    mm_faults.HubReader.seen.clear()
    cfg = resolve_config({
        "default_scope": "mmengine", "model": {"type": "HubReader"},
        "train_dataloader": {"dataset": {"type": "support.make_data", "n": 4}, "batch_size": 2,
                             "sampler": {"type": "DefaultSampler", "shuffle": False}, "collate_fn": "default_collate"},
        "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.1}}, "train_cfg": {"max_epochs": 2}},
        mode="train", work_dir=str(tmp_path / "run"))
    build_trainer(cfg).fit()
    assert mm_faults.HubReader.seen == [(0, 0, 4), (0, 1, 4), (1, 2, 4), (1, 3, 4)]
