"""``compile=True`` on the run's device (the CPU: inductor with the system C++ compiler;
CUDA: triton), through the Trainer and through the Strategy API's ``prepare(model, compile=True)``:

* training equals eager training within a stated tolerance (inductor fuses and
  reorders float32 arithmetic, so not bit for bit);
* a run stopped inside an epoch and resumed by a fresh, compiled Trainer (or strategy)
  ends bit for bit where the uninterrupted compiled run ends, dropout included
  (inductor's random numbers are seeded from torch's generator, which the checkpoint holds);
* after the first steps (and the first validation) nothing is compiled again, counted
  through torch._dynamo's counters;
* checkpoints hold the user's parameter names, without ``_orig_mod.``.

Compiling takes seconds: marked slow.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

import treadle
from treadle.seeding import seed_everything

from faults import StopAt
from support import TinyNet, make_data, to_device

pytestmark = pytest.mark.slow

# Compiled and eager runs differ by float32 rounding only (observed: at most 3e-8 on these
# weights after 2 epochs of SGD). 1e-6 absolute / 1e-5 relative is ~30x that and still
# ~1e4 below the weights' change over the run, so a step skipped, repeated or computed on
# the wrong batch fails it.
TOL = dict(rtol=1e-5, atol=1e-6)


def _compiles() -> tuple[int, int]:
    """(frames dynamo translated, unique graphs it produced) so far in this process."""
    return counters["frames"]["total"], counters["stats"]["unique_graphs"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Dynamo's caches are per process: without a reset, earlier tests' graphs (and its
    # limit of recompiles per function) would change what these tests count.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Record(treadle.Hook):
    """The compile counters after every training iteration."""

    def __init__(self) -> None:
        self.after: list[tuple[int, int]] = []

    def after_train_iter(self, trainer, batch, outputs):
        self.after.append(_compiles())


def _trainer(compile: bool, dropout: float = 0.0, work_dir=None, resume=False, hooks=(), val=False, **kw):
    seed_everything(0)
    return treadle.Trainer(
        TinyNet(dropout=dropout), work_dir=work_dir,
        train_dataloader=DataLoader(make_data(32), batch_size=8, shuffle=True),
        val_dataloader=DataLoader(make_data(16, seed=1), batch_size=8) if val else None,
        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=3, seed=0,
        log_writers=(), progress=False, compile=compile, resume=resume, hooks=list(hooks), **kw)


@pytest.fixture(scope="module")
def compiled_run():
    """One compiled 3-epoch run with validation after each epoch (4 iterations per epoch)."""
    torch._dynamo.reset()
    before = _compiles()
    record = Record()
    trainer = _trainer(True, hooks=[record], val=True)
    trainer.fit()
    return trainer, before, record


def test_trainer_compile_trains_like_eager_within_tolerance(compiled_run):
    compiled, before, _ = compiled_run
    assert _compiles()[1] > before[1]  # it really ran compiled
    eager = _trainer(False, val=True)
    eager.fit()
    seed_everything(0)
    start = to_device(TinyNet()).state_dict()  # the weights both runs started from, where they trained
    for name, w in eager.module.state_dict().items():
        c = compiled.module.state_dict()[name]
        assert not torch.allclose(w, start[name], **TOL), f"{name} did not train"
        torch.testing.assert_close(c, w, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_trainer_compile_compiles_in_the_first_steps_only(compiled_run):
    _, before, record = compiled_run
    per_iter = record.after
    assert len(per_iter) == 12
    assert per_iter[0][1] > before[1]  # the counters do see compiles: the first step compiled
    # The first validation (eval mode) may compile once more; from the second epoch on,
    # with another validation after each epoch, nothing is compiled again.
    assert per_iter[4:] == [per_iter[4]] * 8, per_iter
    assert per_iter[-1] == _compiles()  # nor by the last validation
    frames, graphs = _compiles()[0] - before[0], _compiles()[1] - before[1]
    assert frames <= 4 and graphs <= 4, (frames, graphs)  # train and eval, not one per step


def test_trainer_compile_resume_is_exact(tmp_path):
    kw = dict(dropout=0.3, checkpoint=dict(interval=1, by_epoch=False, keep=None))
    full = _trainer(True, work_dir=tmp_path / "a", **kw)
    full.fit()
    cut = _trainer(True, work_dir=tmp_path / "b", hooks=[StopAt(6)], **kw)  # inside the second epoch
    cut.fit()
    assert cut.state.iter == 6
    state = torch.load(tmp_path / "b" / "checkpoints" / "iter_00000006" / "state.pt", weights_only=True)
    assert sorted(state["model"]) == sorted(TinyNet().state_dict())  # no "_orig_mod." in checkpoints
    resumed = _trainer(True, work_dir=tmp_path / "b", resume=True, **kw)
    assert isinstance(resumed.model, torch._dynamo.eval_frame.OptimizedModule)
    resumed.fit()
    assert resumed.state.iter == full.state.iter == 12
    for name, w in full.module.state_dict().items():
        assert torch.equal(resumed.module.state_dict()[name], w), name
    a, b = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i]["momentum_buffer"], b[i]["momentum_buffer"]) for i in a)


# -- the Strategy API ----------------------------------------------------------------------
def _own_loop(work_dir, compile, dropout=0.3, stop_at=None, resume=False, record=None):
    """A hand-written loop on strategy.prepare(..., compile=compile): 2 epochs of 4 steps,
    a checkpoint after every step when work_dir is given; returns the strategy."""
    strategy = treadle.build_strategy("single", work_dir=work_dir, seed=0)
    model, ow = strategy.prepare(TinyNet(dropout=dropout), compile=compile,
                                 optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)))
    loader = strategy.prepare_dataloader(DataLoader(make_data(32), batch_size=8, shuffle=True))
    extra = strategy.load_or_resume(resume=True) if resume else None
    epoch0, it = (extra["epoch"], extra["iter"]) if extra else (0, 0)
    for epoch in range(epoch0, 2):
        for x, y in loader:
            x, y = x.to(strategy.device), y.to(strategy.device)  # the Strategy API moves no batch
            with ow.optim_context(model):
                ow.update_params(nn.functional.cross_entropy(model(x), y))
            it += 1
            if record is not None:
                record.append(_compiles())
            if work_dir is not None:
                strategy.save_checkpoint(work_dir / f"iter_{it:02d}", extra_ckpt={"epoch": epoch, "iter": it})
            if it == stop_at:
                return strategy
    return strategy


def test_strategy_prepare_compile_trains_like_eager_and_compiles_once(tmp_path):
    record: list[tuple[int, int]] = []
    before = _compiles()
    compiled = _own_loop(None, True, dropout=0.0, record=record)
    assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
    assert record[0][1] > before[1]  # the first step compiled ...
    assert record == [record[0]] * 8  # ... and no later one did
    eager = _own_loop(None, False, dropout=0.0)
    for name, w in eager.model_state_dict().items():
        torch.testing.assert_close(compiled.model_state_dict()[name], w, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_strategy_prepare_compile_resume_is_exact(tmp_path):
    full = _own_loop(tmp_path / "a", True)
    _own_loop(tmp_path / "b", True, stop_at=6)
    resumed = _own_loop(tmp_path / "b", True, resume=True)
    a, b = full.model_state_dict(), resumed.model_state_dict()
    assert sorted(a) == sorted(b) == sorted(TinyNet().state_dict())  # no "_orig_mod."
    for name, w in a.items():
        assert torch.equal(b[name], w), name
