"""A sharded checkpoint of a Hugging Face decoder trained on 2 gloo processes (FSDP; tensor
parallel under the model's own plan), exported as a folder in one process: ``from_pretrained``
gives the trained weights bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support import fsdp_on_cpu, run_ranks
from treadle.checkpoint.hf_export import export_folder
from treadle.checkpoint.io import find_latest_checkpoint
from treadle.checkpoint.sharded import is_sharded_checkpoint

pytestmark = [pytest.mark.slow, fsdp_on_cpu]  # 2 processes on gloo

SCRIPT = str(Path(__file__).parents[1] / "strategies" / "mesh_script.py")


@pytest.mark.parametrize("mesh", [["--dp-shard", "2"], ["--dp-shard", "1", "--tp", "2"]], ids=["fsdp", "tp"])
def test_a_sharded_checkpoint_exports_to_the_trained_weights(tmp_path, mesh):
    transformers = pytest.importorskip("transformers")
    work = tmp_path / "work"
    results = run_ranks(SCRIPT, [str(tmp_path), "--hf", *mesh, "--work-dir", str(work), "--max-iters", "6",
                                 "--interval", "6"], nproc=2, timeout=300)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    ckpt = find_latest_checkpoint(work / "checkpoints")
    assert ckpt.name.endswith("6") and is_sharded_checkpoint(ckpt)
    export_folder(ckpt, tmp_path / "out", max_shard_size="40KB")
    assert len(list((tmp_path / "out").glob("model-*-of-*.safetensors"))) > 1
    trained = torch.load(tmp_path / "final_rank0.pt", weights_only=True)
    loaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert set(loaded) == set(trained)
    for k, v in trained.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k
