"""What a checkpoint must hold to be resumed into a trainer: refused, with the reason,
before anything is changed; and the gradients a custom step leaves are part of it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.io import CheckpointError, load_checkpoint, save_checkpoint
from treadle.checkpoint.weights import WeightsMismatchError
from treadle.seeding import seed_everything

from faults import Crash, CrashAt
from support import TinyNet, make_data


def _trainer(work_dir, model=None, **kw):
    args = dict(work_dir=work_dir, train_dataloader=DataLoader(make_data(16), batch_size=4),
                loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=1,
                seed=0, log_writers=(), progress=False)
    args.update(kw)
    return treadle.Trainer(model if model is not None else TinyNet(), **args)


@pytest.fixture
def saved(tmp_path):
    _trainer(tmp_path / "src").fit()
    return tmp_path / "src" / "checkpoints" / "epoch_0001"


def _resume_fails(tmp_path, path, error, match, **kw):
    model = kw.pop("model", None) or TinyNet()
    before = copy.deepcopy(model.state_dict())
    t = _trainer(tmp_path / "dst", model=model, resume=path, max_epochs=2, **kw)
    with pytest.raises(error, match=match):
        t.fit()
    # nothing was loaded (before: taken on the CPU; the Trainer placed the model on its device)
    assert all(torch.equal(v, model.state_dict()[k].cpu()) for k, v in before.items())


def test_a_weights_only_checkpoint_is_refused_naming_load_from(tmp_path, saved):
    weights = save_checkpoint(tmp_path / "best", {"state.pt": {"model": load_checkpoint(saved)["state.pt"]["model"]}})
    _resume_fails(tmp_path, weights, CheckpointError, r"not a complete training checkpoint: state.pt has no "
                  r"'optim' dict \(it has \['model'\]\); .*load_from=")


def test_a_broken_counter_is_refused(tmp_path, saved):
    state = load_checkpoint(saved)
    state["state.pt"]["loop"]["epoch"] = "one"
    _resume_fails(tmp_path, save_checkpoint(tmp_path / "bad", state), CheckpointError,
                  r"the checkpoint's loop position has epoch='one'; expected an int >= 0")


def test_another_model_shape_is_refused_before_anything_is_loaded(tmp_path, saved):
    other = TinyNet()
    other.fc2 = nn.Linear(other.fc2.in_features, 5)
    _resume_fails(tmp_path, saved, WeightsMismatchError,
                  r"(?s)resume needs the model the checkpoint was saved from; nothing was loaded:.*fc2.weight: "
                  r"checkpoint \(3, \d+\) vs model \(5, \d+\)", model=other)


def test_another_optimizer_is_refused(tmp_path, saved):
    _resume_fails(tmp_path, saved, CheckpointError, r"optimizer 'default': the checkpoint was saved by SGD, this "
                  r"run has Adam", optimizer=dict(type="Adam", lr=1e-3))


def test_other_param_groups_are_refused(tmp_path, saved):
    model = TinyNet()
    opt = torch.optim.SGD([{"params": model.fc1.parameters()}, {"params": model.fc2.parameters()}], lr=0.1,
                          momentum=0.9)
    _resume_fails(tmp_path, saved, CheckpointError, r"the checkpoint has 1 param group\(s\), this optimizer 2",
                  model=model, optimizer=opt)


@pytest.mark.parametrize("inner", ["", "checkpoints"])
def test_a_run_directory_is_not_a_checkpoint(tmp_path, saved, inner):
    with pytest.raises(FileNotFoundError, match=r"is a directory but not a checkpoint .*the last saved is "
                                                r".*epoch_0001\), or resume=True"):
        _trainer(tmp_path / "dst", resume=tmp_path / "src" / inner)


class StaleGrads(nn.Module):
    """A GAN-like custom step: the first update leaves gradients on ``b``, which the
    second update adds to (as a generator loss does on the discriminator)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def train_step(self, batch, trainer):
        x, y = batch
        loss_a = nn.functional.cross_entropy(self.b(self.a(x)), y)
        trainer.optim_wrappers["a"].update(loss_a)  # also leaves grads on b
        loss_b = nn.functional.cross_entropy(self.b(self.a(x).detach()), y)
        loss_b.backward()
        trainer.optim_wrappers["b"].optimizer.step()
        return {"loss": loss_b}


def test_gradients_a_custom_step_leaves_are_saved_and_restored(tmp_path):
    def run(work_dir, hooks=(), resume=False):
        seed_everything(0)
        t = _trainer(work_dir, model=StaleGrads(), loss_fn=None, max_epochs=None, max_iters=12, hooks=list(hooks),
                     optimizer={"a": dict(type="SGD", lr=0.1), "b": dict(type="SGD", lr=0.1)}, resume=resume,
                     checkpoint=dict(interval=1, by_epoch=False, keep=1))
        try:
            t.fit()
        except Crash:
            pass
        return t

    ref = run(tmp_path / "ref")
    run(tmp_path / "run", hooks=[CrashAt(7)])
    resumed = run(tmp_path / "run", resume=True)
    for name, value in ref.module.state_dict().items():
        assert torch.equal(value, resumed.module.state_dict()[name]), name


def test_validate_and_test_start_from_the_resumed_checkpoint(tmp_path, saved):
    val = DataLoader(make_data(8, seed=1), batch_size=4)
    reference = _trainer(tmp_path / "ref", val_dataloader=val, test_dataloader=val, load_from=saved)
    fresh = _trainer(tmp_path / "dst", val_dataloader=val, test_dataloader=val, resume=saved)
    assert fresh.validate() == reference.validate() and fresh.test() == reference.test()
    assert fresh.state.epoch == 1  # the counters came back too
    unloaded = _trainer(tmp_path / "other", val_dataloader=val)
    assert unloaded.validate() != reference.validate()


def test_a_trainer_checkpoint_has_the_one_layout_with_one_owner_of_each_part(tmp_path):
    """The strategy's entries and the Trainer's parts; the schedulers' states in
    param_schedulers only (not in the scheduler hook's), the loader's place in data."""
    from treadle.engine.snapshot import ENTRIES

    t = _trainer(tmp_path / "run", schedulers=[dict(type="StepLR", step_size=1, gamma=0.5, by_epoch=False)],
                 checkpoint=dict(interval=3, by_epoch=False))
    t.fit()
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "iter_00000003")["state.pt"]
    assert list(state) == list(ENTRIES)
    assert state["hooks"]["ParamSchedulerHook"] == {}
    [sched] = state["param_schedulers"]
    assert sched["last_step"] == 3 and sched["_last_value"] == [0.1 * 0.5 ** 3]  # stepped after 3 iterations
    assert state["data"] == [{"epoch": 0, "batch_idx": 3, "seed": state["loop"]["seed"]}]
    assert state["extra"] == {} and state["loop"]["iter"] == 3 and state["loop"]["open"]
