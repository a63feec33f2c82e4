"""Checkpoints of what trains (one process): a frozen backbone's parameters are left out of
``state.pt["model"]`` and described by their digests (``state.pt["frozen"]``); a resume
over the same backbone ends where an uninterrupted run ends, bit for bit; over another
it is refused in one line naming the first tensor that differs, before anything is
loaded. ``save_frozen=True`` keeps them. PEFT models and several processes:
test_peft_resume.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import treadle
from treadle.checkpoint import frozen as frozen_module
from treadle.checkpoint.frozen import tensor_sha256
from treadle.checkpoint.io import CheckpointError, load_checkpoint
from support import assert_state_equal

OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2))
FROZEN = ["backbone.0.weight", "backbone.0.bias", "backbone.1.weight", "backbone.1.bias"]
BUFFERS = ["backbone.1.running_mean", "backbone.1.running_var", "backbone.1.num_batches_tracked"]
TRAINED = ["head.1.weight", "head.1.bias"]


class Net(nn.Module):
    """A frozen backbone (whose BatchNorm statistics still move: buffers) and a head that trains."""

    def __init__(self, base_seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(base_seed)
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        with torch.no_grad():
            for p in self.backbone.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.backbone.requires_grad_(False)
        self.head = nn.Sequential(nn.Dropout(0.3), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(48, 8, generator=g), torch.randn(48, 1, generator=g))


def _setup(work_dir, base_seed: int = 0):
    strategy = treadle.build_strategy("single", work_dir=work_dir, seed=3)
    torch.manual_seed(1)  # the head: the same in every run
    model, ow = strategy.prepare(Net(base_seed), optim_wrapper=OPTIM)
    loader = strategy.prepare_dataloader(DataLoader(_data(), batch_size=4, shuffle=True))
    return strategy, model, ow, loader


def _train(strategy, model, ow, loader, stop=24, start=0, save_at=(), **save):
    it = start
    for _ in range(2):
        for xb, yb in loader:
            ow.update_params(nn.functional.mse_loss(model(xb), yb))
            it += 1
            if it in save_at:
                strategy.save_checkpoint(strategy.work_dir / f"iter_{it}", extra_ckpt={"iter": it}, **save)
            if it == stop:
                return it
    return it


def _saved(tmp_path, **save):
    s, model, ow, loader = _setup(tmp_path / "a")
    _train(s, model, ow, loader, save_at=(5, 10), **save)
    return s, model, ow, tmp_path / "a" / "iter_5"


def test_a_checkpoint_holds_the_trained_weights_the_buffers_and_digests_of_the_rest(tmp_path):
    s, model, _, path = _saved(tmp_path)
    state = load_checkpoint(path)["state.pt"]
    assert sorted(state["model"]) == sorted(BUFFERS + TRAINED)
    assert state["frozen"]["saved"] is False and list(state["frozen"]["tensors"]) == FROZEN
    w = model.backbone[0].weight
    assert state["frozen"]["tensors"]["backbone.0.weight"] == {"shape": [16, 8], "dtype": "float32",
                                                               "sha256": tensor_sha256(w)}


def test_a_resume_over_the_same_base_ends_where_the_uninterrupted_run_ends(tmp_path):
    s, model, ow, path = _saved(tmp_path)
    s2, model2, ow2, loader2 = _setup(tmp_path / "b")  # a freshly built model: the same base
    extra = s2.resume(path)
    _train(s2, model2, ow2, loader2, start=extra["iter"])
    assert_state_equal(model2.state_dict(), model.state_dict())
    assert_state_equal(ow2.optimizer.state_dict(), ow.optimizer.state_dict())


def test_a_resume_over_another_base_is_refused_in_one_line_and_loads_nothing(tmp_path):
    _, _, _, path = _saved(tmp_path)
    s2, model2, ow2, _ = _setup(tmp_path / "b", base_seed=1)
    before = {k: v.clone() for k, v in model2.state_dict().items()}
    with pytest.raises(CheckpointError) as e:
        s2.resume(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("resume refused, nothing was loaded: frozen weight 'backbone.0.weight' differs (sha256 ")
    assert "save_frozen=True" in message
    assert_state_equal(model2.state_dict(), before)
    assert ow2.optimizer.state_dict()["state"] == {}


def test_save_frozen_keeps_them_and_the_checkpoint_resumes_over_any_base(tmp_path):
    s, model, ow, path = _saved(tmp_path, save_frozen=True)
    state = load_checkpoint(path)["state.pt"]
    assert sorted(state["model"]) == sorted(FROZEN + BUFFERS + TRAINED)
    assert state["frozen"]["saved"] is True and list(state["frozen"]["tensors"]) == FROZEN
    s2, model2, ow2, loader2 = _setup(tmp_path / "b", base_seed=1)  # another base: the checkpoint's comes back
    extra = s2.resume(path)
    _train(s2, model2, ow2, loader2, start=extra["iter"])
    assert_state_equal(model2.state_dict(), model.state_dict())
    # The frozen weights' digests were made again from what was loaded.
    later = s2.save_checkpoint(tmp_path / "b" / "later")
    assert load_checkpoint(later)["state.pt"]["frozen"] == {**state["frozen"], "saved": False}


def test_digests_are_computed_once_per_run_not_per_save(tmp_path, monkeypatch):
    hashed = []
    real = frozen_module.tensor_sha256
    monkeypatch.setattr(frozen_module, "tensor_sha256", lambda t: hashed.append(1) or real(t))
    s, model, ow, loader = _setup(tmp_path / "a")
    _train(s, model, ow, loader, save_at=(2, 4, 6, 8))
    assert len(hashed) == len(FROZEN)
    model.backbone[1].requires_grad_(True)  # another set of frozen parameters: described anew
    s.save_checkpoint(tmp_path / "a" / "other")
    assert len(hashed) == len(FROZEN) + 2


def test_a_weight_that_trains_here_but_not_in_the_checkpoint_is_refused(tmp_path):
    _, _, _, path = _saved(tmp_path)
    s2 = treadle.build_strategy("single", work_dir=tmp_path / "b", seed=3)
    net = Net()
    net.backbone[0].requires_grad_(True)
    s2.prepare(net, optim_wrapper=OPTIM)
    with pytest.raises(CheckpointError, match=r"nothing was loaded:\n  missing in checkpoint \(2\):\n    backbone.0.weight\n"):
        s2.resume(path, resume_optimizer=False)


def test_a_checkpoint_without_its_frozen_entry_is_refused_in_one_line(tmp_path):
    s, model, ow, path = _saved(tmp_path, save_frozen=True, callback=lambda st: st.pop("frozen"))
    assert "frozen" not in load_checkpoint(path)["state.pt"]
    s2, model2, ow2, loader2 = _setup(tmp_path / "b", base_seed=1)
    before = {k: v.clone() for k, v in model2.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"has no state for \['frozen'\]") as err:
        s2.resume(path)
    assert len(str(err.value).splitlines()) == 1
    assert_state_equal(model2.state_dict(), before)  # nothing was loaded


# -- the Trainer: checkpoint=dict(save_frozen=True), resume, load_from -------------------------------


def _trainer(work, base_seed=0, **kw):
    torch.manual_seed(1)
    return treadle.Trainer(Net(base_seed), work_dir=work, train_dataloader=DataLoader(_data(), batch_size=4, shuffle=True),
                           loss_fn=nn.functional.mse_loss, optimizer=dict(type="AdamW", lr=1e-2), max_iters=16,
                           seed=3, progress=False, **kw)


@pytest.mark.parametrize("saved_with,resumed_with", [(False, True), (True, False)])
def test_the_trainer_resumes_either_kind_of_checkpoint_whatever_its_own_setting(tmp_path, saved_with, resumed_with):
    whole = _trainer(tmp_path / "whole", checkpoint=dict(interval=6, by_epoch=False, save_frozen=saved_with))
    whole.fit()
    saved = tmp_path / "whole" / "checkpoints" / "iter_00000006"
    assert len(load_checkpoint(saved)["state.pt"]["model"]) == len(BUFFERS + TRAINED + (FROZEN if saved_with else []))
    resumed = _trainer(tmp_path / "b", resume=saved, checkpoint=dict(interval=6, by_epoch=False, save_frozen=resumed_with))
    resumed.fit()
    assert_state_equal(resumed.module.state_dict(), whole.module.state_dict())
    last = load_checkpoint(tmp_path / "b" / "checkpoints" / "iter_00000016")["state.pt"]
    assert last["frozen"]["saved"] is resumed_with
    assert len(last["model"]) == len(BUFFERS + TRAINED + (FROZEN if resumed_with else []))


def test_load_from_takes_the_trained_weights_over_the_same_base_and_refuses_another(tmp_path):
    whole = _trainer(tmp_path / "whole", checkpoint=dict(interval=8, by_epoch=False))
    whole.fit()
    saved = tmp_path / "whole" / "checkpoints" / "iter_00000016"
    loaded = _trainer(tmp_path / "b", load_from=saved)
    assert_state_equal(loaded.module.state_dict(), whole.module.state_dict())
    with pytest.raises(CheckpointError) as e:
        _trainer(tmp_path / "c", base_seed=1, load_from=saved)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{saved}: nothing was loaded: frozen weight 'backbone.0.weight' differs (sha256 ")


def test_a_hand_written_loops_load_checkpoint_checks_the_frozen_weights_too(tmp_path):
    s, model, _, path = _saved(tmp_path)
    s2, model2, _, _ = _setup(tmp_path / "b")
    s2.load_checkpoint(path, strict=True)  # the frozen weights left out are the model's own: nothing is missing
    for k in TRAINED:
        assert torch.equal(model2.state_dict()[k], load_checkpoint(path)["state.pt"]["model"][k]), k
    s3, model3, _, _ = _setup(tmp_path / "c", base_seed=1)
    before = {k: v.clone() for k, v in model3.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"^the checkpoint: nothing was loaded: frozen weight 'backbone.0.weight' "
                                              r"differs") as e:
        s3.load_checkpoint(path)
    assert "\n" not in str(e.value)
    assert_state_equal(model3.state_dict(), before)
