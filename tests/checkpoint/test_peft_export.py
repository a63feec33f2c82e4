"""A PEFT model's checkpoint exported as PEFT's own adapter folder (``PeftModel.from_pretrained``
gives the trained model's outputs), or merged into its base as ``merge_and_unload`` merges it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from export_support import llama, logits, train_and_save
from treadle.checkpoint.hf_export import ExportError, export_folder
from treadle.checkpoint.io import load_checkpoint, read_manifest

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _adapter(kind: str):
    if kind == "lora":  # with a module trained whole beside the adapter
        return peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"],
                               task_type="CAUSAL_LM")
    return peft.IA3Config(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"],
                          task_type="CAUSAL_LM")


def _base(tmp_path):
    llama(tied=False, seed=1).save_pretrained(tmp_path / "base")
    return transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base")


# LoRA saved as by default, without its frozen base weights; IA3 saved whole (save_frozen=True).
CASES = [("lora", True), ("ia3", False)]


@pytest.mark.parametrize("kind,leave_out_base", CASES)
def test_the_adapter_folder_is_peft_s_own_and_loads_to_the_same_outputs(tmp_path, kind, leave_out_base):
    model = peft.get_peft_model(_base(tmp_path), _adapter(kind))
    model = train_and_save(model, tmp_path / "ckpt", save_frozen=not leave_out_base)
    saved = load_checkpoint(tmp_path / "ckpt", files=["state.pt"])["state.pt"]["model"]
    assert ("base_model.model.model.norm.weight" in saved) is not leave_out_base
    export_folder(tmp_path / "ckpt", tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json",
                                                                         "adapter_model.safetensors"]
    model.save_pretrained(tmp_path / "ref")  # PEFT's own adapter folder of the same model
    ours, theirs = load_file(tmp_path / "adapter" / "adapter_model.safetensors"), load_file(
        tmp_path / "ref" / "adapter_model.safetensors")
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    config = peft.PeftConfig.from_pretrained(tmp_path / "adapter")
    assert config.to_dict() == peft.PeftConfig.from_pretrained(tmp_path / "ref").to_dict()
    assert config.base_model_name_or_path == str(tmp_path / "base") and config.inference_mode
    loaded = peft.PeftModel.from_pretrained(transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base"),
                                            tmp_path / "adapter")
    assert torch.equal(logits(loaded), logits(model))


@pytest.mark.parametrize("kind,leave_out_base", CASES)
def test_the_merged_folder_is_merge_and_unload_s(tmp_path, kind, leave_out_base):
    model = peft.get_peft_model(_base(tmp_path), _adapter(kind))
    model = train_and_save(model, tmp_path / "ckpt", save_frozen=not leave_out_base)
    export_folder(tmp_path / "ckpt", tmp_path / "merged", merge=True)  # the base: where the model came from
    merged = model.merge_and_unload()
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "merged")
    theirs, ours = merged.state_dict(), loaded.state_dict()
    assert set(theirs) == set(ours) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert torch.equal(logits(loaded), logits(merged))
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"


def test_a_merge_over_a_base_of_other_shapes_is_refused_naming_the_tensor(tmp_path):
    model = peft.get_peft_model(_base(tmp_path), _adapter("lora"))
    train_and_save(model, tmp_path / "ckpt")
    other = llama(tied=False)
    other.resize_token_embeddings(80)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ExportError) as e:
        export_folder(tmp_path / "ckpt", tmp_path / "merged", merge=True, base=tmp_path / "other")
    assert str(e.value) == (f"--base {tmp_path / 'other'}: tensor 'model.embed_tokens.weight' has shape (80, 32), the "
                            "model's is (64, 32); it is not this model's base")
    assert not (tmp_path / "merged").exists()
    with pytest.raises(ExportError, match="^--base: an adapter export reads nothing from the base; --base goes with "
                                          "--merge$"):
        export_folder(tmp_path / "ckpt", tmp_path / "adapter", base=tmp_path / "base")


def test_the_checkpoint_records_peft_s_own_key_names(tmp_path):
    model = peft.get_peft_model(_base(tmp_path), _adapter("lora"))
    train_and_save(model, tmp_path / "ckpt", iters=1)
    info = read_manifest(tmp_path / "ckpt")["meta"]["model"]
    state = model.state_dict()
    theirs = peft.get_peft_model_state_dict(model)
    assert sorted(info["peft"]["keys"].values()) == sorted(theirs)
    for key, file_key in info["peft"]["keys"].items():
        assert torch.equal(state[key], theirs[file_key]), key
    assert info["peft"]["base_class"] == "transformers.models.llama.modeling_llama.LlamaForCausalLM"
    assert info["pretrained"] == str(tmp_path / "base") and info["hf"]["config"]["model_type"] == "llama"
    assert set(info["tensors"]) == set(state)


def test_a_prompt_learning_adapter_is_refused_in_one_line(tmp_path):
    config = peft.PromptTuningConfig(num_virtual_tokens=3, task_type="CAUSAL_LM")
    train_and_save(peft.get_peft_model(_base(tmp_path), config), tmp_path / "ckpt", iters=1)
    with pytest.raises(ExportError) as e:
        export_folder(tmp_path / "ckpt", tmp_path / "adapter")
    assert str(e.value) == (f"{tmp_path / 'ckpt'}: a PEFT adapter folder is written for adapters held in the model's "
                            "own tensors (LoRA, IA3, LoHa...); not PROMPT_TUNING (prompt learning) keeps its adapter "
                            "outside the model's tensors; export the weights with --out FILE.safetensors")


def test_a_merge_whose_base_folder_was_moved_away_says_it_no_longer_exists(tmp_path):
    model = peft.get_peft_model(_base(tmp_path), _adapter("lora"))
    train_and_save(model, tmp_path / "ckpt", iters=1)  # without its frozen base weights
    (tmp_path / "base").rename(tmp_path / "moved")
    with pytest.raises(ExportError) as e:
        export_folder(tmp_path / "ckpt", tmp_path / "merged", merge=True)
    assert str(e.value).endswith(f"they are read from the base model: pass --base DIR (a folder save_pretrained wrote); "
                                 f"the model was loaded from {str(tmp_path / 'base')!r}, which no longer exists")
    assert "\n" not in str(e.value) and not (tmp_path / "merged").exists()
    export_folder(tmp_path / "ckpt", tmp_path / "merged", merge=True, base=tmp_path / "moved")  # as the line says
    assert torch.equal(logits(transformers.LlamaForCausalLM.from_pretrained(tmp_path / "merged")),
                       logits(model.merge_and_unload()))


def test_a_base_recorded_as_a_hub_name_is_not_a_local_folder(tmp_path):
    from treadle.checkpoint.export_plan import open_base
    from treadle.checkpoint.safetensors_stream import TensorSpec

    info = {"peft": {"config": {"base_model_name_or_path": "someone/tiny-llama"}}}
    with pytest.raises(ExportError) as e:
        open_base(info, None, tmp_path / "ckpt", {"w": TensorSpec("w", torch.float32, (2,))})
    assert str(e.value).endswith("; the model was loaded from 'someone/tiny-llama', not a local folder")
