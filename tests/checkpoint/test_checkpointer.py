"""The one checkpointer (treadle/checkpoint/checkpointer.py): what it writes for the
states it is handed, what it gives back, and what it refuses before writing."""

from __future__ import annotations

import json

import pytest
import torch

from treadle.checkpoint.checkpointer import Checkpointer, rng_file
from treadle.checkpoint.io import STATE_FILE, CheckpointError, load_checkpoint
from treadle.strategies.base import SingleDevice


class Counter:
    """A Stateful: what the checkpointer is handed."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> dict:
        return {"n": self.n, "t": torch.full((2,), float(self.n))}

    def load_state_dict(self, state: dict) -> None:
        self.n = int(state["n"])


@pytest.fixture
def ckpt() -> Checkpointer:
    return Checkpointer(SingleDevice("cpu"))


def test_states_go_to_state_pt_and_rank_states_beside_the_rng(tmp_path, ckpt):
    path = ckpt.save(tmp_path / "c", {"a": Counter(3), "plain": {"x": 1}}, rank_states={"mine": Counter(5)},
                     meta={"iter": 7}, run="run-1")
    files = load_checkpoint(path)
    assert files[STATE_FILE]["a"]["n"] == 3 and files[STATE_FILE]["plain"] == {"x": 1}
    own = files[rng_file(0)]
    assert own["rank_state"]["mine"]["n"] == 5 and {"python", "numpy", "torch"} <= set(own)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["meta"] == {"iter": 7, "run": "run-1"}


def test_load_and_restore_put_each_state_back(tmp_path, ckpt):
    ckpt.save(tmp_path / "c", {"a": Counter(3), "b": Counter(4)})
    state, own = ckpt.load(tmp_path / "c")
    a, b = Counter(), Counter()
    Checkpointer.restore({"a": a, "b": b}, state)
    assert (a.n, b.n) == (3, 4) and own is not None
    with pytest.raises(CheckpointError, match=r"no state for \['c'\]"):
        Checkpointer.restore({"c": Counter()}, state)


def test_callback_edits_the_state_before_it_is_written(tmp_path, ckpt):
    ckpt.save(tmp_path / "c", {"a": Counter(1)}, callback=lambda st: st.update(note={"by": "hook"}))
    assert load_checkpoint(tmp_path / "c")[STATE_FILE]["note"] == {"by": "hook"}


def test_non_finite_state_is_refused_before_writing(tmp_path, ckpt):
    bad = Counter(1)
    bad.state_dict = lambda: {"w": torch.tensor([1.0, float("inf")])}  # type: ignore[method-assign]  # a stand-in for this test
    with pytest.raises(FloatingPointError, match=r"'bad.w' holds NaN or inf at iteration 9; the checkpoints"):
        ckpt.save(tmp_path / "c", {"bad": bad}, meta={"iter": 9})
    with pytest.raises(FloatingPointError, match="the weight w holds NaN or inf; hint"):
        ckpt.save(tmp_path / "c", {"bad": bad}, describe=lambda st: "the weight w", hint="; hint")
    assert not (tmp_path / "c").exists()


def test_another_runs_checkpoint_is_refused_and_its_own_replaced(tmp_path, ckpt):
    ckpt.save(tmp_path / "c", {"a": Counter(1)}, run="A")
    ckpt.save(tmp_path / "c", {"a": Counter(2)}, run="A")
    with pytest.raises(CheckpointError, match=r"another run \(A\)"):
        ckpt.save(tmp_path / "c", {"a": Counter(3)}, run="B")
    assert load_checkpoint(tmp_path / "c")[STATE_FILE]["a"]["n"] == 2


def test_load_refuses_what_is_not_a_state_checkpoint(tmp_path, ckpt):
    from treadle.checkpoint.io import save_checkpoint

    save_checkpoint(tmp_path / "w", {"weights.pt": {"x": torch.zeros(1)}})
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        ckpt.load(tmp_path / "w")


def test_save_weights_writes_state_pt_alone_after_the_same_checks(tmp_path, ckpt):
    """Best weights go through the one checkpointer: its atomic write, no RNG files, and
    its refusals (non-finite, another run's path) before anything is written."""
    w = {"model": {"w": torch.ones(2)}}
    path = ckpt.save_weights(tmp_path / "best", w, meta={"iter": 4, "val/acc": 0.5}, run="run-1")
    files = load_checkpoint(path)
    assert set(files) == {STATE_FILE} and torch.equal(files[STATE_FILE]["model"]["w"], torch.ones(2))
    assert json.loads((path / "manifest.json").read_text())["meta"] == {"iter": 4, "val/acc": 0.5, "run": "run-1"}
    with pytest.raises(FloatingPointError, match=r"'model.w' holds NaN or inf at iteration 5"):
        ckpt.save_weights(tmp_path / "nan", {"model": {"w": torch.tensor([float("nan")])}}, meta={"iter": 5})
    assert not (tmp_path / "nan").exists()
    with pytest.raises(CheckpointError, match="another run"):
        ckpt.save_weights(tmp_path / "best", w, run="run-2")
