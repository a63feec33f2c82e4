"""What every rank of a job meets alike is said once for the job: a 2-process run over a
pretrained folder that lacks one of the model's tensors and holds one the model lacks.
Built on the meta device (FSDP), treadle's two warnings come once; built whole on each
rank (DDP), transformers' own load report comes once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from support import fsdp_on_cpu, run_ranks

pytestmark = [pytest.mark.slow]
hf = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")

SCRIPT = str(Path(__file__).with_name("empty_init_script.py"))  # its `train` mode: the Trainer on {pretrained: DIR}


def _folder_lacking_a_tensor(folder: Path) -> None:
    """A Llama saved by save_pretrained, then without ``model.norm.weight`` and with ``extra.weight``."""
    torch.manual_seed(1)
    hf.LlamaForCausalLM(hf.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                       tie_word_embeddings=False)).save_pretrained(folder)
    weights = safetensors.load_file(folder / "model.safetensors")
    del weights["model.norm.weight"]
    weights["extra.weight"] = torch.zeros(2)
    safetensors.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def _run(tmp_path: Path, strategy: dict) -> str:
    folder, out = tmp_path / "llama", tmp_path / "out"
    _folder_lacking_a_tensor(folder)
    out.mkdir()
    results = run_ranks(SCRIPT, [str(out), "train", str(folder), json.dumps(strategy)], nproc=2, timeout=400)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    return "".join(output for _, output in results)


@fsdp_on_cpu
def test_a_folder_lacking_a_tensor_is_warned_about_once_for_the_job(tmp_path) -> None:
    said = _run(tmp_path, {"type": "fsdp", "wrap": ["LlamaDecoderLayer"]})
    lacking = [line for line in said.splitlines() if "tensor(s) not in" in line]
    assert len(lacking) == 1 and lacking[0].endswith("initialized as the model's constructor does: model.norm.weight"), said
    extra = [line for line in said.splitlines() if "tensor(s) the model does not have" in line]
    assert len(extra) == 1 and extra[0].endswith("not loaded: extra.weight"), said


def test_transformers_load_report_is_said_once_for_the_job(tmp_path) -> None:
    said = _run(tmp_path, {"type": "ddp"})  # each rank runs from_pretrained on the folder
    assert said.count("extra.weight") == 1 and said.count("model.norm.weight") == 1, said
