"""examples/lora/finetune.py as a user runs it: a base "pretrained" on counting by 1, a LoRA
adapter fine-tuned to count by 3 (only the adapter in the checkpoint), exported with
``treadle export`` as a PEFT folder that PEFT loads to the trained outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from treadle.checkpoint.io import find_latest_checkpoint, load_checkpoint
from treadle.checkpoint.weights import read_weights

pytestmark = pytest.mark.slow  # subprocesses: the script, and treadle export
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lora" / "finetune.py"


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_lora_example_fine_tunes_only_the_adapter_and_exports_it(tmp_path, nproc) -> None:
    """One process, and 2 gloo processes under FSDP (the base built on the meta device)."""
    done = subprocess.run([sys.executable, str(EXAMPLE), "--work-dir", str(tmp_path), "--max-iters", "150",
                           "--nproc", str(nproc)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if nproc == 1:  # (torchrun's own lines about threads come with --nproc)
        assert "Warning" not in done.stderr and "warn" not in done.stderr, done.stderr  # none on a user's console
    assert "the adapter continues [5, 8, 11, 14] with [17, 20, 23, 26]" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["val/loss"] for r in records if r["mode"] == "val"][-1] < 0.1
    checkpoint = find_latest_checkpoint(tmp_path / "run" / "checkpoints")
    state = load_checkpoint(checkpoint, files=["state.pt"])["state.pt"]
    state["model"] = read_weights(checkpoint)  # (under FSDP in DCP's files)
    assert state["model"] and all("lora_" in k for k in state["model"])  # the adapter only: the base by digest
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= {k.split("base_model.model.")[-1]
                                                               for k in state["frozen"]["tensors"]}
    base = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base")
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter")
    mine = loaded.state_dict()
    assert set(state["model"]) <= set(mine)
    for name, value in state["model"].items():
        assert torch.equal(mine[name], value), name
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
