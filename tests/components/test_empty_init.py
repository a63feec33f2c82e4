"""Models built on the meta device (treadle/components/empty_init.py) and materialized
(treadle/strategies/materialize.py), in one process: every tensor equals the model built
whole from the same random state, bit for bit, whatever the constructor does; pretrained
weights come from safetensors files; what cannot work is said in one line."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import treadle
from treadle.checkpoint.manifest import CheckpointError
from treadle.components.empty_init import EmptyInitError, EmptyModel, record
from treadle.strategies.materialize import has_meta, materialize


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}


def _assert_equal(a: nn.Module, b: nn.Module) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name


def _both(make, seed: int = 0) -> tuple[nn.Module, EmptyModel]:
    """The model built whole and recorded, each after seeding alike."""
    torch.manual_seed(seed)
    whole = make()
    torch.manual_seed(seed)
    return whole, record(make)


class Inits(nn.Module):
    """torch's initializers that read or draw in unusual ways, a padded embedding, a
    buffer computed from a parameter-sized allocation, a tensor attribute, ties."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.embed = nn.Embedding(20, 6, padding_idx=0)
        self.q = nn.Linear(6, 6)
        self.head = nn.Linear(6, 20, bias=False)
        self.head.weight = self.embed.weight  # tied
        nn.init.orthogonal_(self.q.weight)
        nn.init.trunc_normal_(self.q.bias, std=0.5)
        self.sparse = nn.Parameter(torch.empty(10, 4))
        nn.init.sparse_(self.sparse, sparsity=0.5)
        self.register_buffer("table", torch.zeros(5, 6))
        self.table.add_(torch.randn(5, 6)).mul_(2)  # deterministic and random operators on one buffer
        self.scale = torch.ones(3) * math.pi  # a plain tensor attribute, real: kept as it is
        self.steps = torch.arange(4)


def _materialized(empty: EmptyModel, **kw) -> nn.Module:
    materialize(empty.module, torch.device("cpu"), empty=empty, **kw)
    return empty.module


@pytest.mark.parametrize("make", [
    Inits,
    lambda: nn.Sequential(nn.Linear(7, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3)),
    lambda: nn.TransformerEncoderLayer(16, 2, 32, batch_first=True),
], ids=["inits", "mlp", "torch-transformer"])
def test_a_recorded_model_materializes_bit_for_bit_as_built_whole(make) -> None:
    torch.manual_seed(0)
    whole = make()
    after_whole = torch.rand(4)
    torch.manual_seed(0)
    empty = record(make)
    assert torch.equal(torch.rand(4), after_whole)  # recording moves the generator as a whole build does
    assert has_meta(empty.module) and len(empty.ops) > 0
    assert all(t.is_meta for t in _state(empty.module).values())
    expected = torch.manual_seed(123) and torch.rand(4)
    torch.manual_seed(123)
    model = _materialized(empty)
    assert torch.equal(torch.rand(4), expected)  # materializing leaves it as it was
    _assert_equal(model, whole)
    if isinstance(model, Inits):
        assert model.head.weight is model.embed.weight  # ties kept
        assert torch.equal(model.embed.weight[0], torch.zeros(6))
        assert torch.equal(model.scale, whole.scale) and torch.equal(model.steps, whole.steps)


def _by_module(empty: EmptyModel, **kw) -> tuple[nn.Module, list[str]]:
    """``empty`` materialized module by module; at each call, the module's tensors must be
    filled and the own tensors of every module not reached yet still empty (or tied to one
    filled before)."""
    modules = dict(empty.module.named_modules())
    order: list[str] = []
    filled: set[int] = set()

    def each(module: nn.Module) -> None:
        order.append(next(n for n, m in modules.items() if m is module))
        tensors = [*module.parameters(), *module.buffers()]
        assert not any(t.is_meta for t in tensors), order[-1]
        filled.update(map(id, tensors))
        for name in modules.keys() - set(order):
            own = [*modules[name]._parameters.values(), *modules[name]._buffers.values()]
            assert all(t is None or t.is_meta or id(t) in filled for t in own), name
    materialize(empty.module, torch.device("cpu"), empty=empty, each_module=each, **kw)
    return empty.module, order


def test_module_by_module_each_module_is_filled_in_its_turn_children_first() -> None:
    whole, empty = _both(Inits)
    model, order = _by_module(empty)
    _assert_equal(model, whole)
    assert order.index("conv") < order.index("") and order[-1] == ""  # the root last, once
    assert model.head.weight is model.embed.weight  # ties kept
    assert torch.equal(model.scale, whole.scale) and torch.equal(model.steps, whole.steps)


hf = pytest.importorskip("transformers")


def _llama_config(**kw):
    return hf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, **kw)


@pytest.mark.parametrize("name", ["llama-tied", "llama", "bert", "gpt2", "qwen3"])
def test_hugging_face_models_run_their_own_initialization_on_meta(name) -> None:
    """The models' ``_init_weights`` runs (a meta context would skip it): the values are
    those of ``X(config)``, rotary tables included."""
    make = {
        "llama-tied": lambda: hf.LlamaForCausalLM(_llama_config(tie_word_embeddings=True)),
        "llama": lambda: hf.LlamaForCausalLM(_llama_config(tie_word_embeddings=False)),
        "bert": lambda: hf.BertForSequenceClassification(hf.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            num_labels=3)),
        "gpt2": lambda: hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2,
                                                         bos_token_id=0, eos_token_id=0)),
        "qwen3": lambda: hf.Qwen3ForCausalLM(hf.Qwen3Config(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=16)),
    }[name]
    whole, empty = _both(make)
    model = _materialized(empty)
    _assert_equal(model, whole)
    if name == "llama-tied":
        assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    whole.eval(), model.eval()
    assert torch.equal(model(input_ids=ids).logits, whole(input_ids=ids).logits)


class ReadsItsWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gain = float(self.fc.weight.detach().abs().max())  # a value read: computed from the record
        with torch.no_grad():
            self.fc.weight.div_(self.gain)


class HandsItsWeightsToNumpy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.table = self.fc.weight.detach().numpy()  # its memory itself: there is none


def test_a_constructor_that_reads_a_value_gets_the_whole_builds() -> None:
    whole, empty = _both(ReadsItsWeights)
    assert empty.module.gain == whole.gain
    _assert_equal(_materialized(empty), whole)


def test_a_constructor_that_needs_memory_is_named_in_one_line() -> None:
    with pytest.raises(EmptyInitError) as e:
        record(lambda: nn.Sequential(HandsItsWeightsToNumpy()))
    message = str(e.value)
    assert "\n" not in message
    assert f"{HandsItsWeightsToNumpy.__module__}.HandsItsWeightsToNumpy cannot be built with its tensors left empty" \
        in message
    assert "empty_init=False" in message


def test_a_constructor_error_of_its_own_is_raised_as_it_is() -> None:
    def bad():
        raise ValueError("width must be even")
    with pytest.raises(ValueError, match="width must be even"):
        record(bad)


# -- the Strategy API, in one process (DDP with empty_init=True: the replica materialized whole) --

def _prepared(spec, **kw) -> nn.Module:
    strategy = treadle.build_strategy(dict(type="ddp", empty_init=True), seed=0)
    strategy.prepare(spec, **kw)
    return strategy.module


def test_prepare_builds_a_spec_on_meta_and_the_generator_goes_on_as_after_a_whole_build() -> None:
    spec = dict(type=hf.LlamaForCausalLM, config=dict(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2))
    model = _prepared(spec)
    after = torch.rand(4)
    treadle.seeding.seed_everything(0)
    whole = hf.LlamaForCausalLM(_llama_config())
    _assert_equal(model, whole)
    assert torch.equal(after, torch.rand(4))


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    """A Llama saved with save_pretrained (bf16 in its config), and its shards version."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(1)
    model = hf.LlamaForCausalLM(_llama_config(tie_word_embeddings=False))
    model.generation_config.max_new_tokens = 7
    model.save_pretrained(root / "one")
    model.save_pretrained(root / "shards", max_shard_size="40KB")
    return root, model


def test_a_pretrained_spec_loads_as_from_pretrained_does(saved_llama) -> None:
    root, _ = saved_llama
    assert len(list((root / "shards").glob("*.safetensors"))) > 1
    for folder in ("one", "shards"):
        model = _prepared(dict(type=hf.LlamaForCausalLM, pretrained=str(root / folder)))
        whole = hf.LlamaForCausalLM.from_pretrained(root / folder)
        _assert_equal(model, whole)
        assert model.generation_config.max_new_tokens == 7
        assert model.config._name_or_path == str(root / folder)


def test_a_new_head_is_initialized_by_the_model_and_named(saved_llama, caplog) -> None:
    root, _ = saved_llama
    model = _prepared(dict(type=hf.LlamaForSequenceClassification, pretrained=str(root / "one"),
                           config=dict(num_labels=3)))
    whole = hf.LlamaForSequenceClassification.from_pretrained(root / "one", num_labels=3)
    for name, value in _state(whole).items():
        if name != "score.weight":
            assert torch.equal(_state(model)[name], value), name
    assert model.score.weight.std() > 0
    assert "initialized as the model's constructor does: score.weight" in caplog.text
    assert "the model does not have, not loaded: lm_head.weight" in caplog.text


@pytest.mark.parametrize("tied", [False, True])
def test_a_pretrained_llama_filled_module_by_module_is_from_pretrained_s(saved_llama, tmp_path, tied) -> None:
    root, _ = saved_llama
    folder = root / "one"
    if tied:  # one tensor under two names, saved under the head's: filled once, in the embedding's turn
        folder = tmp_path / "tied"
        torch.manual_seed(2)
        hf.LlamaForCausalLM(_llama_config(tie_word_embeddings=True)).save_pretrained(folder)
    whole = hf.LlamaForCausalLM.from_pretrained(folder)
    torch.manual_seed(0)
    empty = record(lambda: treadle.components.build.build_model(dict(type=hf.LlamaForCausalLM,
                                                                      pretrained=str(folder))))
    model, order = _by_module(empty, weights=empty.weights)
    _assert_equal(model, whole)
    assert order[-1] == "" and len(order) == len(set(order))
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_missing_shard_or_a_shape_that_differs_is_one_line(saved_llama, tmp_path) -> None:
    import shutil

    root, model = saved_llama
    broken = tmp_path / "broken"
    shutil.copytree(root / "shards", broken)
    victim = sorted(broken.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=rf"the shard {victim.name} that model.safetensors.index.json lists is "
                                              "missing"):
        _prepared(dict(type=hf.LlamaForCausalLM, pretrained=str(broken)))
    with pytest.raises(CheckpointError) as e:
        _prepared(dict(type=hf.LlamaForCausalLM, pretrained=str(root / "one"), config=dict(intermediate_size=48)))
    assert "\n" not in str(e.value)
    assert "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [64, 32], the model's " \
           "'model.layers.0.mlp.gate_proj.weight' [48, 32]" in str(e.value)


def test_load_from_a_safetensors_file_is_strict(saved_llama, tmp_path) -> None:
    from safetensors.torch import save_file

    root, model = saved_llama
    spec = dict(type=hf.LlamaForCausalLM, config=dict(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, tie_word_embeddings=False))
    full = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(full, tmp_path / "w.safetensors")
    _assert_equal(_prepared(spec, load_from=str(tmp_path / "w.safetensors")), model)
    save_file({**full, "extra.weight": torch.ones(2)}, tmp_path / "extra.safetensors")
    with pytest.raises(CheckpointError, match=r"'extra.weight' is not a tensor of LlamaForCausalLM"):
        _prepared(spec, load_from=str(tmp_path / "extra.safetensors"))
    save_file({k: v for k, v in full.items() if k != "lm_head.weight"}, tmp_path / "less.safetensors")
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' is on the meta device and load_from .* does not hold it"):
        _prepared(spec, load_from=str(tmp_path / "less.safetensors"))


def test_a_module_built_on_meta_by_its_user_takes_load_from(saved_llama, tmp_path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    save_file(reference.state_dict(), tmp_path / "mlp.safetensors")
    with torch.device("meta"):
        empty = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    treadle.build_strategy("single", seed=0).prepare(empty, load_from=str(tmp_path / "mlp.safetensors"))
    _assert_equal(empty, reference)
    with torch.device("meta"):
        nothing = nn.Linear(3, 3)
    with pytest.raises(CheckpointError, match=r"'weight' \(and 1 more\) is on the meta device and no weights were "
                                              "given"):
        treadle.build_strategy("single", seed=0).prepare(nothing)
    root, _ = saved_llama  # a rotary table is in no weights file: the spec builds it, the user's module cannot
    with torch.device("meta"):
        llama = hf.LlamaForCausalLM(_llama_config(tie_word_embeddings=False))
    with pytest.raises(CheckpointError, match=r"'model.rotary_emb.inv_freq' .*or the model as a spec"):
        treadle.build_strategy("single", seed=0).prepare(llama, load_from=str(root / "one"))


def test_load_from_a_hugging_face_folder_into_a_model_built_whole(saved_llama) -> None:
    root, model = saved_llama
    fresh = hf.LlamaForCausalLM(_llama_config(tie_word_embeddings=False))
    strategy = treadle.build_strategy("single", seed=0)
    strategy.prepare(fresh, load_from=str(root / "shards"))
    _assert_equal(fresh, model)


def test_a_lora_spec_over_a_pretrained_base_is_from_pretrained_then_get_peft_model(saved_llama) -> None:
    """Built on meta, the base read from the folder and the adapter initialized from the
    record: the model ``from_pretrained`` then ``get_peft_model`` give from the same seed."""
    peft = pytest.importorskip("peft")
    root, _ = saved_llama
    lora = dict(peft_type="LORA", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = _prepared(dict(type=hf.LlamaForCausalLM, pretrained=str(root / "one"), peft=lora))
    treadle.seeding.seed_everything(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    whole = peft.get_peft_model(hf.LlamaForCausalLM.from_pretrained(root / "one"), config)
    _assert_equal(model, whole)
    assert not torch.equal(model.base_model.model.model.layers[0].self_attn.q_proj.lora_A.default.weight,
                           model.base_model.model.model.layers[1].self_attn.q_proj.lora_A.default.weight)
