"""DeepSpeed ZeRO-3 over a model spec on 2 gloo processes: built on the meta device and
partitioned module by module as it is filled, it equals the model built whole bit for bit
(as built and after training, in bf16 too), and no process holds more than its partition
and one module before the engine is made."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from support import run_ranks

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                 reason="needs the deepspeed package: pip install 'treadle[deepspeed]'")]
hf = pytest.importorskip("transformers")

SCRIPT = str(Path(__file__).with_name("deepspeed_meta_script.py"))
ZERO3 = {"type": "deepspeed", "zero_stage": 3, "backend": "gloo"}


def _llama(hidden: int, layers: int, vocab: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=False)


def _run(out: Path, model: dict, strategy: dict, precision: str = "32") -> Path:
    out.mkdir(parents=True)
    results = run_ranks(SCRIPT, [str(out), json.dumps(model), json.dumps(strategy), precision], nproc=2, timeout=500,
                        env={"DS_ACCELERATOR": "cpu"})
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    return out


def test_a_pretrained_model_built_on_meta_equals_the_one_built_whole_in_bf16(tmp_path) -> None:
    torch.manual_seed(1)
    hf.LlamaForCausalLM(hf.LlamaConfig(**_llama(64, 2, 512))).save_pretrained(tmp_path / "llama")
    model = {"pretrained": str(tmp_path / "llama")}
    meta = _run(tmp_path / "meta", model, ZERO3, "bf16")
    whole = _run(tmp_path / "whole", model, {**ZERO3, "empty_init": False}, "bf16")
    reference = hf.LlamaForCausalLM.from_pretrained(tmp_path / "llama").state_dict()
    for name in ("built.pt", "final.pt"):
        got, want = (torch.load(run / name, weights_only=True) for run in (meta, whole))
        assert got.keys() == want.keys() == reference.keys()
        for key, value in want.items():
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), f"{name}: {key}"
    built = torch.load(meta / "built.pt", weights_only=True)
    assert all(torch.equal(built[k], v.to(built[k].dtype)) for k, v in reference.items())  # the folder's weights, cast


def test_no_process_holds_the_whole_model_before_the_engine_is_made(tmp_path) -> None:
    # Many layers, small ones: while a module is filled, it is whole (and gloo copies it as it is
    # partitioned), so the largest one counts twice above a process's half; here 4 MiB of 159 MiB.
    big, tiny = _llama(512, 16, 2048), _llama(16, 1, 64)
    whole = sum(p.numel() * 4 for p in hf.LlamaForCausalLM(hf.LlamaConfig(**big)).parameters())
    peaks = {}
    for name, config in (("big", big), ("tiny", tiny)):
        run = _run(tmp_path / name, {"config": config}, ZERO3)
        peaks[name] = [json.loads((run / f"rss_rank{r}.json").read_text()) for r in (0, 1)]
    for rank in (0, 1):
        above = peaks["big"][rank] - peaks["tiny"][rank]
        # its half, the record of the constructor, one module whole twice: about 0.66 of the model
        assert above < 0.8 * whole, f"rank {rank}: {above / 2**20:.0f} MiB above the tiny run's, the whole model " \
                                    f"{whole / 2**20:.0f} MiB"
