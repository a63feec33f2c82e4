"""activation_checkpointing= (treadle/strategies/activation_checkpointing.py): the same
losses, outputs and gradients as the model without it, bit for bit, on one process (here)
and under 2-process DDP and FSDP (tests/memory_ranks.py); less memory saved for backward;
unchanged state dict keys; the Trainer argument, its config key and its errors.

Why bit for bit: a checkpointed block runs the same ops on the same inputs in its
recomputation as in its first forward, the RNG state restored for dropout, and backward
then runs the same kernels as without checkpointing; CPU kernels are deterministic, so
nothing may differ. These tests run on the CPU on purpose (``ON_CPU``, ``.cpu()``): CUDA
kernels that use atomics are not deterministic from one call to the next, with or
without checkpointing.
"""

from __future__ import annotations

import copy
import importlib.util
import pickle
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, TinyNet, checkpointed_modules, make_data
from treadle.config import ConfigError, build_trainer, load_config
from treadle.strategies.activation_checkpointing import (
    apply_activation_checkpointing,
    find_blocks,
    is_checkpointed,
    plan_activation_checkpointing,
)

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    """benchmarks/activation_checkpointing.py as a module (its model and its measures)."""
    spec = importlib.util.spec_from_file_location("ac_bench", ROOT / "benchmarks" / "activation_checkpointing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


class Block(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln(x))))) * scale


class Stack(nn.Module):
    def __init__(self, dim: int = 8, n: int = 3) -> None:
        super().__init__()
        self.stem = nn.Linear(6, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n))
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, b in enumerate(self.blocks):
            x = b(x, scale=1.0 + i)  # a keyword argument goes through checkpointing too
        return self.head(x)


def make_stack() -> Stack:
    torch.manual_seed(0)
    return Stack()


def step(model: nn.Module, x: torch.Tensor, seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Outputs and gradients of one forward and backward, the RNG seeded first (dropout)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        assert torch.equal(a[1][name], b[1][name]), name


X = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("value, chosen", [
    ("full", ["blocks.0", "blocks.1", "blocks.2"]),
    ("selective", ["blocks.0", "blocks.1", "blocks.2"]),
    (["Block"], ["blocks.0", "blocks.1", "blocks.2"]),
    ((Block,), ["blocks.0", "blocks.1", "blocks.2"]),
    (f"{Block.__module__}.{Block.__qualname__}", ["blocks.0", "blocks.1", "blocks.2"]),
    (["blocks.1", "head"], ["blocks.1", "head"]),  # submodule paths
    (lambda m: isinstance(m, nn.Linear) and m.out_features == 32, ["blocks.0.fc1", "blocks.1.fc1", "blocks.2.fc1"]),
    ({"modules": ["Block", "Linear"], "mode": "selective"}, ["stem", "blocks.0", "blocks.1", "blocks.2", "head"]),
])
def test_outputs_and_gradients_are_bitwise_those_without_it(value, chosen) -> None:
    plain, ac = make_stack(), make_stack()
    assert apply_activation_checkpointing(ac, value) == chosen  # an inner Linear of a chosen Block is left alone
    assert checkpointed_modules(ac) == chosen
    reference = step(plain, X)
    assert_same(step(ac, X), reference)
    assert_same(step(ac, X, seed=2), step(plain, X, seed=2))  # other dropout masks, still equal
    assert not torch.equal(reference[0], step(plain, X, seed=2)[0])  # the control: dropout draws differ by seed


def test_the_recomputation_happens_and_only_with_autograd(monkeypatch) -> None:
    import torch.utils.checkpoint as cp

    calls = []
    original = cp.checkpoint
    monkeypatch.setattr(cp, "checkpoint", lambda fn, *a, **k: calls.append(k) or original(fn, *a, **k))
    model = make_stack()
    apply_activation_checkpointing(model, "full")
    step(model, X)
    assert len(calls) == 3 and all(k["use_reentrant"] is False and k["preserve_rng_state"] for k in calls)
    with torch.no_grad():
        model(X)
    model.eval()
    with torch.inference_mode():
        model(X)
    assert len(calls) == 3  # evaluation runs the plain forward


def test_state_dict_keys_are_unchanged_and_load_across() -> None:
    plain, ac = make_stack(), make_stack()
    apply_activation_checkpointing(ac, "full")
    assert list(ac.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in ac.named_parameters()] == [n for n, _ in plain.named_parameters()]
    with torch.no_grad():
        for p in ac.parameters():
            p.add_(1.0)
    plain.load_state_dict(ac.state_dict(), strict=True)  # saved with checkpointing, loaded without
    other = make_stack()
    apply_activation_checkpointing(other, ["Block"])
    other.load_state_dict(plain.state_dict(), strict=True)  # and the other way round
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), ac.state_dict().values()))


def test_copies_and_pickles_stay_checkpointed_and_bound_to_themselves() -> None:
    model = make_stack()
    apply_activation_checkpointing(model, "full")
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # EMA copies; torch.save(model)
        assert checkpointed_modules(twin) == checkpointed_modules(model)
        with torch.no_grad():
            for p in twin.parameters():
                p.mul_(0.5)
        assert_same(step(twin, X), step(_halved(), X))  # the copy computes with its own weights


def _halved() -> Stack:
    model = make_stack()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    return model


def test_applying_twice_changes_nothing() -> None:
    model = make_stack()
    apply_activation_checkpointing(model, "full")
    forwards = [m.__dict__["forward"] for m in model.blocks]
    assert apply_activation_checkpointing(model, ["Block"]) == ["blocks.0", "blocks.1", "blocks.2"]
    assert [m.__dict__["forward"] for m in model.blocks] == forwards
    assert apply_activation_checkpointing(model, None) == [] and apply_activation_checkpointing(model, False) == []


def test_full_finds_the_main_stack_of_blocks() -> None:
    """The rule: the container of same-class children holding the most parameters names
    the class; every module of exactly that class is checkpointed."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 2)])  # same class, fewer parameters
            self.encoder = nn.Sequential(Block(), Block())
            self.decoder = nn.ModuleDict({"0": Block(), "1": Block(), "2": Block()})
            self.mixed = nn.ModuleList([nn.Linear(8, 80), nn.ReLU()])  # more parameters, mixed classes

        def forward(self, x):
            return x

    net = Net()
    assert find_blocks(net) is Block
    assert apply_activation_checkpointing(net, "full") == ["encoder.0", "encoder.1", "decoder.0", "decoder.1",
                                                           "decoder.2"]
    with pytest.raises(ValueError, match=r"^activation_checkpointing='full': TinyNet has no nn.ModuleList, "
                                         r"nn.Sequential or nn.ModuleDict of same-class blocks to checkpoint; name "
                                         r"the modules, e.g. activation_checkpointing=\['TinyNet'\]; its module "
                                         r"classes are \['Dropout', 'Linear', 'TinyNet'\]$"):
        apply_activation_checkpointing(TinyNet(), "full")


@pytest.mark.parametrize("value, error, message", [
    (True, ValueError, "activation_checkpointing=True; expected 'full', 'selective', module classes, class names or "
                       "submodule paths"),
    (3, TypeError, "activation_checkpointing=3; expected 'full'"),
    ([], TypeError, "activation_checkpointing=[]; expected 'full'"),
    (["Block", 3], TypeError, "activation_checkpointing lists 3 (a int); expected nn.Module classes, class names or "
                              "submodule paths"),
    (["full"], TypeError, "activation_checkpointing lists 'full' (a mode, which stands alone or as mode:)"),
    ([int], TypeError, "activation_checkpointing lists <class 'int'>"),
    ({"mode": "some"}, ValueError, "activation_checkpointing.mode='some'; expected one of 'full', 'selective'"),
    ({"modules": "auto", "every": 2}, ValueError, "activation_checkpointing has unknown keys ['every']; expected "
                                                  "some of modules, mode"),
])
def test_bad_values_are_one_line_errors(value, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)) as e:
        plan_activation_checkpointing(value)
    assert "\n" not in str(e.value)


def test_names_that_match_nothing_list_the_models_classes() -> None:
    with pytest.raises(ValueError, match=r"^activation_checkpointing: \['Blok', 'blocks.7'\] match no module class "
                                         r"or submodule path of Stack; its module classes are \['Block', 'Dropout', "
                                         r"'LayerNorm', 'Linear', 'ModuleList', 'Stack'\]$"):
        apply_activation_checkpointing(make_stack(), ["Block", "Blok", "blocks.7"])
    with pytest.raises(ValueError, match=r"match no module class or submodule path of Stack; its module classes are "
                                         r"\[.*\]; did you mean the mode 'selective'\?$"):
        apply_activation_checkpointing(make_stack(), "selectiv")
    model = make_stack()
    with pytest.raises(ValueError, match="the predicate 'never' chose no module of Stack"):
        def never(m):
            return False
        apply_activation_checkpointing(model, never)
    assert checkpointed_modules(model) == []  # nothing was changed before the error


def _hf_models():
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=16, attention_dropout=0.1, bos_token_id=0, eos_token_id=0,
        pad_token_id=0))
    return {"GPT2Block": gpt2, "LlamaDecoderLayer": llama}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_hugging_face_decoders_train_the_same(mode) -> None:
    """A tiny GPT-2 (dropout on by default) and Llama (attention dropout) built from configs:
    the blocks are found, loss and logits bitwise equal, gradients within float32 rounding
    (MKL); the key/value cache, which recomputation would fill twice, is turned off."""
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    for block, model in _hf_models().items():
        model.train()
        ac = copy.deepcopy(model)
        names = apply_activation_checkpointing(ac, mode)
        assert [type(ac.get_submodule(n)).__name__ for n in names] == [block, block]
        assert ac.config.use_cache is False and model.config.use_cache is True
        results = []
        for m in (model, ac):
            m.zero_grad(set_to_none=True)
            torch.manual_seed(7)
            out = m(input_ids=ids, labels=ids)
            out.loss.backward()
            results.append((out.logits.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}))
        assert torch.equal(results[1][0], results[0][0])
        assert results[1][1].keys() == results[0][1].keys()
        for name, grad in results[0][1].items():
            # Bitwise on most CPUs; on some AVX-512 ones MKL's GEMM sums a recomputed input (another
            # buffer, another alignment) in another order: up to 4e-9 apart on gradients of 0.2.
            torch.testing.assert_close(results[1][1][name], grad, rtol=1e-6, atol=1e-8)
        assert list(ac.state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_less_is_saved_for_backward(mode) -> None:
    """benchmarks/activation_checkpointing.py's decoder and measures (not timed): bytes
    autograd saves (saved_tensors_hooks) and the peak of bytes held during the step."""
    copies = bench.models(("none", mode), vocab=64, width=32, layers=4, heads=2, seq=33, dropout=0.1)
    tokens = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(0))
    memory = bench.measure_memory(copies, tokens)
    none, ac = memory["none"], memory[mode]
    assert ac["peak"] < 0.8 * none["peak"]
    if mode == "full":  # selective keeps its matmul outputs where these hooks do not see them
        assert ac["saved"] < 0.3 * none["saved"]


def test_selective_recomputes_no_matmul_and_full_recomputes_everything() -> None:
    """Ops run by one forward and backward, counted per op: ``selective`` runs the
    normalizations, activations and dropout of each block again, but none of its matrix
    multiplications or attention; ``full`` runs those again too."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    layers = 2
    copies = bench.models(vocab=64, width=16, layers=layers, heads=2, seq=9, dropout=0.1)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    counts = {}
    for mode, model in copies.items():
        with Count() as c:
            model(tokens).backward()
        counts[mode] = c.ops
    matmuls = ("mm", "addmm", "bmm")
    attention = [op for op in counts["none"] if op.startswith("_scaled_dot_product")]
    assert attention and counts["none"]["addmm"] >= 4 * layers
    for op in (*matmuls, *attention):
        assert counts["selective"][op] == counts["none"][op], op
    assert counts["full"]["addmm"] == counts["none"]["addmm"] + 4 * layers  # qkv, proj, fc, out once more
    assert counts["full"][attention[0]] == counts["none"][attention[0]] + layers
    for op in ("native_layer_norm", "gelu", "bernoulli_"):  # 2 layer norms, 1 gelu, 2 dropouts per block
        again = {"native_layer_norm": 2, "gelu": 1, "bernoulli_": 2}[op] * layers
        assert counts["selective"][op] == counts["full"][op] == counts["none"][op] + again, op


def test_full_saves_more_than_selective() -> None:
    copies = bench.models(vocab=64, width=32, layers=4, heads=2, seq=33, dropout=0.0)
    tokens = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(0))
    peak = {mode: row["peak"] for mode, row in bench.measure_memory(copies, tokens).items()}
    assert peak["full"] < peak["selective"] < peak["none"]


def test_the_trainer_and_the_strategy_api_apply_it_before_wrapping() -> None:
    """Trainer(activation_checkpointing=...) passes it to strategy.prepare: 3 epochs with
    dropout end on the weights of the run without it, bit for bit."""
    def fit(ac):
        model = make_stack()
        data = make_data(n=24)
        data.tensors = (data.tensors[0].view(24, 1, 6).expand(24, 5, 6).contiguous(), data.tensors[1])
        trainer = treadle.Trainer(model, train_dataloader=DataLoader(data, batch_size=8, shuffle=True),
                                  loss_fn=lambda out, y: F.cross_entropy(out.mean(1), y), max_epochs=3,
                                  optimizer=dict(type="AdamW", lr=1e-2), seed=0, strategy=ON_CPU, progress=False,
                                  activation_checkpointing=ac)
        trainer.fit()
        return trainer, model.state_dict()

    trainer, with_ac = fit("selective")
    assert checkpointed_modules(trainer.module) == ["blocks.0", "blocks.1", "blocks.2"]
    _, without = fit(None)
    assert with_ac.keys() == without.keys() and all(torch.equal(with_ac[k], without[k]) for k in without)
    strategy = treadle.build_strategy(ON_CPU, seed=0)
    model = strategy.prepare(make_stack(), activation_checkpointing=["Block"])
    assert all(is_checkpointed(b) for b in model.blocks) and not is_checkpointed(model.head)


@pytest.mark.parametrize("saved_with, resumed_with", [("full", None), (None, "selective")])
def test_a_checkpoint_resumes_with_or_without_it(tmp_path, saved_with, resumed_with) -> None:
    """A run saved with activation checkpointing resumes without it (and the other way
    round) and ends on the weights of the uninterrupted run, bit for bit."""
    def trainer(work_dir, ac, **kw):
        data = make_data(n=24)
        data.tensors = (data.tensors[0].view(24, 1, 6).expand(24, 5, 6).contiguous(), data.tensors[1])
        return treadle.Trainer(make_stack(), work_dir=work_dir, train_dataloader=DataLoader(data, batch_size=8,
                               shuffle=True), loss_fn=lambda out, y: F.cross_entropy(out.mean(1), y), max_epochs=2,
                               optimizer=dict(type="AdamW", lr=1e-2), seed=0, strategy=ON_CPU, progress=False,
                               log_writers=(), checkpoint=dict(interval=1), activation_checkpointing=ac, **kw)

    class Count(treadle.Hook):
        iters = 0

        def after_train_iter(self, trainer, batch, outputs):
            self.iters += 1

    whole = trainer(tmp_path / "whole", saved_with)
    whole.fit()
    count = Count()
    resumed = trainer(tmp_path / "resumed", resumed_with, resume=tmp_path / "whole" / "checkpoints" / "epoch_0001",
                      hooks=[count])
    resumed.fit()
    assert count.iters == 3  # the second epoch only: it went on from the checkpoint
    assert bool(checkpointed_modules(resumed.module)) == (resumed_with is not None)
    final, want = resumed.module.state_dict(), whole.module.state_dict()
    assert list(final) == list(want) and all(torch.equal(final[k], want[k]) for k in want)


def test_config_key_and_set(tmp_path) -> None:
    from cli_support import TINY

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY + "activation_checkpointing: [Linear]\n")
    trainer = build_trainer(load_config(path, ["max_epochs=1"], mode="train"))
    assert checkpointed_modules(trainer.module) == ["fc1", "fc2"]
    trainer = build_trainer(load_config(path, ["activation_checkpointing={modules: [fc2], mode: selective}"],
                                        mode="train"))
    assert checkpointed_modules(trainer.module) == ["fc2"]
    trainer = build_trainer(load_config(path, ["activation_checkpointing=null"], mode="train"))
    assert checkpointed_modules(trainer.module) == []
    with pytest.raises(ConfigError, match=r"^activation_checkpointing.mode='some'; expected one of 'full', "
                                          r"'selective'$"):
        load_config(path, ["activation_checkpointing={mode: some}"], mode="train")
    with pytest.raises(ConfigError, match="activation_checkpointing=True; expected 'full'"):
        load_config(path, ["activation_checkpointing=true"], mode="train")
    with pytest.raises(ValueError, match=r"activation_checkpointing: \['Lineer'\] match no module class"):
        build_trainer(load_config(path, ["activation_checkpointing=[Lineer]"], mode="train"))


def test_a_predicate_by_its_dotted_path(tmp_path) -> None:
    """``{check_fn: pkg.mod.fn}`` (MMEngine's FSDPStrategy's spelling): imported when the
    Trainer is built, ``{type: path, **kwargs}`` binding arguments; refused in safe mode."""
    from cli_support import TINY

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY + "activation_checkpointing: {check_fn: memory_ranks.is_linear}\n")
    assert checkpointed_modules(build_trainer(load_config(path, mode="train")).module) == ["fc1", "fc2"]
    cfg = load_config(path, ["activation_checkpointing={check_fn: {type: memory_ranks.is_linear, out_features: 3}, "
                             "mode: selective}"], mode="train")
    assert checkpointed_modules(build_trainer(cfg).module) == ["fc2"]
    with pytest.raises(ConfigError, match=r"^activation_checkpointing.check_fn: safe mode allows only registered"):
        treadle.Trainer(TinyNet(), activation_checkpointing={"check_fn": "memory_ranks.is_linear"}, safe=True)
    for override, message in [
        ("activation_checkpointing={check_fn: is_linear}", "activation_checkpointing.check_fn: not a dotted import "
                                                          "path of a function (got 'is_linear')"),
        ("activation_checkpointing={check_fn: memory_ranks.nothing}", "activation_checkpointing.check_fn: cannot "
                                                                     "import it (AttributeError"),
        ("activation_checkpointing={check_fn: memory_ranks.Stack}", "activation_checkpointing.check_fn: not a "
                                                                   "function"),
        ("activation_checkpointing={check_fn: {out_features: 3}}", "activation_checkpointing.check_fn.type: missing "
                                                                  "required key"),
        ("activation_checkpointing={check_fn: memory_ranks.is_linear, modules: [fc1]}",
         "activation_checkpointing gives both modules and check_fn; expected one of them"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)) as e:
            build_trainer(load_config(path, [override], mode="train"))
        assert "\n" not in str(e.value)


@pytest.mark.slow
def test_compiled_model_trains_as_the_compiled_one_without_it() -> None:
    """torch.compile over checkpointed blocks: no error, no graph break, the same loss and
    gradients as the compiled model without checkpointing (within float32 rounding:
    inductor may fuse the two graphs differently)."""
    torch._dynamo.reset()
    try:
        plain, ac = make_stack(), make_stack()
        for m in (plain, ac):
            for b in m.blocks:
                b.drop.p = 0.0  # inductor draws its own random numbers: compare without dropout
        apply_activation_checkpointing(ac, "selective")
        explained = torch._dynamo.explain(ac)(X)
        assert explained.graph_break_count == 0
        torch._dynamo.reset()
        a, b = step(torch.compile(plain), X), step(torch.compile(ac), X)
        torch.testing.assert_close(b[0], a[0], rtol=1e-5, atol=1e-6)
        for name in a[1]:
            torch.testing.assert_close(b[1][name], a[1][name], rtol=1e-5, atol=1e-6)
    finally:
        torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_train_bitwise_as_without_it(strategy) -> None:
    """2 gloo processes, each its half of the batch, dropout on: 3 AdamW steps with
    activation_checkpointing "full" and "selective" give the losses and the final
    (gathered) weights of the same run without it, bit for bit; the state dict keys too."""
    import memory_ranks

    results = memory_ranks.results()
    if strategy == "fsdp" and results[0].get("fsdp_skipped"):
        pytest.skip(results[0]["fsdp_skipped"])
    for rank in (0, 1):
        runs = results[rank][strategy]
        assert runs["full"]["checkpointed"] == runs["selective"]["checkpointed"] == ["blocks.0", "blocks.1"]
        for mode in ("full", "selective"):
            assert runs[mode]["losses"] == runs["none"]["losses"], (rank, mode)
    for mode in ("full", "selective"):
        got, want = results[0][strategy][mode]["weights"], results[0][strategy]["none"]["weights"]
        assert list(got) == list(want) and want
        assert all(torch.equal(got[k], want[k]) for k in want), mode
