"""The Trainer with FSDP2 on 2 gloo processes: equal to one process with the doubled
batch, exact-once validation with uneven batch counts, sharded checkpoints that
resume on another number of processes and export to one file."""

from __future__ import annotations


import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, fsdp_on_cpu, make_data, reshards
from treadle.checkpoint.sharded import is_sharded_checkpoint
from treadle.checkpoint.weights import export_safetensors, read_safetensors

from trainer_ranks import _final, _reference, _run

pytestmark = pytest.mark.slow  # 2 processes on gloo


@fsdp_on_cpu
def test_fsdp_trains_like_one_process_and_checkpoints_sharded(tmp_path):
    out, work = tmp_path / "out", tmp_path / "run"
    _run(out, "--strategy", "fsdp", "--work-dir", str(work), "--val", "--shuffle")
    final = _final(out)
    assert not (out / "final_rank1.pt").exists()  # full weights are gathered on rank 0 only
    for k, v in _reference(shuffle=True, accumulate=1).items():
        torch.testing.assert_close(final[k], v, rtol=1e-5, atol=1e-6)
    result = torch.load(out / "result_rank0.pt", weights_only=True)
    assert result["strategy"] == "fsdp"
    model = TinyNet()
    model.load_state_dict(final)
    x, y = make_data(37, seed=1).tensors
    with torch.no_grad():  # 19 + 18 samples in 7 + 6 batches: rank 1 replays one, uncounted
        logits = model(x)
    assert result["metrics"]["val/acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert result["metrics"]["val/loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item(), rel=1e-5)

    ckpt = work / "checkpoints" / "epoch_0002"
    assert is_sharded_checkpoint(ckpt)
    exported = read_safetensors(export_safetensors(ckpt, tmp_path / "model.safetensors"))
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)


@reshards
def test_fsdp_checkpoint_of_2_processes_resumes_on_1(tmp_path):
    out, work = tmp_path / "out", tmp_path / "run"
    _run(out, "--strategy", "fsdp", "--work-dir", str(work), "--max-epochs", "1")
    torch.manual_seed(0)
    model = TinyNet()
    trainer = treadle.Trainer(model, work_dir=work, train_dataloader=DataLoader(make_data(48), batch_size=8),
                              loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1, momentum=0.9),
                              max_epochs=2, seed=7, resume=True, log_writers=("jsonl",),
                              strategy=dict(type="fsdp", backend="gloo"))  # on the CPU, as the 2 ranks were
    trainer.fit()
    assert trainer.state.iter == 12
    for k, v in _reference(shuffle=False, accumulate=1).items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=1e-5, atol=1e-6)
