"""ProfilerHook writes Chrome/TensorBoard trace files of the scheduled iterations."""

from __future__ import annotations

import json

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.profiler import ProfilerHook

from support import TinyNet, make_data


def fit(hook, work_dir, max_epochs=1):
    t = treadle.Trainer(TinyNet(), work_dir=work_dir, train_dataloader=DataLoader(make_data(16), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=max_epochs,
                        hooks=[hook])
    t.fit()
    return t


def traces(folder):
    return sorted(folder.glob("*.pt.trace.json"))


def test_writes_a_trace_under_work_dir(tmp_path):
    hook = ProfilerHook(wait=1, warmup=1, active=2)
    t = fit(hook, tmp_path, max_epochs=2)  # 8 iterations: one cycle of 4, then stopped
    files = traces(tmp_path / "profiler")
    assert len(files) == 1 and hook.trace_dir == tmp_path / "profiler" and hook._prof is None
    events = json.loads(files[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}  # the two active iterations
    assert any("linear" in e.get("name", "") or "addmm" in e.get("name", "") for e in events)
    assert t.state.iter == 8


def test_repeat_writes_one_trace_per_cycle_to_out_dir(tmp_path):
    out = tmp_path / "traces"
    fit(ProfilerHook(wait=0, warmup=1, active=1, repeat=2, out_dir=out), None)
    assert len(traces(out)) == 2


def test_active_window_cut_short_by_the_end_is_still_written(tmp_path):
    fit(ProfilerHook(wait=2, warmup=0, active=10), tmp_path)  # 4 iterations only
    assert len(traces(tmp_path / "profiler")) == 1


def test_needs_somewhere_to_write():
    with pytest.raises(ValueError, match="out_dir"):
        fit(ProfilerHook(), None)
    with pytest.raises(ValueError, match="active"):
        ProfilerHook(active=0)
