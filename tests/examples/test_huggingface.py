"""Hugging Face models from the real transformers package (offline: built from configs),
trained with no wrapper: against a hand-written loop, and resumed exactly after SIGKILL."""

from __future__ import annotations

import copy
import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.io import find_latest_checkpoint, load_checkpoint
from treadle.strategies.base import move_to
from support import DEVICE, FUSED, assert_state_equal

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "huggingface" / "train.py"


def _example():
    spec = importlib.util.spec_from_file_location("hf_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_a_hugging_face_model_trains_as_a_hand_loop_does(name, tmp_path):
    ex = _example()
    torch.manual_seed(0)
    model = _no_dropout(ex.build_model(name))
    reference = copy.deepcopy(model).to(DEVICE)  # the reference runs where the run does
    data = ex.Sequences(32, seed=1, classify=name == "bert")
    loader = DataLoader(data, batch_size=8)
    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=loader, optimizer=dict(type="AdamW", lr=1e-3),
                        max_iters=4, log_interval=2, strategy="single", checkpoint=False, progress=False,
                        log_writers=["jsonl"])
    t.fit()
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, **FUSED)
    losses = []
    for batch in loader:
        out = reference(**move_to(batch, DEVICE))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    for (k, a), b in zip(t.module.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), k
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if r["mode"] == "train"]
    assert [r["loss"] for r in train] == pytest.approx([sum(losses[:2]) / 2, sum(losses[2:]) / 2], rel=1e-6)
    assert not any(k.startswith(("logits", "past_key_values", "hidden")) for r in train for k in r)


def test_bert_validation_feeds_a_torchmetrics_metric_the_logits_and_labels():
    torchmetrics = pytest.importorskip("torchmetrics")
    ex = _example()
    torch.manual_seed(0)
    model = ex.build_model("bert").eval()
    data = ex.Sequences(40, seed=2, classify=True)
    t = treadle.Trainer(model, val_dataloader=DataLoader(data, batch_size=16), strategy="single",
                        metrics={"acc": torchmetrics.classification.MulticlassAccuracy(num_classes=2, average="micro")})
    res = t.validate()
    with torch.no_grad():
        ids, labels = data.ids.to(DEVICE), data.labels.to(DEVICE)  # the model stays where the run put it,
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)  # with the metric
    assert res["val/acc"] == pytest.approx((out.logits.argmax(1) == labels).float().mean().item())
    assert res["val/loss"] == pytest.approx(out.loss.item(), rel=1e-4)


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_the_example_resumes_exactly_after_sigkill(name, tmp_path):
    """bf16, accumulation over 2, warmup then cosine (and accuracy for BERT), as the
    example runs: killed after iteration 6 (its checkpoint is at 4), resumed, it ends
    with the uninterrupted run's weights, optimizer, schedulers and log."""
    run = [sys.executable, str(ROOT / "tests" / "examples" / "hf_run.py"), name]
    whole = subprocess.run([*run, str(tmp_path / "whole")], capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = subprocess.run([*run, str(tmp_path / "cut"), "--kill-at", "6"], capture_output=True, text=True,
                            timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = subprocess.run([*run, str(tmp_path / "cut"), "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_checkpoint(find_latest_checkpoint(tmp_path / "whole" / "checkpoints"))
    b = load_checkpoint(find_latest_checkpoint(tmp_path / "cut" / "checkpoints"))
    assert find_latest_checkpoint(tmp_path / "cut" / "checkpoints").name == "iter_00000008"
    assert_state_equal(a["state.pt"]["model"], b["state.pt"]["model"], "model")
    assert_state_equal(a["state.pt"]["optim"], b["state.pt"]["optim"], "optim")

    def records(d):
        out = [json.loads(line) for line in (d / "log.jsonl").read_text().splitlines()]
        per_run = ("_time", "_per_s", "eta_s", "timestamp", "resumed_at")  # the resumed process's own
        return [{k: v for k, v in r.items() if not k.endswith(per_run)} for r in out]
    assert records(tmp_path / "whole") == records(tmp_path / "cut")
