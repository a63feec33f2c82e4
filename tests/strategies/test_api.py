"""The public Strategy API on one process (treadle/strategies/api.py): prepare,
prepare_dataloader, save_checkpoint/resume/load_checkpoint/load_or_resume, the state
dicts, and their errors. Multi-process and SIGKILL runs: test_api_resume.py."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import treadle
from treadle.checkpoint.io import CheckpointError
from treadle.optim.wrapper import OptimWrapper
from support import DEVICE, FUSED, ON_CPU

OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2), accumulative_counts=2)
WARMUP = [dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10)]


def _data(n: int = 48) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))


def _setup(work_dir, optim=OPTIM, sched=WARMUP):
    strategy = treadle.build_strategy("single", work_dir=work_dir, seed=3)
    model, ow, scheds = strategy.prepare(_net(), optim_wrapper=optim, param_scheduler=sched)
    loader = strategy.prepare_dataloader(DataLoader(_data(), batch_size=4, shuffle=True))
    return strategy, model, ow, scheds, loader


def _train(strategy, model, ow, scheds, loader, epochs, it=0, epoch0=0, save_at=(), stop_at=None):
    for epoch in range(epoch0, epochs):
        for xb, yb in loader:
            xb, yb = xb.to(strategy.device), yb.to(strategy.device)  # a loop of one's own moves its batches
            ow.update_params(nn.functional.mse_loss(model(xb), yb))
            for s in scheds:
                s.step()
            it += 1
            if it in save_at:
                strategy.save_checkpoint(strategy.work_dir / "ckpt" / f"iter_{it}", extra_ckpt={"epoch": epoch, "iter": it})
            if it == stop_at:
                return it
    return it


def test_prepare_returns_what_was_asked_for(tmp_path):
    s = treadle.build_strategy("single", seed=0)
    model = s.prepare(nn.Linear(2, 2))
    assert isinstance(model, nn.Linear)
    with pytest.raises(RuntimeError, match="called already"):
        s.prepare(nn.Linear(2, 2))
    model, ow = treadle.build_strategy("single").prepare(nn.Linear(2, 2), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    assert isinstance(ow, OptimWrapper) and ow.accumulate == 1 and ow.precision == "32"
    model, ow, scheds = treadle.build_strategy("single").prepare(nn.Linear(2, 2), optim_wrapper=OPTIM, param_scheduler=WARMUP)
    assert ow.accumulate == 2 and len(scheds) == 1
    with pytest.raises(ValueError, match="needs optim_wrapper"):
        treadle.build_strategy("single").prepare(nn.Linear(2, 2), param_scheduler=WARMUP)
    with pytest.raises(ValueError, match="unknown keys"):
        treadle.build_strategy("single").prepare(nn.Linear(2, 2),
                                                 optim_wrapper=dict(optimizer=dict(type="SGD", lr=1), accumulate=2))
    amp = treadle.build_strategy("single").prepare(nn.Linear(2, 2), optim_wrapper=dict(
        type="AmpOptimWrapper", dtype="bfloat16", optimizer=dict(type="SGD", lr=0.1)))[1]
    assert amp.precision == "bf16"


def test_prepare_builds_a_model_from_a_config_dict():
    model = treadle.build_strategy("single", seed=0).prepare(dict(type="DigitsCNN"))
    assert type(model).__name__ == "DigitsCNN"


def test_properties_and_env(tmp_path):
    s = treadle.build_strategy("single", work_dir=tmp_path, seed=5)
    assert (s.rank, s.world_size, s.distributed, s.launcher, s.seed, s.work_dir) == (0, 1, False, "none", 5, tmp_path)
    assert len(s.timestamp) == 15 and s.run_id.startswith(s.timestamp)
    system, runtime = s.collect_env()
    assert system["torch"] == torch.__version__ and runtime["seed"] == 5 and runtime["world_size"] == 1
    assert treadle.build_strategy("single").seed is not None  # drawn, as MMEngine does


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # stepped per micro-batch, on purpose
def test_hand_loop_equals_plain_torch(tmp_path):
    """accumulative_counts=2 and the warmup equal torch's AdamW + LinearLR by hand."""
    s, model, ow, scheds, _ = _setup(tmp_path)
    torch.manual_seed(11)
    ref = _net().to(DEVICE)  # where the strategy trains: the same ops on the same device
    model.load_state_dict(ref.state_dict())
    model.eval(), ref.eval()  # no dropout: the two streams draw differently
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, **FUSED)
    # MMEngine's LinearLR(begin=0, end=10) reaches the full lr at step 9: torch's total_iters=9
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=9)
    xs = [(xb.to(DEVICE), yb.to(DEVICE)) for xb, yb in DataLoader(_data(), batch_size=4)]
    for i, (xb, yb) in enumerate(xs):
        ow.update_params(nn.functional.mse_loss(model(xb), yb))
        for sc in scheds:
            sc.step()
        (nn.functional.mse_loss(ref(xb), yb) / 2).backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
        sched.step()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=1e-6, atol=1e-7)
    assert ow.get_lr() == pytest.approx([g["lr"] for g in opt.param_groups])


def test_resume_in_a_new_process_state_is_exact(tmp_path):
    """Stop after iteration 7 (checkpoint at 5, inside an accumulation window), build
    everything again, resume: the end equals an uninterrupted run's."""
    a = _setup(tmp_path / "a")
    _train(*a, epochs=3)
    b = _setup(tmp_path / "b")
    _train(*b, epochs=3, save_at=(5,), stop_at=7)
    c = _setup(tmp_path / "b")
    extra = c[0].load_or_resume(resume=True)
    assert extra == {"epoch": 0, "iter": 5}
    assert c[4].epoch == 0 and c[4].state_dict()["batch_idx"] == 5
    _train(*c, epochs=3, it=extra["iter"], epoch0=extra["epoch"])
    for k, v in a[1].state_dict().items():
        assert torch.equal(c[1].state_dict()[k], v), k
    assert a[2].optimizer.state_dict()["state"][0]["exp_avg"].equal(c[2].optimizer.state_dict()["state"][0]["exp_avg"])


def test_checkpoint_layout_and_manifest(tmp_path):
    s, model, ow, scheds, loader = _setup(tmp_path)
    _train(s, model, ow, scheds, loader, epochs=1, save_at=(3,))
    path = tmp_path / "ckpt" / "iter_3"
    manifest = json.loads((path / "manifest.json").read_text())
    # "model": what treadle export needs (treadle/checkpoint/model_info.py): here, a plain module's class and tensors
    tensors = {k: [str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in model.state_dict().items()}
    assert manifest["meta"] == {"kind": "strategy", "run": s.run_id,
                                "model": {"class": "torch.nn.modules.container.Sequential", "tensors": tensors, "tied": {}}}
    state = torch.load(path / "state.pt", weights_only=True)
    assert set(state) == {"model", "frozen", "optim", "param_schedulers", "data", "extra", "strategy"}
    assert state["frozen"] == {"saved": False, "digest": "sha256", "tensors": {}}  # nothing frozen: nothing described
    assert state["data"] == [{"epoch": 0, "batch_idx": 3, "seed": loader.seed}]
    rank = torch.load(path / "rng_rank0.pt", weights_only=True)
    assert len(rank["rank_state"]["optim"]["default"]["grads"]) == 4  # iteration 3 left a window open: its gradients


def test_extra_ckpt_must_be_plain_data(tmp_path):
    s, *_ = _setup(tmp_path)
    with pytest.raises(TypeError, match=r"extra_ckpt\['fn'\] is a builtin_function"):
        s.save_checkpoint(tmp_path / "x", extra_ckpt={"fn": print})
    assert not (tmp_path / "x").exists()


def test_another_runs_checkpoint_is_never_replaced(tmp_path):
    a, *_ = _setup(tmp_path)
    a.save_checkpoint(tmp_path / "ckpt")
    a.save_checkpoint(tmp_path / "ckpt")  # its own: replaced
    before = (tmp_path / "ckpt" / "state.pt").read_bytes()
    b, *_ = _setup(tmp_path)
    with pytest.raises(CheckpointError, match="another run"):
        b.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "state.pt").read_bytes() == before


def test_non_finite_weights_are_not_saved(tmp_path):
    s, model, *_ = _setup(tmp_path)
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="model.0.weight"):
        s.save_checkpoint(tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_resume_refuses_a_misfit_before_changing_anything(tmp_path):
    s, *_ = _setup(tmp_path)
    s.save_checkpoint(tmp_path / "ckpt")
    other = treadle.build_strategy("single", seed=0)
    model, ow = other.prepare(nn.Linear(8, 1), optim_wrapper=OPTIM)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="resume needs the model the checkpoint was saved from"):
        other.resume(tmp_path / "ckpt")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


SAVE_AT, TOTAL = 7, 15  # the Trainer run's checkpoint: mid-epoch (5 batches an epoch), inside a window of 2


class _DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _classes() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))


def _trainer_run(work_dir) -> treadle.Trainer:
    """Dropout, AdamW, accumulation of 2, clipping, a warmup per iteration, a shuffled
    loader; a checkpoint at SAVE_AT."""
    torch.manual_seed(0)
    return treadle.Trainer(
        _DropNet(), work_dir=work_dir, train_dataloader=DataLoader(_classes(), batch_size=8, shuffle=True),
        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="AdamW", lr=1e-2), max_iters=TOTAL, strategy=ON_CPU,
        accumulate=2, clip_grad=dict(max_norm=1.0), seed=0, log_writers=("jsonl",), progress=False,
        schedulers=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10)],
        checkpoint=dict(interval=SAVE_AT, by_epoch=False), log_interval=2)


def _continue_by_hand(strategy, model, ow, scheds, loader, it, total):
    """The Trainer's default step written out (fp32, loss_fn): forward, loss, update;
    the iteration schedulers after every iteration."""
    while it < total:
        for x, y in loader:
            x, y = x.to(strategy.device), y.to(strategy.device)
            with ow.optim_context(model):
                ow.update_params(nn.CrossEntropyLoss()(model(x), y))
            for sch in scheds:
                sch.step()
            it += 1
            if it == total:
                break
    return it


@pytest.mark.parametrize("control", [None, "no-schedulers", "no-loader-place"])
def test_a_trainer_checkpoint_resumes_in_a_hand_written_loop(tmp_path, control):
    """A Trainer run (dropout, AdamW, accumulation of 2, clipping, a warmup, a shuffled
    loader) saved mid-epoch inside an accumulation window, resumed by strategy.resume() in
    a hand-written loop and continued to the end: weights and optimizer state equal an
    uninterrupted Trainer run's, bit for bit. Negative controls: without the schedulers'
    states, or without the loader's place, they differ."""
    ref = _trainer_run(tmp_path / "ref")
    ref.fit()  # saves at SAVE_AT on its way
    ckpt = tmp_path / "ref" / "checkpoints" / f"iter_{SAVE_AT:08d}"

    s = treadle.build_strategy(ON_CPU, seed=0)
    model, ow, scheds = s.prepare(
        _DropNet(), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2), accumulative_counts=2,
                                      clip_grad=dict(max_norm=1.0)),
        param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10)])
    loader = s.prepare_dataloader(DataLoader(_classes(), batch_size=8, shuffle=True))
    got = s.resume(ckpt, resume_param_scheduler=control != "no-schedulers")
    assert set(got) == {"loop", "hooks", "results"}  # the Trainer's parts, handed back
    if control == "no-loader-place":
        loader.set_epoch(got["loop"]["epoch"])
    it = _continue_by_hand(s, model, ow, scheds, loader, got["loop"]["iter"], TOTAL)
    assert got["loop"]["iter"] == SAVE_AT and it == ref.state.iter == TOTAL
    a, b = ref.optimizer.state_dict()["state"], ow.optimizer.state_dict()["state"]
    same = all(torch.equal(v, model.state_dict()[k]) for k, v in ref.module.state_dict().items()) and all(
        torch.equal(a[i][k], b[i][k]) for i in a for k in ("exp_avg", "exp_avg_sq"))
    assert same is (control is None)
    if control is None:
        assert ow.get_lr() == ref.optim_wrapper.get_lr()


def test_load_checkpoint_takes_weights_only_with_revised_keys(tmp_path):
    src = _net()
    torch.save({"state_dict": {f"module.{k}": v for k, v in src.state_dict().items()}}, tmp_path / "w.pth")
    s = treadle.build_strategy("single", seed=0)
    model = s.prepare(_net())
    seen = []
    ckpt = s.load_checkpoint(tmp_path / "w.pth", callback=lambda c: seen.append(sorted(c)))
    assert seen == [["state_dict"]] and set(ckpt) == {"state_dict"}
    assert all(torch.equal(src.state_dict()[k], v.cpu()) for k, v in model.state_dict().items())  # loaded onto DEVICE


def test_load_or_resume(tmp_path):
    s, model, ow, scheds, loader = _setup(tmp_path)
    assert s.load_or_resume() is None
    assert s.load_or_resume(resume=True) is None  # nothing under work_dir yet
    _train(s, model, ow, scheds, loader, epochs=1, save_at=(2, 4))
    (tmp_path / "elsewhere").mkdir()
    # the newest saved anywhere under work_dir, by save time, not by name
    s.save_checkpoint(tmp_path / "elsewhere" / "aaa", extra_ckpt={"which": "newest"})
    t, *_ = _setup(tmp_path)
    assert t.load_or_resume(resume=True) == {"which": "newest"}
    u, *_ = _setup(tmp_path)
    assert u.load_or_resume(resume=str(tmp_path / "ckpt" / "iter_2")) == {"epoch": 0, "iter": 2}
    v = treadle.build_strategy("single", seed=0)
    weights = v.prepare(_net())
    assert v.load_or_resume(load_from=tmp_path / "ckpt" / "iter_4") is None
    saved = torch.load(tmp_path / "ckpt" / "iter_4" / "state.pt", weights_only=True, map_location="cpu")["model"]
    assert all(torch.equal(weights.state_dict()[k].cpu(), w) for k, w in saved.items())


def test_a_loader_prepared_after_the_resume_takes_its_place(tmp_path):
    s, model, ow, scheds, loader = _setup(tmp_path)
    _train(s, model, ow, scheds, loader, epochs=2, save_at=(15,))  # epoch 1, batch 3
    t = treadle.build_strategy("single", work_dir=tmp_path, seed=3)
    t.prepare(_net(), optim_wrapper=OPTIM, param_scheduler=WARMUP)
    t.load_or_resume(resume=True)
    late = t.prepare_dataloader(DataLoader(_data(), batch_size=4, shuffle=True))
    assert late.state_dict() == {"epoch": 1, "batch_idx": 3, "seed": loader.seed}


def test_state_dicts_round_trip(tmp_path):
    s, model, ow, scheds, loader = _setup(tmp_path)
    _train(s, model, ow, scheds, loader, epochs=1)
    m, o, sc = s.model_state_dict(), s.optim_state_dict(), s.scheduler_state_dict()
    t, *_ = _setup(tmp_path)
    t.load_model_state_dict(m, strict=True)
    t.load_optim_state_dict(o)
    t.load_scheduler_state_dict(sc)
    assert all(torch.equal(m[k], v) for k, v in t.model_state_dict().items())
    assert t.optim_wrapper.get_lr() == ow.get_lr()
    with pytest.raises(CheckpointError, match="1 scheduler"):
        t.load_scheduler_state_dict([])
