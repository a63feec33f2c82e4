"""Checkpoints of format 1 (before each piece of state had one owner) still resume exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from treadle.checkpoint.migrate import format_1_to_2, is_format_1, migrate

from format1_run import SAVE_AT, SKIP_REASON, computes_as_the_fixture, make_trainer
from support import ON_CPU

FIXTURE = Path(__file__).parent / "data" / "format1"  # saved by commit 415a029 (make_format1_fixture.py)
# The fixture was saved by a CPU run (its first 7 steps and its RNG state are the CPU's):
# the resume and the uninterrupted reference run on the CPU too.
CPU = dict(strategy=ON_CPU)


@pytest.fixture(scope="module")
def same_numbers(tmp_path_factory):
    """Skips where this machine's first 7 steps differ from the fixture's in their last bits
    (format1_run.computes_as_the_fixture): measured, not guessed from the release."""
    probe = make_trainer(tmp_path_factory.mktemp("probe"), **CPU)
    probe.fit()  # saves at SAVE_AT as the fixture's run did
    if not computes_as_the_fixture(FIXTURE, probe.work_dir / "checkpoints" / f"iter_{SAVE_AT:08d}"):
        pytest.skip(SKIP_REASON)


SAME_NUMBERS = pytest.mark.usefixtures("same_numbers")


def test_the_fixture_is_of_format_1():
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["meta"]["iter"] == SAVE_AT
    assert is_format_1(torch.load(FIXTURE / "state.pt", weights_only=True))


@SAME_NUMBERS
def test_a_format_1_checkpoint_resumes_bit_exact(tmp_path):
    """Saved mid-epoch inside an open accumulation window (gradients in the rank file),
    with a warmup scheduler and dropout; resumed by today's code, the run ends with the
    weights and optimizer state of an uninterrupted run."""
    ref = make_trainer(tmp_path / "ref", **CPU)
    ref.fit()
    src = tmp_path / "old" / "iter_00000007"
    shutil.copytree(FIXTURE, src)
    run = make_trainer(tmp_path / "run", resume=src, **CPU)
    run.fit()
    assert run.state.iter == ref.state.iter == 15
    for k, v in ref.module.state_dict().items():
        assert torch.equal(run.module.state_dict()[k], v), k
    a, b = ref.optimizer.state_dict()["state"], run.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in a)
    saved_run = json.loads((FIXTURE / "manifest.json").read_text())["meta"]["run"]
    assert run.run_id == saved_run  # the same run goes on


@SAME_NUMBERS  # elsewhere it would pass for another reason
def test_without_the_migrated_gradients_the_resume_differs(tmp_path):
    """Negative control: dropping the open window's gradients (what a migration that
    missed the rank file would do) changes the weights, so the test above can fail."""
    ref = make_trainer(tmp_path / "ref", **CPU)
    ref.fit()
    src = tmp_path / "old" / "iter_00000007"
    shutil.copytree(FIXTURE, src)
    run = make_trainer(tmp_path / "run", resume=src, **CPU)
    original = run.optim_wrapper.load_local_state_dict
    run.optim_wrapper.load_local_state_dict = lambda state: original({k: v for k, v in state.items() if k != "grads"})
    run.fit()
    assert not all(torch.equal(run.module.state_dict()[k], v) for k, v in ref.module.state_dict().items())


def test_migrate_maps_every_entry():
    state = {"model": {"w": torch.ones(1)}, "optim": {"default": {"micro_step": 1, "grads": [torch.ones(1)]}},
             "hooks": {"H": {}}, "treadle": "0.1.0",
             "trainer": {"epoch": 1, "iter": 7, "inner_iter": 2, "metrics": {"val/acc": 0.5}, "run": "r"},
             "data": {"epoch": 1, "batch_idx": 2, "open": True, "seed": 3, "world_size": 2, "batch_size": 8,
                      "phase": [0, 7], "val_due": True}}
    own = {"torch": torch.ones(1), "rank_state": {"log_windows": {"loss": [1.0]}, "grad_norms": {"default": [0.5]},
                                                  "val": {"passes": 1, "epoch": 0, "batch_idx": 0}}}
    new, new_own = format_1_to_2(state, own)
    assert set(new) == {"model", "optim", "hooks", "loop", "results", "strategy"}
    assert new["loop"] == {"epoch": 1, "iter": 7, "inner_iter": 2, "batch_idx": 2, "open": True, "seed": 3,
                           "batch_size": 8, "phase": [0, 7], "val_due": True, "world_size": 2}
    assert new["results"] == {"metrics": {"val/acc": 0.5}}
    assert new["strategy"] == {"run": "r", "world_size": 2, "treadle": "0.1.0"}
    assert "grads" not in new["optim"]["default"]  # moved to the rank file
    rank = new_own["rank_state"]  # type: ignore[index]  # a rank file was given, so one comes back
    assert rank["optim"]["default"]["grads"][0].equal(torch.ones(1))
    assert rank["optim"]["default"]["grad_norms"] == [0.5]
    assert rank["log_windows"] == {"loss": [1.0]} and rank["val"]["passes"] == 1
    assert "grads" in state["optim"]["default"]  # the arguments are not changed
    three, three_own = migrate(state, own)  # and on to format 3: the strategy's entries added
    assert {k: three[k] for k in new} == new and three_own == new_own
    assert three["data"] == [{"epoch": 1, "batch_idx": 2, "seed": 3}] and three["extra"] == {}


def test_format_3_passes_through_unchanged():
    state = {"model": {}, "optim": {}, "param_schedulers": [], "data": [], "extra": {}, "strategy": {},
             "loop": {"iter": 1}}
    assert migrate(state, None) == (state, None)
