"""On CUDA the training thread never waits for the device in the steady state.

After a warm-up, a window of iterations runs under
``torch.cuda.set_sync_debug_mode("error")``: any device synchronization (``.item()``,
a blocking copy, ``torch.cuda.synchronize``) inside the step, the hooks or the batch
move raises. The run has the default hooks (timer, logger writing jsonl/csv/TensorBoard,
NaN guard, final checkpoint) and a log interval larger than the run's checked part,
so the window holds no log flush. Batches come from a pinned DataLoader: a blocking
host-to-device copy would be caught too.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import treadle
from treadle.checkpoint.async_save import AsyncCheckpointer
from treadle.checkpoint.io import load_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

WARMUP, WINDOW, TOTAL = 20, 10, 40  # iterations; the checked ones are [WARMUP, WARMUP + WINDOW)


@pytest.fixture(autouse=True)
def _restore_sync_debug_mode():
    yield
    torch.cuda.set_sync_debug_mode(0)


class _On(treadle.Hook):
    priority = "HIGHEST"  # before every other hook of the first checked iteration

    def before_train_iter(self, trainer, batch):
        if trainer.state.iter == WARMUP:
            torch.cuda.synchronize()  # the warm-up's work is done: what follows is steady state
            torch.cuda.set_sync_debug_mode("error")


class _Off(treadle.Hook):
    priority = "LOWEST"  # after every other hook of the last checked iteration

    def __init__(self) -> None:
        self.checked = 0

    def after_train_iter(self, trainer, batch, outputs):
        if WARMUP <= trainer.state.iter < WARMUP + WINDOW:
            assert torch.cuda.get_sync_debug_mode() == 2
            self.checked += 1
        if trainer.state.iter == WARMUP + WINDOW - 1:
            torch.cuda.set_sync_debug_mode(0)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64 * 32, 128, generator=g), torch.randint(0, 10, (64 * 32,), generator=g))
    return DataLoader(data, batch_size=32, shuffle=True, drop_last=True, pin_memory=True)  # 64 batches > TOTAL


@pytest.mark.parametrize("precision", ["32", "bf16"])
@pytest.mark.parametrize("optim", [dict(type="AdamW", lr=1e-3), dict(type="SGD", lr=0.1, momentum=0.9)],
                         ids=["adamw-fused", "sgd"])
@pytest.mark.parametrize("clip", [None, dict(max_norm=1.0)], ids=["noclip", "clip"])
def test_steady_state_iterations_do_not_sync(tmp_path, precision, optim, clip):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    off = _Off()
    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=_loader(), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=optim, max_iters=TOTAL, log_interval=100, precision=precision, clip_grad=clip,
                        hooks=[_On(), off], progress=False)
    assert t.strategy.device.type == "cuda"
    t.fit()  # a sync inside the window raises RuntimeError here
    assert off.checked == WINDOW and t.state.iter == TOTAL
    assert (tmp_path / "checkpoints" / f"iter_{TOTAL:08d}").is_dir()
    if optim["type"] == "AdamW":
        assert t.optimizer.defaults["fused"] is True  # chosen by default on CUDA


def test_async_checkpoint_snapshot_of_cuda_state_does_not_sync(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(256, 256).cuda()
    saver = AsyncCheckpointer()
    saver.save(tmp_path / "warm", {"state.pt": model.state_dict()})  # allocates the pinned buffers
    saver.wait()
    before = model.weight.detach().cpu().clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    saver.save(tmp_path / "ckpt", {"state.pt": model.state_dict()})  # copies queued, nothing waited for
    with torch.no_grad():
        model.weight.add_(1.0)  # ordered after the copy on the same stream
    torch.cuda.set_sync_debug_mode(0)
    saver.wait()
    got = load_checkpoint(tmp_path / "ckpt")["state.pt"]["weight"]
    assert got.device.type == "cpu" and torch.equal(got, before)
    assert all(b.is_pinned() for b, _ in saver._buffers)
