"""FSDPStrategy: 2 gloo processes on CPU train exactly like one process with the whole batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dist_support import run_ranks
from treadle.compat import fsdp_cpu_problem
from treadle.optim.wrapper import OptimWrapper
from treadle.strategies.build import resolve_strategy
from treadle.strategies.fsdp import FSDPStrategy, mixed_precision_policy

B = 4  # per-rank batch; the single-process reference uses 2 * B
STEPS = 3


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 10)
        self.blocks = nn.ModuleList([Block(10), Block(10)])
        self.head = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make_model() -> MLP:
    torch.manual_seed(0)
    return MLP()


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "SGD":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(2 * B, 6, generator=g), torch.randn(2 * B, 3, generator=g)


def train(model: nn.Module, ow: OptimWrapper, rank: int, world: int, micro: int = 1) -> None:
    """STEPS optimizer steps; this rank's share of each global batch, in ``micro`` micro-batches."""
    for step in range(STEPS):
        x, y = batch(step)
        n = x.shape[0] // world
        x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            with ow.optim_context():
                loss = nn.functional.mse_loss(model(xm), ym)
                ow.update(loss)


def fsdp_worker(rank: int, world: int) -> dict:
    from torch.distributed.fsdp import FSDPModule

    strategy = FSDPStrategy(wrap=(Block,))
    strategy.setup()
    out: dict = {}
    for opt_name, micro in (("SGD", 1), ("AdamW", 1), ("AdamW", 2)):
        model = strategy.setup_model(make_model())
        assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.blocks)
        assert not isinstance(model.stem, FSDPModule)  # not in the policy: part of the root's group
        ow = OptimWrapper(make_optimizer(opt_name, model), accumulate=micro)
        strategy.setup_optim_wrapper(ow, model)
        assert ow.gradient_sync.no_sync is not None  # accumulation skips the reduce-scatter
        train(model, ow, rank, world, micro)
        out[f"{opt_name}/{micro}"] = strategy.get_full_model_state(model)
        sharded = strategy.get_model_state(model)
        out.setdefault("local_numel", sum(t.to_local().numel() for t in sharded.values()))
    try:  # sharded tensors outside the entries written sharded (an EMA copy) are refused before writing
        sd = strategy.get_model_state(model)
        strategy.write_checkpoint("unused", {"state.pt": {"model": sd, "optim": {}, "hooks": {"EMAHook": {"ema": sd}}}},
                                  {}, sharded=("model", "optim"))
    except ValueError as e:
        out["full_save_error"] = str(e)
    # An optimizer built before wrapping holds the replaced parameters.
    model = make_model()
    early = torch.optim.SGD(model.parameters(), lr=0.1)
    model = strategy.setup_model(model)
    try:
        strategy.check_optimizer(early, model)
    except ValueError as e:
        out["stale_error"] = str(e)
    # CPU offload with gradient clipping (the norm is a DTensor over all shards).
    off = FSDPStrategy(wrap=(Block,), cpu_offload=True)
    off.setup()
    model = off.setup_model(make_model())
    ow = OptimWrapper(make_optimizer("SGD", model), clip_grad=dict(max_norm=0.5))
    train(model, ow, rank, world)
    out["offload_clip"], out["offload_norm"] = off.get_full_model_state(model), float(ow.grad_norms[-1])
    # Mixed precision and no resharding run (values are checked against the reference loosely).
    mp = FSDPStrategy(wrap=("Block",), mixed_precision=dict(param_dtype="bfloat16", reduce_dtype="float32"),
                      reshard_after_forward=False)
    mp.setup()
    model = mp.setup_model(make_model())
    ow = OptimWrapper(make_optimizer("SGD", model))
    train(model, ow, rank, world)
    out["bf16"] = mp.get_full_model_state(model)
    return out  # the full state dicts are {} on rank 1


def reference(opt_name: str, **wrapper_options) -> tuple[dict[str, torch.Tensor], OptimWrapper]:
    model = make_model()
    ow = OptimWrapper(make_optimizer(opt_name, model), **wrapper_options)
    train(model, ow, 0, 1)
    return model.state_dict(), ow


@pytest.fixture(scope="module")
def fsdp_results() -> list[dict]:
    if fsdp_cpu_problem(mixed_precision=True) is not None:  # the job trains bf16 too
        pytest.skip(fsdp_cpu_problem(mixed_precision=True))
    return run_ranks(fsdp_worker, world_size=2, timeout_s=120)


@pytest.mark.slow
@pytest.mark.parametrize("opt_name,micro", [("SGD", 1), ("AdamW", 1), ("AdamW", 2)])
def test_two_ranks_match_one_process_with_double_batch(fsdp_results: list[dict], opt_name: str, micro: int) -> None:
    got, want = fsdp_results[0][f"{opt_name}/{micro}"], reference(opt_name)[0]
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.slow
def test_parameters_are_sharded(fsdp_results: list[dict]) -> None:
    total = sum(p.numel() for p in make_model().parameters())
    assert fsdp_results[0]["local_numel"] + fsdp_results[1]["local_numel"] == total
    assert fsdp_results[0]["local_numel"] < total


@pytest.mark.slow
def test_bf16_mixed_precision_trains_close_to_fp32(fsdp_results: list[dict]) -> None:
    got, want = fsdp_results[0]["bf16"], reference("SGD")[0]
    assert all(v.dtype == torch.float32 for v in got.values())  # sharded master weights stay fp32
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0.05, atol=0.02, msg=k)


@pytest.mark.slow
def test_cpu_offload_and_clipping_match_one_process(fsdp_results: list[dict]) -> None:
    want, ow = reference("SGD", clip_grad=dict(max_norm=0.5))
    assert fsdp_results[0]["offload_norm"] == pytest.approx(float(ow.grad_norms[-1]), rel=1e-5)
    for k in want:
        torch.testing.assert_close(fsdp_results[0]["offload_clip"][k], want[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.slow
def test_misuse_is_reported(fsdp_results: list[dict]) -> None:
    for r in fsdp_results:
        assert "state['hooks']['EMAHook']['ema']" in r["full_save_error"]
        assert "an entry that is not written sharded" in r["full_save_error"]
        assert "built before FSDPStrategy.setup_model()" in r["stale_error"]
        assert "optimizer=dict(type=" in r["stale_error"]


def test_one_process_places_without_sharding_and_checks_options() -> None:
    s = resolve_strategy(dict(type="fsdp", wrap=["Block"]))
    assert isinstance(s, FSDPStrategy)
    s.setup()
    model = make_model()
    assert s.setup_model(model) is model and s.unwrap(model) is model
    s.check_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    with pytest.raises(ValueError, match="built before"):
        s.check_optimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), model)
    with pytest.raises(ValueError, match=r"\['Blok'\] match no submodule.*'Block'"):
        FSDPStrategy(wrap=("Blok",)).setup_model(make_model())
    policy = mixed_precision_policy(dict(param_dtype="bf16", reduce_dtype=torch.float32))
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    with pytest.raises(ValueError, match="unknown keys"):
        FSDPStrategy(mixed_precision=dict(param_type="bf16"))
    with pytest.raises(ValueError, match="param_dtype"):
        FSDPStrategy(mixed_precision=dict(param_dtype="int8"))


@pytest.mark.parametrize("mixed, version", [(None, "2.6.0"), ({"param_dtype": "bfloat16"}, "2.11.0")])
def test_a_release_that_cannot_train_fsdp_on_the_cpu_is_refused_before_sharding(monkeypatch, mixed, version) -> None:
    strategy = FSDPStrategy(mixed_precision=mixed)
    strategy.world_size = 2  # as after setup() on 2 gloo ranks; refused before any collective
    monkeypatch.setattr(torch, "__version__", version)
    model = make_model()
    with pytest.raises(RuntimeError, match=r"on the CPU \(gloo\) needs torch>=2\.(8|12), but torch 2\.(6|11)\.0 is "
                                           r"installed(;| \(older releases sum .*\);) on CUDA \(nccl\), FSDP runs "
                                           r"from torch 2\.6"):
        strategy.setup_model(model)
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())
