"""Checkpoints of format 2 (the Trainer's and the Strategy API's separate layouts) still
resume exactly: real files saved by the format-2 code (make_format2_fixture.py), resumed
by today's, end where uninterrupted runs end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch


from format1_run import SAVE_AT, SKIP_REASON, TOTAL, computes_as_the_fixture, make_trainer, strategy_loop
from support import ON_CPU

DATA = Path(__file__).parent / "data"
TRAINER = DATA / "format2_trainer"  # saved by commit 22e70e6 (make_format2_fixture.py)
LOOP = DATA / "format2_strategy"
# Saved by a CPU run of torch 2.13 (see test_migrate.py): resumed and compared on the CPU.
CPU = dict(strategy=ON_CPU)


@pytest.fixture(scope="module")
def same_numbers(tmp_path_factory):
    """Skips where this machine's first steps differ from the fixtures' in their last bits
    (format1_run.computes_as_the_fixture): measured, not guessed from the release."""
    probe = make_trainer(tmp_path_factory.mktemp("probe"), **CPU)
    probe.fit()  # saves at SAVE_AT as the fixture's run did
    loop = tmp_path_factory.mktemp("probe_loop")
    strategy_loop(loop, save_at=SAVE_AT, strategy=ON_CPU)
    if not (computes_as_the_fixture(TRAINER, probe.work_dir / "checkpoints" / f"iter_{SAVE_AT:08d}")
            and computes_as_the_fixture(LOOP, loop / f"iter_{SAVE_AT}")):
        pytest.skip(SKIP_REASON)


SAME_NUMBERS = pytest.mark.usefixtures("same_numbers")


def _same(a: torch.nn.Module, b: torch.nn.Module, oa: torch.optim.Optimizer, ob: torch.optim.Optimizer) -> bool:
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    return all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items()) and all(
        torch.equal(sa[i][k], sb[i][k]) for i in sa for k in ("exp_avg", "exp_avg_sq"))


@pytest.mark.parametrize("fixture", [TRAINER, LOOP])
def test_the_fixtures_are_of_format_2(fixture):
    manifest = json.loads((fixture / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    state = torch.load(fixture / "state.pt", weights_only=True)
    keys = {"model", "optim", "hooks", "loop", "results", "strategy"} if fixture is TRAINER else \
        {"model", "optim", "param_schedulers", "data", "extra", "strategy"}
    assert set(state) == keys


@SAME_NUMBERS
def test_a_format_2_trainer_checkpoint_resumes_bit_exact(tmp_path):
    ref = make_trainer(tmp_path / "ref", **CPU)
    ref.fit()
    src = tmp_path / "old" / f"iter_{SAVE_AT:08d}"
    shutil.copytree(TRAINER, src)
    run = make_trainer(tmp_path / "run", resume=src, **CPU)
    run.fit()
    assert run.state.iter == ref.state.iter == TOTAL
    assert _same(ref.module, run.module, ref.optimizer, run.optimizer)
    assert run.learning_rates == ref.learning_rates
    assert run.run_id == json.loads((TRAINER / "manifest.json").read_text())["meta"]["run"]


@SAME_NUMBERS
def test_a_format_2_strategy_checkpoint_resumes_bit_exact(tmp_path):
    _, ref, ref_ow = strategy_loop(tmp_path / "ref", strategy=ON_CPU)
    src = tmp_path / "old" / f"iter_{SAVE_AT}"
    shutil.copytree(LOOP, src)
    _, run, run_ow = strategy_loop(tmp_path / "run", resume=src, strategy=ON_CPU)
    assert _same(ref, run, ref_ow.optimizer, run_ow.optimizer)
    assert run_ow.get_lr() == ref_ow.get_lr()


@SAME_NUMBERS  # elsewhere it would pass for another reason
def test_negative_control_without_the_loader_place_the_resume_differs(tmp_path):
    """The comparison above can fail: the same checkpoint with its loader's place set back
    to the start of the epoch ends elsewhere."""
    from treadle.checkpoint.io import load_checkpoint, save_checkpoint

    _, ref, ref_ow = strategy_loop(tmp_path / "ref", strategy=ON_CPU)
    payloads = load_checkpoint(LOOP)
    payloads["state.pt"]["data"][0]["batch_idx"] = 0
    src = save_checkpoint(tmp_path / "old" / f"iter_{SAVE_AT}", payloads)
    _, run, run_ow = strategy_loop(tmp_path / "run", resume=src, strategy=ON_CPU)
    assert not _same(ref, run, ref_ow.optimizer, run_ow.optimizer)
