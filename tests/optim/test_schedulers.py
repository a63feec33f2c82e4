"""Tests for treadle.optim.schedulers / scheduler_builder.

Sequences are checked against ``torch.optim.lr_scheduler`` where the
semantics coincide and against closed forms otherwise. The stepping loop in
``run`` mirrors the trainer contract: record the value used by an iteration,
step iteration-based schedulers after every iteration and epoch-based ones
after every epoch.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch.optim import lr_scheduler as tls

from treadle.optim import schedulers as S
from treadle.optim.scheduler_builder import SCHEDULERS, build_schedulers
from treadle.optim.schedulers import INF

BASE_LRS = (0.1, 0.05)


def make_sgd() -> torch.optim.SGD:
    """SGD with two param groups that differ in lr, momentum and weight decay."""
    w, b = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([{"params": [w]}, {"params": [b], "lr": BASE_LRS[1], "momentum": 0.8,
                                              "weight_decay": 1e-2}],
                           lr=BASE_LRS[0], momentum=0.9, weight_decay=1e-4)


def make_adam() -> torch.optim.Adam:
    w, b = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.Adam([{"params": [w]}, {"params": [b], "betas": (0.8, 0.99)}],
                            lr=1e-3, betas=(0.9, 0.999))


def read(opt, key: str = "lr") -> list[float]:
    if key == "beta0":
        return [float(g["betas"][0]) for g in opt.param_groups]
    return [float(g[key]) for g in opt.param_groups]


def run(scheds, opt, epochs: int, iters: int, key: str = "lr") -> list[list[float]]:
    """Trainer-style loop; returns the values in effect at every iteration."""
    seen = []
    for _ in range(epochs):
        for _ in range(iters):
            seen.append(read(opt, key))
            opt.step()
            for s in scheds:
                if not s.by_epoch:
                    s.step()
        for s in scheds:
            if s.by_epoch:
                s.step()
    return seen


def per_epoch(sched, opt, epochs: int) -> list[list[float]]:
    """Values at the start of each epoch for a single epoch-stepped scheduler."""
    seen = []
    for _ in range(epochs):
        seen.append(read(opt))
        opt.step()
        sched.step()
    return seen


def build(cfgs, opt, epoch_length=4, max_epochs=12, max_iters=48):
    return build_schedulers(cfgs, opt, epoch_length=epoch_length, max_epochs=max_epochs, max_iters=max_iters)


def assert_seq_close(got, want, rel=1e-10, abs_=1e-14):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == pytest.approx(w, rel=rel, abs=abs_), f"step {i}: {g} != {w}"


# ---------------------------------------------------------------------------
# Equivalence with torch.optim.lr_scheduler
# ---------------------------------------------------------------------------

TORCH_EQUIVALENTS = [
    (dict(type="StepLR", step_size=3, gamma=0.5), tls.StepLR, dict(step_size=3, gamma=0.5)),
    (dict(type="MultiStepLR", milestones=[2, 5, 5, 8], gamma=0.3), tls.MultiStepLR,
     dict(milestones=[2, 5, 5, 8], gamma=0.3)),
    (dict(type="ExponentialLR", gamma=0.8), tls.ExponentialLR, dict(gamma=0.8)),
    # MMEngine's window [begin, end) means torch's total_iters = end - begin - 1.
    (dict(type="LinearLR", start_factor=0.25, end=5), tls.LinearLR,
     dict(start_factor=0.25, end_factor=1.0, total_iters=4)),
    (dict(type="LinearLR", start_factor=1.0, end_factor=0.2, end=7), tls.LinearLR,
     dict(start_factor=1.0, end_factor=0.2, total_iters=6)),
    (dict(type="ConstantLR", factor=0.5, end=4), tls.ConstantLR, dict(factor=0.5, total_iters=3)),
    (dict(type="CosineAnnealingLR", T_max=5, eta_min=1e-3), tls.CosineAnnealingLR,
     dict(T_max=5, eta_min=1e-3)),  # 12 epochs: past T_max the cosine rises again in both
    (dict(type="PolyLR", power=2.0, end=10), tls.PolynomialLR, dict(total_iters=9, power=2.0)),
]


@pytest.mark.parametrize("cfg,torch_cls,torch_kwargs", TORCH_EQUIVALENTS,
                         ids=[c[0]["type"] + str(i) for i, c in enumerate(TORCH_EQUIVALENTS)])
def test_matches_torch_scheduler(cfg, torch_cls, torch_kwargs):
    opt = make_sgd()
    (ours,) = build(cfg, opt)
    assert ours.by_epoch is True
    ref_opt = make_sgd()
    ref = torch_cls(ref_opt, **torch_kwargs)
    assert_seq_close(per_epoch(ours, opt, 12), per_epoch(ref, ref_opt, 12))


@pytest.mark.parametrize("kwargs", [
    dict(pct_start=0.3, anneal_strategy="cos", three_phase=False),
    dict(pct_start=0.25, anneal_strategy="linear", three_phase=True, div_factor=10.0, final_div_factor=100.0),
])
def test_onecycle_matches_torch(kwargs):
    n = 30
    opt = make_sgd()
    (ours,) = build(dict(type="OneCycleLR", eta_max=[0.5, 0.2], by_epoch=False, **kwargs), opt, max_iters=n)
    assert ours.total_steps == n  # defaults to end - begin
    ref_opt = make_sgd()
    ref = tls.OneCycleLR(ref_opt, max_lr=[0.5, 0.2], total_steps=n, cycle_momentum=False, **kwargs)
    assert_seq_close(per_epoch(ours, opt, n), per_epoch(ref, ref_opt, n))
    # Past `end` the value is left alone (torch would raise instead).
    last = read(opt)
    ours.step()
    assert read(opt) == last


def test_reduce_on_plateau_matches_torch():
    metrics = [1.0, 0.9, 0.9, 0.95, 0.9, 0.89999, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]
    opt = make_sgd()
    # end=100: with the default end=max_epochs the last validation falls outside the
    # window (the train-epoch step() comes first), exactly as in MMEngine.
    (ours,) = build(dict(type="ReduceOnPlateauLR", monitor="loss", patience=1, factor=0.5, cooldown=1,
                         min_value=0.02, end=100), opt)
    assert ours.need_val_args and ours.by_epoch
    ref_opt = make_sgd()
    ref = tls.ReduceLROnPlateau(ref_opt, mode="min", factor=0.5, patience=1, cooldown=1, min_lr=0.02)
    got, want = [], []
    for m in metrics:
        ours.step()  # end of the training epoch: only counts
        ours.step({"loss": torch.tensor(m), "acc": 0.0})
        ref.step(m)
        got.append(read(opt))
        want.append(read(ref_opt))
    assert_seq_close(got, want)
    assert got[-1] != got[0]  # it did reduce
    with pytest.raises(KeyError, match=r"ReduceOnPlateauLR monitor='loss' is not among the validation results "
                                       r"\['acc', 'val/acc'\]"):
        ours.step({"acc": 1.0, "val/acc": 1.0})
    with pytest.raises(TypeError, match="dict"):
        ours.step(0.5)


def test_reduce_on_plateau_greater_rule_and_window():
    opt = make_sgd()
    sched = S.ReduceOnPlateauLR(opt, monitor="acc", rule="greater", patience=0, factor=0.5,
                                threshold_rule="abs", threshold=0.1, begin=2)
    values = []
    for acc in [0.5, 0.5, 0.5, 0.55, 0.7, 0.7]:
        values.append(read(opt)[0])
        sched.step()
        sched.step({"acc": acc})
    # The train-epoch step() runs first, so epoch e is step e + 1: epoch 0 is before
    # `begin`. Epoch 1: 0.5 is the first best; epoch 2: not better -> halve (patience 0);
    # epoch 3: 0.55 is not better by 0.1 -> halve; epoch 4: 0.7 is; epoch 5: not -> halve.
    assert values == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.025, 0.025])
    assert read(opt)[0] == pytest.approx(0.0125)


# ---------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------

def cosine(t: float, T: float, hi: float, lo: float) -> float:
    return lo + (hi - lo) * (1 + math.cos(math.pi * t / T)) / 2


def test_cosine_eta_min_ratio_closed_form():
    opt = make_sgd()
    (s,) = build(dict(type="CosineAnnealingLR", eta_min_ratio=0.1, by_epoch=False), opt, max_iters=20)
    assert s.T_max == 20
    got = run([s], opt, epochs=5, iters=4)
    want = [[cosine(i, 20, b, 0.1 * b) for b in BASE_LRS] for i in range(20)]
    assert_seq_close(got, want)


def test_poly_with_eta_min_closed_form():
    opt = make_sgd()
    (s,) = build(dict(type="PolyLR", eta_min=0.01, power=0.9, by_epoch=False, end=11), opt)
    got = run([s], opt, epochs=4, iters=4)
    # After `end` the value stays at eta_min.
    want = [[(b - 0.01) * (1 - min(i, 10) / 10) ** 0.9 + 0.01 for b in BASE_LRS] for i in range(16)]
    assert_seq_close(got, want)


def test_cosine_restart_closed_form():
    periods, weights = [4, 6, 8], [1.0, 0.5, 0.25]
    opt = make_sgd()
    (s,) = build(dict(type="CosineRestartLR", periods=periods, restart_weights=weights, eta_min=1e-3,
                      by_epoch=False), opt)
    got = run([s], opt, epochs=6, iters=4)
    want, t0 = [], 0
    for p, w in zip(periods, weights):
        want += [[cosine(t, p, b * w, 1e-3) for b in BASE_LRS] for t in range(p)]
        t0 += p
    want += [want[-1]] * (24 - t0)  # past the last period the value is left alone
    assert_seq_close(got, want)


def test_begin_end_window_leaves_value_untouched_outside():
    opt = make_sgd()
    (s,) = build(dict(type="ExponentialLR", gamma=0.5, begin=3, end=6), opt)
    got = [v[0] for v in per_epoch(s, opt, 9)]
    b = BASE_LRS[0]
    assert got == pytest.approx([b, b, b, b, b / 2, b / 4, b / 4, b / 4, b / 4])

    opt = make_sgd()
    (s,) = build(dict(type="StepLR", step_size=2, gamma=0.1, by_epoch=False, begin=5, end=10), opt)
    got = [v[0] for v in run([s], opt, epochs=3, iters=4)]
    want = [b] * 7 + [b * 0.1] * 2 + [b * 0.01] * 3  # last_step counts from `begin`
    assert got == pytest.approx(want)


def test_constant_lr_window():
    opt = make_sgd()
    (s,) = build(dict(type="ConstantLR", factor=0.25, begin=2, end=5), opt)
    got = [v[1] for v in per_epoch(s, opt, 7)]
    b = BASE_LRS[1]
    assert got == pytest.approx([b, b, b / 4, b / 4, b, b, b])


def test_warmup_then_cosine_converted_to_iterations():
    L, E, W = 5, 8, 5  # one epoch of linear warmup, then cosine from epoch 1 to 8
    opt = make_sgd()
    cfgs = [dict(type="LinearLR", start_factor=0.01, by_epoch=False, begin=0, end=W),
            dict(type="CosineAnnealingLR", by_epoch=True, begin=1, end=E, eta_min=1e-4,
                 convert_to_iter_based=True)]
    warm, cos = build(cfgs, opt, epoch_length=L, max_epochs=E, max_iters=E * L)
    assert (warm.by_epoch, cos.by_epoch) == (False, False)
    assert (cos.begin, cos.end, cos.T_max) == (L, E * L, (E - 1) * L)
    got = run([warm, cos], opt, epochs=E, iters=L)
    want = []
    for i in range(E * L):
        if i < W:
            want.append([b * (0.01 + (1 - 0.01) * i / (W - 1)) for b in BASE_LRS])
        else:
            want.append([cosine(i - L, (E - 1) * L, b, 1e-4) for b in BASE_LRS])
    assert_seq_close(got, want, rel=1e-9)
    assert [g["initial_lr"] for g in opt.param_groups] == list(BASE_LRS)


def test_two_schedulers_compose_multiplicatively():
    L = 3
    opt = make_sgd()
    scheds = build([dict(type="ExponentialLR", gamma=0.9, by_epoch=False),
                    dict(type="StepLR", step_size=2, gamma=0.5)], opt, epoch_length=L)
    got = run(scheds, opt, epochs=6, iters=L)
    want = [[b * 0.9 ** i * 0.5 ** ((i // L) // 2) for b in BASE_LRS] for i in range(6 * L)]
    assert_seq_close(got, want)


def test_multistep_converted_to_iterations():
    opt = make_sgd()
    (s,) = build(dict(type="MultiStepLR", milestones=[1, 3], gamma=0.1, convert_to_iter_based=True),
                 opt, epoch_length=4, max_epochs=5)
    assert s.by_epoch is False and s.end == 20
    got = [v[0] for v in run([s], opt, epochs=5, iters=4)]
    b = BASE_LRS[0]
    assert got == pytest.approx([b] * 4 + [b * 0.1] * 8 + [b * 0.01] * 8)


# ---------------------------------------------------------------------------
# Momentum and generic schedulers
# ---------------------------------------------------------------------------

def test_momentum_on_sgd():
    opt = make_sgd()
    (s,) = build(dict(type="CosineAnnealingMomentum", eta_min=0.5, by_epoch=False), opt, max_iters=12)
    got = run([s], opt, epochs=3, iters=4, key="momentum")
    want = [[cosine(i, 12, m, 0.5) for m in (0.9, 0.8)] for i in range(12)]
    assert_seq_close(got, want)
    assert read(opt) == pytest.approx(list(BASE_LRS))  # lr untouched
    assert [g["initial_momentum"] for g in opt.param_groups] == [0.9, 0.8]


def test_momentum_drives_adam_beta0():
    opt = make_adam()
    scheds = build([dict(type="LinearMomentum", start_factor=0.5, end=5),
                    dict(type="StepMomentum", step_size=2, gamma=0.9, begin=5)], opt)
    got = []
    for _ in range(10):
        got.append(read(opt, "beta0"))
        opt.param_groups[0]["params"][0].grad = torch.ones(2, 2)
        opt.step()  # Adam must still accept the rewritten betas
        for s in scheds:
            s.step()
    want = [[m * (0.5 + 0.5 * min(t, 4) / 4) * 0.9 ** (max(t - 5, 0) // 2) for m in (0.9, 0.8)]
            for t in range(10)]
    assert_seq_close(got, want)
    assert [g["betas"][1] for g in opt.param_groups] == [0.999, 0.99]
    assert read(opt, "momentum") == read(opt, "beta0")


def test_momentum_scheduler_needs_momentum():
    opt = torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="momentum"):
        S.ExponentialMomentum(opt, gamma=0.9)


def test_generic_scheduler_on_weight_decay():
    opt = make_sgd()
    (s,) = build(dict(type="StepParamScheduler", param_name="weight_decay", step_size=2, gamma=0.1), opt)
    got = per_epoch(s, opt, 6)
    got_wd = [[float(g["weight_decay"]) for g in opt.param_groups]]
    assert [g["initial_weight_decay"] for g in opt.param_groups] == [1e-4, 1e-2]
    assert read(opt) == pytest.approx(list(BASE_LRS))  # lr untouched
    assert got_wd[0] == pytest.approx([1e-4 * 1e-3, 1e-2 * 1e-3])
    assert s.get_last_value() == got_wd[0]
    assert len(got) == 6
    with pytest.raises(ValueError, match="no key 'nesterovv'"):
        S.ExponentialParamScheduler(opt, param_name="nesterovv", gamma=0.5)


# ---------------------------------------------------------------------------
# State dict round trip
# ---------------------------------------------------------------------------

ROUND_TRIP_CASES = {
    "warmup+cosine": [dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=6),
                      dict(type="CosineAnnealingLR", begin=1, eta_min_ratio=0.05, convert_to_iter_based=True)],
    "multistep+momentum": [dict(type="MultiStepLR", milestones=[2, 2, 4], gamma=0.5),
                           dict(type="CosineRestartMomentum", periods=[9, 15], restart_weights=[1, 0.9],
                                eta_min=0.5, by_epoch=False)],
    "onecycle": [dict(type="OneCycleLR", eta_max=0.3, by_epoch=False, anneal_strategy="linear")],
    "poly+const": [dict(type="ConstantLR", factor=0.5, end=3), dict(type="PolyLR", power=1.5, begin=2,
                                                                        by_epoch=False)],
}


@pytest.mark.parametrize("name", list(ROUND_TRIP_CASES))
def test_state_dict_round_trip_continues_exactly(name):
    cfgs, L, E, cut = ROUND_TRIP_CASES[name], 4, 6, 2
    opt = make_sgd()
    full = run(build(cfgs, opt, epoch_length=L, max_epochs=E, max_iters=E * L), opt, epochs=E, iters=L)

    opt = make_sgd()
    scheds = build(cfgs, opt, epoch_length=L, max_epochs=E, max_iters=E * L)
    first = run(scheds, opt, epochs=cut, iters=L)
    buf = io.BytesIO()
    torch.save({"optim": opt.state_dict(), "scheds": [s.state_dict() for s in scheds]}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)  # plain data only: no functions/objects

    opt2 = make_sgd()
    scheds2 = build(cfgs, opt2, epoch_length=L, max_epochs=E, max_iters=E * L)
    opt2.load_state_dict(ckpt["optim"])
    for s, state in zip(scheds2, ckpt["scheds"]):
        s.load_state_dict(state)
    rest = run(scheds2, opt2, epochs=E - cut, iters=L)
    assert first + rest == full  # bit-exact continuation


def test_reduce_on_plateau_state_round_trip():
    opt = make_sgd()
    s = S.ReduceOnPlateauMomentum(opt, patience=1, factor=0.5, cooldown=2)
    for m in [1.0, 1.0, 1.0]:
        s.step()
        s.step({"loss": m})
    buf = io.BytesIO()
    torch.save(s.state_dict(), buf)
    buf.seek(0)
    s2 = S.ReduceOnPlateauMomentum(make_sgd(), patience=7)
    s2.load_state_dict(torch.load(buf, weights_only=True))
    assert s2.state_dict() == s.state_dict()
    with pytest.warns(UserWarning, match="unknown keys"):
        s2.load_state_dict({**s.state_dict(), "anneal_func": None})


# ---------------------------------------------------------------------------
# Builder defaults, pass-through and errors
# ---------------------------------------------------------------------------

def test_end_defaults_from_loop_length():
    opt = make_sgd()
    a, b, c, d = build([dict(type="CosineAnnealingLR"),
                        dict(type="LinearLR", by_epoch=False, begin=2),
                        dict(type="CosineAnnealingLR", begin=1, convert_to_iter_based=True),
                        dict(type="OneCycleLR", eta_max=0.2, by_epoch=False, begin=8)],
                       opt, epoch_length=4, max_epochs=12, max_iters=48)
    assert (a.end, a.T_max, a.by_epoch) == (12, 12, True)
    assert (b.end, b.total_iters, b.by_epoch) == (48, 45, False)
    assert (c.begin, c.end, c.T_max) == (4, 48, 44)
    assert (d.end, d.total_steps) == (48, 40)
    (e,) = build(dict(type="StepLR", step_size=2), opt, max_epochs=None, max_iters=None)
    assert e.end == INF


def test_build_iter_from_epoch_classmethod():
    opt = make_sgd()
    s = S.StepLR.build_iter_from_epoch(opt, 2, gamma=0.5, begin=1, end=5, epoch_length=3)
    assert (s.step_size, s.begin, s.end, s.by_epoch) == (6, 3, 15, False)
    g = S.CosineRestartParamScheduler.build_iter_from_epoch(opt, "weight_decay", [2, 3], [1, 0.5],
                                                            eta_min=0.0, epoch_length=2)
    assert (g.periods, g.end, g.param_name) == ([4, 6], INF, "weight_decay")
    c = S.CosineAnnealingLR.build_iter_from_epoch(opt, T_max=3, begin=0.5, end=4, epoch_length=4)
    assert (c.T_max, c.begin, c.end) == (12, 2, 16)  # epoch units scaled; fractional begin allowed
    o = S.OneCycleLR.build_iter_from_epoch(make_sgd(), eta_max=0.1, total_steps=5, epoch_length=4)
    m = S.MultiStepMomentum.build_iter_from_epoch(make_sgd(), milestones=[1, 3], epoch_length=4)
    assert (o.total_steps, o.end, m.milestones) == (20, INF, {4: 1, 12: 1})
    with pytest.raises(ValueError, match="epoch_length"):
        S.LinearLR.build_iter_from_epoch(opt, epoch_length=0)


def test_objects_pass_through_and_torch_schedulers_get_by_epoch():
    opt = make_sgd()
    ours = S.ExponentialLR(opt, gamma=0.9, by_epoch=False)
    torch_sched = tls.StepLR(opt, step_size=3)
    epoch_sched = tls.ExponentialLR(opt, gamma=0.9)
    epoch_sched.by_epoch = True
    built = build([ours, torch_sched, epoch_sched, dict(type=tls.MultiStepLR, milestones=[2], by_epoch=True),
                   dict(type=S.PolyLR, power=2.0)], opt)
    assert built[:3] == [ours, torch_sched, epoch_sched]
    assert [s.by_epoch for s in built] == [False, False, True, True, True]
    assert isinstance(built[3], tls.MultiStepLR) and built[4].end == 12
    assert all(isinstance(s.by_epoch, bool) for s in built)


def test_current_lrs_and_registry():
    opt = make_sgd()
    assert [g["lr"] for g in opt.param_groups] == list(BASE_LRS)
    S.LinearLR(opt, start_factor=0.5, end=3)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.025])
    assert {"CosineAnnealingLR", "ReduceOnPlateauMomentum", "PolyParamScheduler"} <= set(SCHEDULERS)
    assert len(SCHEDULERS) == 29
    assert S.build_schedulers is build_schedulers  # lazy re-export


@pytest.mark.parametrize("cfgs,exc,patterns", [
    ([dict(type="StepLR", step_size=1), dict(type="CosineAnealingLR")], ValueError,
     ["param_scheduler[1]", "unknown scheduler type 'CosineAnealingLR'", "Did you mean 'CosineAnnealingLR'"]),
    ([dict(type="StepLR", step_size=2, gama=0.5)], TypeError,
     ["param_scheduler[0] (StepLR)", "unknown argument 'gama'", "value 0.5", "Did you mean 'gamma'"]),
    ([dict(type="StepLR")], TypeError, ["param_scheduler[0] (StepLR)", "missing required", "'step_size'"]),
    ([dict(type="LinearLR", param_name="lr")], TypeError, ["unknown argument 'param_name'"]),
    ([dict(type="StepLR", step_size=2, optimizer=None)], TypeError, ["supplied by build_schedulers"]),
    ([dict(type="CosineAnnealingLR", begin=5, end=5)], ValueError,
     ["param_scheduler[0] (CosineAnnealingLR)", "`begin` must be smaller than `end`", "begin=5, end=5"]),
    ([dict(type="LinearLR", start_factor=1.5, end=3)], ValueError,
     ["param_scheduler[0] (LinearLR)", "start_factor", "1.5"]),
    ([dict(type="ReduceOnPlateauLR", by_epoch=False)], ValueError, ["by_epoch=True", "by_epoch=False"]),
    ([dict(type="ReduceOnPlateauLR", convert_to_iter_based=True)], ValueError, ["cannot be converted"]),
    ([dict(type="CosineAnnealingLR", by_epoch=False, convert_to_iter_based=True)], ValueError,
     ["convert_to_iter_based=True needs an epoch-based config"]),
    ([dict(type="CosineRestartLR", periods=[2, 2], restart_weights=[1])], ValueError,
     ["exactly one of `eta_min` and `eta_min_ratio`"]),
    ([dict(type="OneCycleLR", eta_max=0.1, anneal_strategy="cosine", by_epoch=False)], ValueError,
     ["anneal_strategy", "'cosine'"]),
    ([dict(step_size=2)], ValueError, ["param_scheduler[0]", "no `type`"]),
    ([dict(type=42)], TypeError, ["`type` must be a scheduler name"]),
    ([dict(type=dict)], TypeError, ["neither a treadle ParamScheduler nor a torch LRScheduler"]),
    ([dict(type=tls.ReduceLROnPlateau)], TypeError, ["ReduceOnPlateauLR"]),
    (["StepLR"], TypeError, ["param_scheduler[0]", "expected a config dict"]),
    ([dict(type="StepLR", step_size=2, by_epoch="yes")], TypeError, ["`by_epoch` must be a bool"]),
    ([dict(type="StepLR", step_size=2, begin=-1)], ValueError, ["`begin` must be a non-negative number"]),
    ([dict(type="StepLR", step_size="2")], TypeError,
     ["param_scheduler[0] (StepLR)", "`step_size`='2' has the wrong type (str); expected a number"]),
    ([dict(type="StepLR", step_size=2, gamma="0.5")], TypeError, ["`gamma`='0.5' has the wrong type (str)"]),
    ([dict(type="CosineAnnealingLR", T_max="10")], TypeError, ["`T_max`='10'", "expected a number or None"]),
    ([dict(type="StepLR", step_size=2, verbose="no")], TypeError, ["`verbose`='no'", "expected True or False"]),
    ([dict(type="ReduceOnPlateauLR", monitor=5)], TypeError, ["`monitor`=5", "expected a string"]),
    ([dict(type="ReduceOnPlateauLR", patience="3")], TypeError, ["`patience`='3'"]),
])
def test_builder_errors_are_clear(cfgs, exc, patterns):
    with pytest.raises(exc) as info:
        build(cfgs, make_sgd())
    for pattern in patterns:
        assert pattern in str(info.value), str(info.value)


def test_builder_errors_needing_loop_info():
    with pytest.raises(ValueError) as info:
        build_schedulers([dict(type="MultiStepLR", milestones=[1], convert_to_iter_based=True)], make_sgd(),
                         epoch_length=None, max_epochs=3, max_iters=None)
    assert "param_scheduler[0] (MultiStepLR)" in str(info.value) and "`epoch_length`" in str(info.value)
    with pytest.raises(ValueError) as info:
        build_schedulers(dict(type="CosineAnnealingLR"), make_sgd(), epoch_length=None, max_epochs=None,
                         max_iters=None)
    assert "`end` is not set and max_epochs is unknown" in str(info.value)


def test_a_step_before_the_optimizers_warns_once_with_torchs_link():
    """As torch's and MMEngine's schedulers do, for hand-written loops; not in the Trainer
    (its hook orders the calls) nor over an accumulating wrapper from prepare()."""
    import warnings

    from treadle.optim.schedulers import StepLR

    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = StepLR(opt, step_size=3)
    with pytest.warns(UserWarning, match="how-to-adjust-learning-rate"):
        sched.step()
    opt2 = torch.optim.SGD([param], lr=0.1)
    sched2 = StepLR(opt2, step_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt2.step()
        sched2.step()  # in order: quiet
        sched2.step()
    opt3 = torch.optim.SGD([param], lr=0.1)
    sched3 = StepLR(opt3, step_size=3)
    opt3.step = lambda: None  # replaced after the scheduler was built: its steps are not seen
    opt3.step()
    with pytest.warns(UserWarning, match="optimizer.step was replaced"):
        sched3.step()


def test_prepare_and_the_trainer_do_not_check_the_order():
    import warnings

    import treadle

    s = treadle.build_strategy("single")
    _, ow, scheds = s.prepare(torch.nn.Linear(2, 1), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1),
                                                                        accumulative_counts=2),
                              param_scheduler=[dict(type="LinearLR", start_factor=0.5, by_epoch=False, end=4)])
    assert not scheds[0].check_order
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ow.update_params(s.model(torch.ones(1, 2, device=s.device)).sum())  # the window is open: no optimizer step yet
        scheds[0].step()
