"""A run deletes, replaces or prunes only what it saved itself: best-K records, names
taken by another run, checkpoints with NaN weights, directories that cannot be written.

Every test compares the other run's files byte for byte before and after."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.directory import find_latest_checkpoint, list_checkpoints
from treadle.checkpoint.io import CheckpointError, load_checkpoint, read_manifest, save_checkpoint

from support import TinyNet, make_data


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (symlinks as their target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = b"-> " + str(p.readlink()).encode()
        elif p.is_file():
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


class Scores:
    """A validation metric that reports the given values, one per validation."""

    def __init__(self, values):
        self.values = iter(values)

    def reset(self):
        pass

    def update(self, outputs, targets):
        pass

    def compute(self):
        return next(self.values)


def make(work_dir, scores=(), **kw):
    args = dict(work_dir=work_dir, train_dataloader=DataLoader(make_data(16), batch_size=4),
                val_dataloader=DataLoader(make_data(4), batch_size=4), metrics={"s": Scores(scores)},
                loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=2, seed=0,
                checkpoint=dict(interval=1, keep=3, best="val/s", rule="max", keep_best=1), progress=False,
                log_writers=("jsonl",))
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def best_dirs(work: Path) -> list[str]:
    return sorted(p.name for p in (work / "checkpoints" / "best").iterdir())


# -- best-K ----------------------------------------------------------------------------
def test_best_records_are_relative_to_the_work_dir(tmp_path):
    t = make(tmp_path / "a", scores=[0.5, 0.6])
    t.fit()
    state = load_checkpoint(tmp_path / "a" / "checkpoints" / "epoch_0002")["state.pt"]
    assert state["hooks"]["CheckpointHook"]["best_records"] == [[0.6, "checkpoints/best/best_val_s_00000008"]]
    best = tmp_path / "a" / "checkpoints" / "best" / "best_val_s_00000008"
    assert read_manifest(best)["meta"]["run"] == t.run_id


def test_a_resume_into_another_work_dir_never_deletes_the_first_runs_best(tmp_path):
    make(tmp_path / "a", scores=[0.5, 0.6]).fit()
    before = tree(tmp_path / "a")
    c = make(tmp_path / "c", scores=[0.7, 0.8], max_epochs=4, resume=tmp_path / "a" / "checkpoints" / "epoch_0002")
    c.fit()
    assert tree(tmp_path / "a") == before  # A's best (0.6) and everything else, byte for byte
    assert best_dirs(tmp_path / "c") == ["best_val_s_00000016"]  # C's own, keep_best=1


def test_a_copied_run_resumed_in_the_copy_touches_only_the_copy(tmp_path):
    make(tmp_path / "a", scores=[0.5, 0.6]).fit()
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)
    before = tree(tmp_path / "a")
    make(tmp_path / "b", scores=[0.7, 0.8], max_epochs=4, resume=True).fit()
    assert tree(tmp_path / "a") == before
    assert best_dirs(tmp_path / "b") == ["best_val_s_00000016"]  # one best dir, as keep_best=1 says


def test_best_records_restored_from_a_crafted_checkpoint_never_delete_anything(tmp_path):
    make(tmp_path / "a", scores=[0.5, 0.6]).fit()
    victims = [tmp_path / "victim.pt", tmp_path / "a" / "victim.pth", tmp_path / "a" / "checkpoints" / "epoch_0001"]
    for v in victims[:2]:
        torch.save({"keep": torch.ones(1)}, v)
    src = tmp_path / "a" / "checkpoints" / "epoch_0002"
    payloads = load_checkpoint(src)
    records = [[0.9, str(victims[0])], [0.8, "../victim.pth"], [0.7, "checkpoints/best/../epoch_0001"],
               [0.6, "checkpoints/epoch_0001"], [0.5, str(victims[2])], ["x", 1]]
    payloads["state.pt"]["hooks"]["CheckpointHook"]["best_records"] = records
    crafted = save_checkpoint(tmp_path / "crafted", payloads, meta=read_manifest(src)["meta"])
    before = tree(tmp_path / "a" / "checkpoints")
    make(tmp_path / "a", scores=[1.0, 1.1], max_epochs=4, resume=crafted,
         checkpoint=dict(interval=None, best="val/s", rule="max", keep_best=1)).fit()
    assert victims[0].read_bytes() and victims[1].read_bytes()
    after = tree(tmp_path / "a" / "checkpoints")
    assert {k: v for k, v in after.items() if k in before} == before  # no checkpoint changed or went away


# -- names taken by another run ------------------------------------------------------------
def test_a_new_run_never_replaces_an_earlier_runs_checkpoints(tmp_path, caplog):
    first = make(tmp_path, scores=[0.5, 0.6])
    first.fit()
    before = tree(tmp_path / "checkpoints")
    second = make(tmp_path, scores=[0.9], max_epochs=1, checkpoint=dict(interval=1, keep=1, best="val/s", rule="max"))
    second.fit()
    after = tree(tmp_path / "checkpoints")
    assert {k: v for k, v in after.items() if k in before} == before  # byte for byte, none removed
    mine = [p for p in list_checkpoints(tmp_path / "checkpoints", order="created") if p.name.endswith("-v1")]
    assert [p.name for p in mine] == ["epoch_0001-v1"]
    assert read_manifest(mine[0])["meta"]["run"] == second.run_id != first.run_id
    assert best_dirs(tmp_path) == ["best_val_s_00000004", "best_val_s_00000008"]  # the first run kept one, 0.6
    assert read_manifest(tmp_path / "checkpoints" / "best" / "best_val_s_00000004")["meta"]["run"] == second.run_id
    assert find_latest_checkpoint(tmp_path / "checkpoints", order="created") == mine[0]


def test_save_checkpoint_refuses_a_path_holding_another_runs_checkpoint(tmp_path):
    first = make(tmp_path / "a", scores=[0.5], max_epochs=1)
    first.fit()
    other = make(tmp_path / "a", scores=[0.5], max_epochs=1)
    target = tmp_path / "a" / "checkpoints" / "epoch_0001"
    before = tree(target)
    with pytest.raises(CheckpointError, match=r"refusing to save to .*epoch_0001: it holds a checkpoint of another "
                                              r"run \(" + first.run_id + r"\)"):
        other.save_checkpoint(target)
    assert tree(target) == before


@pytest.mark.parametrize("damage", ["no manifest", "symlink"])
def test_a_resume_that_reaches_a_taken_name_saves_beside_it(tmp_path, damage, caplog):
    run = dict(max_epochs=None, max_iters=6, val_dataloader=None, metrics=None,
               checkpoint=dict(interval=1, by_epoch=False, keep=None))
    make(tmp_path, **run).fit()
    ckpts = tmp_path / "checkpoints"
    newest = ckpts / "iter_00000006"
    if damage == "no manifest":
        (newest / "manifest.json").unlink()
    else:
        shutil.rmtree(newest)
        newest.symlink_to(ckpts / "iter_00000005", target_is_directory=True)
    before = tree(tmp_path / "checkpoints")
    resumed = make(tmp_path, **{**run, "max_iters": 8}, resume=True)
    resumed.fit()  # steps back to iter 5, trains 6..8: iter_00000006 is taken, so -v1
    assert "iter_00000005: 5 iterations done, training goes on in epoch 2" in caplog.text and resumed.state.iter == 8
    after = tree(tmp_path / "checkpoints")
    assert {k: v for k, v in after.items() if k in before} == before
    assert (ckpts / "iter_00000006-v1" / "manifest.json").is_file()


# -- nothing written where it cannot be -------------------------------------------------
def test_a_checkpoint_dir_that_cannot_be_written_fails_before_training(tmp_path):
    (tmp_path / "checkpoints").write_text("not a directory")
    iters = []

    class Count(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            iters.append(trainer.state.iter)

    with pytest.raises(CheckpointError, match=r"checkpoints cannot be written to .*checkpoints: .*checkpoints is "
                                              r"not a directory; nothing was trained"):
        make(tmp_path, hooks=[Count()]).fit()
    assert iters == []


# -- non-finite weights ------------------------------------------------------------------
class NaNGradAt(nn.Module):
    """A finite loss whose gradient turns NaN at the ``at``-th backward pass."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.net = TinyNet()
        self.calls, self.at = 0, at
        self.net.fc1.weight.register_hook(self._grad)

    def _grad(self, g):
        self.calls += 1
        return g * float("nan") if self.calls == self.at else g

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("nan_guard", ["raise", False])
def test_a_nan_gradient_with_a_finite_loss_is_never_checkpointed(tmp_path, nan_guard):
    t = treadle.Trainer(NaNGradAt(at=7), work_dir=tmp_path, train_dataloader=DataLoader(make_data(16), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=12, seed=0,
                        checkpoint=dict(interval=1, by_epoch=False, keep=None), nan_guard=nan_guard, progress=False,
                        log_writers=("jsonl",))
    with pytest.raises(FloatingPointError, match=r"refusing to save .*iter_00000007: model weight 'net.fc1.weight' "
                                                 r"holds NaN or inf at iteration 7"):
        t.fit()
    names = [p.name for p in list_checkpoints(tmp_path / "checkpoints")]
    assert names == [f"iter_{i:08d}" for i in range(1, 7)]  # none at 7, and nothing half-written
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")] == []
    for p in list_checkpoints(tmp_path / "checkpoints"):
        for v in load_checkpoint(p)["state.pt"]["model"].values():
            assert torch.isfinite(v).all()
    assert find_latest_checkpoint(tmp_path / "checkpoints", order="created").name == "iter_00000006"


def test_non_finite_optimizer_state_is_named(tmp_path):
    t = make(tmp_path, scores=[0.5], max_epochs=1, optimizer=dict(type="Adam", lr=0.1))
    t.fit()
    state = t.optimizer.state[t.module.fc2.bias]
    state["exp_avg_sq"][0] = float("inf")
    with pytest.raises(FloatingPointError, match=r"the optimizer's 'exp_avg_sq' of parameter 'fc2.bias' holds NaN"):
        t.save_checkpoint(tmp_path / "checkpoints" / "manual")
    assert not (tmp_path / "checkpoints" / "manual").exists()
