"""A Hugging Face model spec's ``peft:`` key (treadle/components/hf_models.py): an adapter built
with peft's own config class (LoRA, IA3, LoHa), or a saved adapter's directory, on the
built model; the same dict from a YAML file and from Python; errors naming
``model.peft.<key>``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.io import load_checkpoint
from treadle.config import ConfigError, build_trainer, load_config
from treadle.components.build import build_model
from treadle.seeding import seed_everything

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
LORA = dict(peft_type="LORA", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

YAML = """
model:
  type: transformers.LlamaForCausalLM
  config: {vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 4,
           num_key_value_heads: 2}
  peft: {peft_type: LORA, r: 4, lora_alpha: 8, target_modules: [q_proj, v_proj], task_type: CAUSAL_LM}
train_dataloader: {dataset: {type: support.make_token_batches, n: 16}, batch_size: 4}
optimizer: {type: AdamW, lr: 1.0e-2}
max_iters: 3
checkpoint: {interval: 3, by_epoch: false}
seed: 3
progress: false
"""


def _by_hand(adapter) -> torch.nn.Module:
    return peft.get_peft_model(transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)), adapter)


def test_a_yaml_config_builds_the_adapter_peft_builds_and_trains_the_adapter_alone(tmp_path):
    path = tmp_path / "lora.yaml"
    path.write_text(YAML)
    trainer = build_trainer(load_config(path, mode="train", work_dir=str(tmp_path / "w")))
    model = trainer.module
    assert type(model) is peft.PeftModelForCausalLM
    seed_everything(3)  # what the config's build did first: the same model by hand
    by_hand = _by_hand(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    assert list(by_hand.state_dict()) == list(model.state_dict())
    for (name, a), b in zip(by_hand.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    trainer.fit()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)
    state = load_checkpoint(tmp_path / "w" / "checkpoints" / "iter_00000003")["state.pt"]
    assert set(state["model"]) == trained  # the base is described by its digests only
    assert len(state["frozen"]["tensors"]) == len(model.state_dict()) - len(trained)


@pytest.mark.parametrize("adapter, config", [
    (dict(peft_type="ia3", target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"]),
     lambda: peft.IA3Config(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"])),
    (dict(peft_type="LOHA", r=2, target_modules=["q_proj"]), lambda: peft.LoHaConfig(r=2, target_modules=["q_proj"])),
])
def test_other_adapter_types_are_built_with_their_config_class_from_python(adapter, config):
    """The dict a config file holds, with the model class itself as type, from Python."""
    seed_everything(5)
    trainer = treadle.Trainer(dict(type=transformers.LlamaForCausalLM, config=LLAMA, peft=adapter), seed=5,
                              progress=False)
    seed_everything(5)
    by_hand = _by_hand(config())
    assert type(trainer.module.peft_config["default"]) is type(by_hand.peft_config["default"])
    for (name, a), b in zip(by_hand.state_dict().items(), trainer.module.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_saved_adapter_directory_is_loaded_trainable(tmp_path):
    torch.manual_seed(0)
    base = tmp_path / "base"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(base)
    saved = peft.get_peft_model(transformers.LlamaForCausalLM.from_pretrained(base),
                                peft.LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    saved.save_pretrained(tmp_path / "adapter")
    model = build_model(dict(type="transformers.LlamaForCausalLM", pretrained=str(base), peft=str(tmp_path / "adapter")))
    assert isinstance(model, peft.PeftModel)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    for name, value in saved.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


@pytest.mark.parametrize("adapter, message", [
    (dict(LORA, rr=4), r"^model\.peft\.rr: unknown argument for LoraConfig \(got 4\); .*Did you mean 'r'\?"),
    (dict(LORA, peft_type="LORAA"), r"^model\.peft\.peft_type: not a PEFT adapter type \(got 'LORAA'\); expected one "
                                    r"of .*LORA"),
    ({k: v for k, v in LORA.items() if k != "peft_type"}, r"^model\.peft\.peft_type: missing required key"),
    (dict(LORA, target_modules=["q_prj"]), r"^model\.peft\.target_modules: peft\.get_peft_model with LoraConfig "
                                           r"failed: .*q_prj"),
    ("no/such/adapter", r"^model\.peft: not a saved adapter \(no adapter_config\.json there\)"),
    (3, r"^model\.peft: not an adapter's config nor a path \(got 3\)"),
])
def test_errors_are_one_line_naming_the_key(adapter, message):
    with pytest.raises(ConfigError, match=message) as info:
        build_model(dict(type="transformers.LlamaForCausalLM", config=LLAMA, peft=adapter))
    assert "\n" not in str(info.value)


def test_the_default_step_trains_a_peft_model_as_a_hand_written_loop_does():
    """The Trainer's step (model(**batch), its loss, backward, AdamW) against the same
    steps written out, on the same LoRA model: the same adapter weights, bit for bit."""
    from support import make_token_batches

    data = make_token_batches(n=16)
    seed_everything(7)
    trainer = treadle.Trainer(dict(type=transformers.LlamaForCausalLM, config=LLAMA, peft=LORA), seed=7,
                              train_dataloader=DataLoader(data, batch_size=4), optimizer=dict(type="AdamW", lr=1e-2),
                              max_iters=4, progress=False)
    seed_everything(7)
    model = _by_hand(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for batch in DataLoader(data, batch_size=4):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    trainer.fit()
    for (name, a), b in zip(model.state_dict().items(), trainer.module.state_dict().values()):
        assert torch.equal(a, b), name
