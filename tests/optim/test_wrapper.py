"""Tests for treadle.optim.wrapper.OptimWrapper: precision, accumulation, clipping.

Every behaviour is checked against the hand-written PyTorch loop it replaces: equal
to the bit (``torch.equal``) where the arithmetic is the same, ``allclose`` where it
is only mathematically equal (one batch of N*B against N micro-batches of B). The
references use ``DataLoader(..., generator=torch.Generator())`` and
``seed_everything`` so that they consume the same global RNG stream as treadle, and
run on DEVICE, as the Trainer does (CUDA where present: the same kernels, the same bits).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import DEVICE, FUSED, TinyNet, make_data, to_device
from treadle.logging.writers import read_jsonl
from treadle.optim.wrapper import GradientSync, OptimWrapper, check_clip_grad
from treadle.seeding import seed_everything


# -- helpers ---------------------------------------------------------------------------
def assert_same_weights(model: nn.Module, ref: nn.Module) -> None:
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(p, q), name


def assert_close_weights(model: nn.Module, ref: nn.Module) -> None:
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def models(seed: int = 0, dropout: float = 0.0) -> tuple[nn.Module, nn.Module]:
    """A TinyNet and an identical copy for the reference loop, both on DEVICE (where the
    Trainer puts the model: snapshots taken before fit() compare with later ones)."""
    torch.manual_seed(seed)
    model = TinyNet(dropout=dropout)
    return to_device(model), to_device(copy.deepcopy(model))


def ref_loader(data, batch_size: int):
    """The reference loop's batches, on DEVICE as the Trainer's are."""
    for batch in DataLoader(data, batch_size=batch_size, generator=torch.Generator()):
        yield to_device(batch)


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


class Recorder(treadle.Hook):
    """Records, by iteration, the hook points of the optimizer update, the lr in use
    and the weights after each iteration."""

    def __init__(self, model: nn.Module | None = None) -> None:
        self.model = model
        self.after_backward_iters: list[int] = []
        self.before_step_iters: list[int] = []
        self.lrs: list[float] = []
        self.weights: list[list[torch.Tensor]] = []

    def before_train_iter(self, trainer, batch):
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])

    def after_backward(self, trainer):
        self.after_backward_iters.append(trainer.state.iter)

    def before_optimizer_step(self, trainer):
        self.before_step_iters.append(trainer.state.iter)

    def after_train_iter(self, trainer, batch, outputs):
        if self.model is not None:
            self.weights.append(snapshot(self.model))


# -- precision: bf16 -------------------------------------------------------------------
def test_bf16_bit_equal_to_autocast_loop_and_runs_in_bf16():
    """precision="bf16" is exactly ``torch.autocast(device type, bfloat16)`` around
    the forward pass (dropout included), and the model really computes in bf16."""
    data = make_data(24)
    model, ref = models(dropout=0.3)
    dtypes: list[torch.dtype] = []
    model.fc2.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))

    t = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="AdamW", lr=1e-2), max_epochs=2, precision="bf16", seed=7)
    t.fit()
    assert dtypes == [torch.bfloat16] * 6

    seed_everything(7)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, **FUSED)
    ref.train()
    for _ in range(2):
        for x, y in ref_loader(data, 8):
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(ref(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert_same_weights(model, ref)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast, not .half()


# -- precision: fp16 with GradScaler ---------------------------------------------------
def test_fp16_bit_equal_to_grad_scaler_loop_and_scaler_state_round_trips():
    """precision="16" is autocast(float16) + ``torch.amp.GradScaler(device type)`` exactly
    as written by hand; the scaler's state is in ``state_dict()`` and loads back."""
    data = make_data(24)
    model, ref = models(dropout=0.3)
    t = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=2, precision="16", seed=7)
    t.fit()

    seed_everything(7)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, **FUSED)
    scaler = torch.amp.GradScaler(DEVICE.type)
    ref.train()
    for _ in range(2):
        for x, y in ref_loader(data, 8):
            with torch.autocast(DEVICE.type, dtype=torch.float16):
                loss = F.cross_entropy(ref(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    assert_same_weights(model, ref)

    ow = t.optim_wrapper
    assert ow.step_count == 6 and ow.skipped_steps == 0
    state = ow.state_dict()
    assert state["scaler"] == scaler.state_dict()

    # Round trip: a fresh wrapper with a non-default scale takes the saved one.
    state["scaler"]["scale"] = 1024.0
    fresh = OptimWrapper(torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.1, momentum=0.9), precision="16",
                         device_type=DEVICE.type)
    fresh.load_state_dict(state)
    assert fresh.scaler.get_scale() == 1024.0
    assert fresh.scaler.state_dict() == state["scaler"]
    assert (fresh.step_count, fresh.skipped_steps) == (6, 0)
    assert torch.equal(fresh.optimizer.state_dict()["state"][0]["momentum_buffer"],
                       opt.state_dict()["state"][0]["momentum_buffer"])


class InfLossOnCall:
    """Cross-entropy, times inf on the ``bad``-th call (0-based): inf/NaN gradients."""

    def __init__(self, bad: int) -> None:
        self.bad = bad
        self.calls = 0

    def __call__(self, out, y):
        loss = F.cross_entropy(out, y)
        if self.calls == self.bad:
            loss = loss * float("inf")
        self.calls += 1
        return loss


def test_fp16_skips_step_with_inf_gradients(tmp_path):
    """An iteration with inf gradients is skipped by the GradScaler: weights unchanged
    on it, ``skipped_steps == 1``, ``step_count`` excludes it, the iteration-based
    scheduler does not advance, the log has ``skipped_steps``/``loss_scale``, and
    the run equals the hand-written scaler loop to the bit."""
    data = make_data(40)
    model, ref = models()
    rec = Recorder(model)
    before = snapshot(model)
    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=DataLoader(data, batch_size=8),
                        loss_fn=InfLossOnCall(bad=1), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                        precision="16", schedulers=[dict(type="StepLR", step_size=1, gamma=0.5, by_epoch=False)],
                        hooks=[rec], log_interval=1, seed=0, nan_guard=False)  # the scaler handles it here
    t.fit()

    ow = t.optim_wrapper
    assert ow.skipped_steps == 1
    assert ow.step_count == 4
    weights = [before, *rec.weights]  # weights[i + 1]: after iteration i
    for i in range(5):
        same = all(torch.equal(a, b) for a, b in zip(weights[i], weights[i + 1]))
        assert same == (i == 1), i
    # The skipped iteration does not advance the scheduler.
    assert rec.lrs == [0.1, 0.05, 0.05, 0.025, 0.0125]

    # Reference: the same scaler loop, the scheduler stepped only when the step ran.
    seed_everything(0)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, **FUSED)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler(DEVICE.type)
    loss_fn = InfLossOnCall(bad=1)
    scales, skipped = [], 0
    for x, y in ref_loader(data, 8):
        with torch.autocast(DEVICE.type, dtype=torch.float16):
            loss = loss_fn(ref(x), y)
        scaler.scale(loss).backward()
        old = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if scaler.get_scale() < old:
            skipped += 1
        else:
            sched.step()
        scales.append(scaler.get_scale())
    assert skipped == 1
    assert_same_weights(model, ref)
    assert ow.state_dict()["scaler"] == scaler.state_dict()

    records = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert [r["iter"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["skipped_steps"] for r in records] == [0, 1, 1, 1, 1]
    assert [r["loss_scale"] for r in records] == scales
    assert scales[1] == scales[0] / 2


# -- gradient accumulation -------------------------------------------------------------
def test_accumulate_equals_large_batch_and_hooks_fire_per_iteration_or_step():
    """accumulate=N over micro-batches of B gives the weights of batches of N*B (mean
    loss, SGD); the optimizer steps once per window; after_backward fires every
    iteration and before_optimizer_step only when the optimizer steps."""
    data = make_data(32)
    model, ref = models()
    rec = Recorder()
    t = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=2), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.5, momentum=0.9), max_epochs=2, accumulate=4,
                        hooks=[rec], seed=0)
    t.fit()
    assert t.state.iter == 32
    assert t.optim_wrapper.step_count == 8
    assert rec.after_backward_iters == list(range(32))
    assert rec.before_step_iters == [3, 7, 11, 15, 19, 23, 27, 31]

    opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9, **FUSED)
    for _ in range(2):
        for x, y in ref_loader(data, 8):
            F.cross_entropy(ref(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert_close_weights(model, ref)


def test_accumulate_partial_window_at_epoch_end():
    """Epoch-based: an epoch of 10 batches with accumulate=4 steps after 4, 8 and 10,
    the last window dividing by 2: equal to batches of 4B, 4B, 2B."""
    data = make_data(20)  # 10 batches of B=2 per epoch
    model, ref = models()
    rec = Recorder()
    t = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=2), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.5), max_epochs=2, accumulate=4, hooks=[rec], seed=0)
    t.fit()
    assert t.optim_wrapper.step_count == 6
    assert rec.before_step_iters == [3, 7, 9, 13, 17, 19]
    assert len(rec.after_backward_iters) == 20
    assert t.optim_wrapper.micro_step == 0

    opt = torch.optim.SGD(ref.parameters(), lr=0.5, **FUSED)
    for _ in range(2):
        for x, y in ref_loader(data, 8):  # batches of 8, 8, 4 samples
            F.cross_entropy(ref(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert_close_weights(model, ref)


def test_accumulate_windows_span_epochs_in_iteration_based_training():
    """Iteration-based: windows run across epoch boundaries and only the window at
    max_iters is short (26 iterations, accumulate=4: six windows of 4, one of 2)."""
    data = make_data(20)  # 10 batches of B=2 per epoch
    model, ref = models()
    rec = Recorder()
    t = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=2), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.5), max_iters=26, accumulate=4, hooks=[rec], seed=0)
    t.fit()
    assert t.state.iter == 26
    assert t.optim_wrapper.step_count == 7
    assert rec.before_step_iters == [3, 7, 11, 15, 19, 23, 25]
    assert t.optim_wrapper.micro_step == 0

    # Reference: the stream of micro-batches, 4 per step, the last step on 2.
    stream = [b for _ in range(3) for b in ref_loader(data, 2)][:26]
    opt = torch.optim.SGD(ref.parameters(), lr=0.5, **FUSED)
    for k in range(0, 26, 4):
        window = stream[k:k + 4]
        x = torch.cat([b[0] for b in window])
        y = torch.cat([b[1] for b in window])
        F.cross_entropy(ref(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert_close_weights(model, ref)


def test_wrapper_without_announced_length_keeps_full_windows():
    """Used directly with no ``start_run``, windows are always ``accumulate`` long and
    each loss is divided by it; gradients are kept between micro-batches."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 1)
    ref = copy.deepcopy(lin)
    ow = OptimWrapper(torch.optim.SGD(lin.parameters(), lr=0.1), accumulate=3)
    x = torch.randn(7, 3)
    for i in range(7):
        w = lin.weight.detach().clone()
        ow.update(lin(x[i:i + 1]).pow(2).mean())
        assert torch.equal(lin.weight, w) == (i not in (2, 5)), i
    assert (ow.step_count, ow.micro_step) == (2, 1)
    assert lin.weight.grad is not None  # the open window's gradient is kept

    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for k in (0, 3):
        ref(x[k:k + 3]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.testing.assert_close(lin.weight, ref.weight)
    torch.testing.assert_close(lin.bias, ref.bias)


# -- gradient clipping -----------------------------------------------------------------
def run_reference_clip(ref: nn.Module, data, clip, epochs: int = 2, batch_size: int = 8, scaler=None):
    """The hand-written loop with clipping; returns the per-step total norms."""
    opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9, **FUSED)
    norms = []
    for _ in range(epochs):
        for x, y in ref_loader(data, batch_size):
            if scaler is None:
                F.cross_entropy(ref(x), y).backward()
            else:
                with torch.autocast(DEVICE.type, dtype=torch.float16):
                    loss = F.cross_entropy(ref(x), y)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
            norms.append(clip(ref.parameters()))
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
            opt.zero_grad(set_to_none=True)
    return norms


def clip_trainer(model, data, tmp_path, clip_grad, precision="32", log_interval=2):
    t = treadle.Trainer(model, work_dir=tmp_path, train_dataloader=DataLoader(data, batch_size=8),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.5, momentum=0.9),
                        max_epochs=2, clip_grad=clip_grad, precision=precision, log_interval=log_interval, seed=0)
    t.fit()
    return t


def test_clip_grad_norm_bit_equal_and_logged_grad_norm(tmp_path):
    """clip_grad=dict(max_norm=.5, norm_type=2) is ``clip_grad_norm_`` to the bit, and
    the logged grad_norm is the mean of the total norms over each log window."""
    data = make_data(32)
    model, ref = models()
    clip_trainer(model, data, tmp_path, dict(max_norm=0.5, norm_type=2))
    norms = run_reference_clip(ref, data, lambda ps: torch.nn.utils.clip_grad_norm_(ps, max_norm=0.5, norm_type=2))
    assert max(norms) > 0.5  # clipping was active
    assert_same_weights(model, ref)

    records = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert [r["iter"] for r in records] == [2, 4, 6, 8]
    expected = [((norms[i] + norms[i + 1]) / 2).item() for i in range(0, 8, 2)]
    assert [r["grad_norm"] for r in records] == pytest.approx(expected, rel=1e-5)


def test_clip_grad_value_bit_equal(tmp_path):
    """clip_grad=dict(value=0.01) is ``clip_grad_value_`` to the bit."""
    data = make_data(32)
    model, ref = models()
    clip_trainer(model, data, tmp_path, dict(value=0.01))
    seen = []

    def clip(ps):
        ps = list(ps)
        seen.append(max(p.grad.abs().max().item() for p in ps))
        torch.nn.utils.clip_grad_value_(ps, clip_value=0.01)

    run_reference_clip(ref, data, clip)
    assert max(seen) > 0.01  # clipping was active
    assert_same_weights(model, ref)


def test_fp16_clips_after_unscaling(tmp_path):
    """Under precision "16" the gradients are unscaled before clipping (the reference:
    ``scaler.unscale_(opt)`` then ``clip_grad_norm_``), and the logged norms are the
    unscaled ones."""
    data = make_data(32)
    model, ref = models()
    t = clip_trainer(model, data, tmp_path, dict(max_norm=0.5), precision="16", log_interval=1)
    scaler = torch.amp.GradScaler(DEVICE.type)
    norms = run_reference_clip(ref, data, lambda ps: torch.nn.utils.clip_grad_norm_(ps, max_norm=0.5), scaler=scaler)
    assert max(norms) > 0.5 and max(norms) < 100  # active, and unscaled
    assert t.optim_wrapper.skipped_steps == 0
    assert_same_weights(model, ref)
    records = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert [r["grad_norm"] for r in records] == pytest.approx([n.item() for n in norms], rel=1e-5)


# -- errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("clip_grad, match", [
    (dict(), "exactly one of"),
    (dict(max_norm=1, value=1), "exactly one of"),
    (dict(norm_type=2), "exactly one of"),
    (dict(max_norm=-1.0), "positive"),
    (dict(value=0), "positive"),
    (dict(value=-0.5), "positive"),
    (dict(max_norm=float("nan")), "positive"),  # NaN would turn every gradient into NaN
    (dict(max_norm="1"), "positive"),
    (dict(max_norm=1.0, foo=2), "unknown keys"),
    (dict(value=1.0, norm_type=2), "unknown keys"),
    (dict(max_norm=1.0, norm_type="fro2"), r"clip_grad norm_type='fro2' is not supported; expected a positive number"),
    (dict(max_norm=1.0, norm_type="2"), r"norm_type='2' is not supported"),
    (dict(max_norm=1.0, norm_type=0), r"norm_type=0 is not supported"),
    (dict(max_norm=1.0, norm_type=True), r"norm_type=True is not supported"),
    (dict(max_norm=1.0, norm_type=float("nan")), r"norm_type=nan is not supported"),
])
def test_bad_clip_grad_is_a_clear_error(clip_grad, match):
    """A malformed clip_grad fails at construction, in the Trainer and the wrapper."""
    model = TinyNet()
    with pytest.raises(ValueError, match=match):
        treadle.Trainer(model, train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, clip_grad=clip_grad)
    with pytest.raises(ValueError, match=match):
        OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=clip_grad)


@pytest.mark.parametrize("norm_type", [1, 2.0, 3, "inf", float("inf")])
def test_clip_grad_norm_types_torch_accepts_are_accepted(norm_type):
    assert check_clip_grad(dict(max_norm=1.0, norm_type=norm_type))["norm_type"] == norm_type


@pytest.mark.parametrize("clip_grad, match", [
    (dict(max_norm=1.0, error_if_nonfinite="yes"), r"clip_grad error_if_nonfinite='yes'; expected True or False"),
    (dict(value=1.0, foreach=1), r"clip_grad foreach=1; expected True, False or None"),
])
def test_clip_grad_flags_are_checked_by_type(clip_grad, match):
    with pytest.raises(TypeError, match=match):
        check_clip_grad(clip_grad)


def test_bad_wrapper_arguments_are_clear_errors():
    """clip_grad that is not a dict, accumulate < 1 and a non-optimizer are refused."""
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="clip_grad must be a dict"):
        OptimWrapper(opt, clip_grad=1.0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="accumulate"):
            OptimWrapper(opt, accumulate=bad)
    with pytest.raises(ValueError, match="accumulate"):
        treadle.Trainer(model, train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, accumulate=0)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        OptimWrapper(model)  # type: ignore[arg-type]  # the wrong type, on purpose
    with pytest.raises(ValueError, match="precision"):
        OptimWrapper(opt, precision="8")


def test_no_sync_context_is_entered_only_on_micro_batches_that_do_not_step():
    """optim_context() gives the strategy's no_sync (DDP) for non-closing micro-batches
    only, forward included; windows follow start_run (short last window)."""
    import contextlib

    model = nn.Linear(2, 1)
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulate=3)
    entered = []

    @contextlib.contextmanager
    def no_sync():
        entered.append(ow.micro_step)
        yield

    assert isinstance(ow.optim_context(), contextlib.nullcontext)  # no strategy hook: nothing
    ow.gradient_sync = GradientSync(no_sync=no_sync)
    ow.start_run(7)  # windows 3, 3, 1
    closes = []
    for _ in range(7):
        closes.append(ow.next_closes())
        with ow.optim_context():
            ow.update(model(torch.ones(1, 2)).sum())
    assert closes == [False, False, True, False, False, True, True]
    assert entered == [0, 1, 0, 1]  # before micro-steps 1-2 of each full window; closing ones sync
    assert ow.step_count == 3


@pytest.mark.parametrize("precision,dtype", [("32", torch.float32), ("bf16", torch.bfloat16)])
def test_optim_context_autocasts_under_16_bit_precision_and_keeps_no_sync(precision, dtype):
    """MMEngine's AmpOptimWrapper.optim_context autocasts: so does ours (and it still
    enters no_sync on micro-batches that do not step)."""
    import contextlib

    model = nn.Linear(4, 4)
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), precision=precision, accumulate=2)
    entered = []

    @contextlib.contextmanager
    def no_sync():
        entered.append(ow.micro_step)
        yield
    ow.gradient_sync = GradientSync(no_sync=no_sync)
    dtypes = []
    for _ in range(2):
        with ow.optim_context(model):
            out = model(torch.ones(2, 4))
            dtypes.append(out.dtype)
            ow.update(out.float().sum())
    assert dtypes == [dtype, dtype] and entered == [0] and ow.step_count == 1
    assert model(torch.ones(2, 4)).dtype == torch.float32  # nothing left switched on


# -- build_optim_wrapper: MMEngine's optim_wrapper dict ------------------------------------
def test_build_optim_wrapper_from_mmengine_keys():
    from treadle.optim.wrapper import OptimWrapper, build_optim_wrapper

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    ow = build_optim_wrapper(dict(optimizer=dict(type="SGD", lr=0.1, weight_decay=1e-4), accumulative_counts=4,
                                  clip_grad=dict(max_norm=2.0), paramwise_cfg=dict(norm_decay_mult=0.0)), model)
    assert (ow.accumulate, ow.clip_grad, ow.precision) == (4, {"max_norm": 2.0}, "32")
    decays = sorted(g["weight_decay"] for g in ow.optimizer.param_groups)
    assert decays[0] == 0.0 and decays[-1] == 1e-4  # paramwise_cfg reached the optimizer builder
    assert build_optim_wrapper(dict(type="AmpOptimWrapper", optimizer=dict(type="SGD", lr=0.1)), model).precision == "16"
    assert build_optim_wrapper(dict(dtype="bfloat16", optimizer=dict(type="SGD", lr=0.1)), model).precision == "bf16"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert build_optim_wrapper(opt, model).optimizer is opt
    same = OptimWrapper(opt)
    assert build_optim_wrapper(same, model) is same


@pytest.mark.parametrize("cfg,error,match", [
    (dict(optimizer=dict(type="SGD", lr=0.1), accumulate=2), ValueError, r"unknown keys \['accumulate'\]"),
    (dict(type="ApexOptimWrapper", optimizer=dict(type="SGD", lr=0.1)), ValueError, "expected 'OptimWrapper'"),
    (dict(accumulative_counts=2), ValueError, "has no 'optimizer'"),
    (dict(dtype="float64", optimizer=dict(type="SGD", lr=0.1)), ValueError, "dtype='float64'"),
    ("SGD", TypeError, "must be an OptimWrapper"),
])
def test_build_optim_wrapper_refuses_bad_configs(cfg, error, match):
    from treadle.optim.wrapper import build_optim_wrapper

    with pytest.raises(error, match=match):
        build_optim_wrapper(cfg, torch.nn.Linear(2, 2))
