"""A big pretrained model written in a config file is never held whole by one process under a
strategy that shards it: ``treadle train CONFIG --nproc 2`` with FSDP, for a YAML file, a Python
file and an MMEngine-style file, each rank's peak memory when training starts against the same
run of a tiny model. The model's spec goes to the Trainer as it is, which builds it on the meta
device and fills each process's shards (treadle/config/assemble.py): a process built whole would
peak a whole model (here about 86 MiB) above the tiny run; each holds about its half."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import fsdp_on_cpu

pytestmark = [pytest.mark.slow, fsdp_on_cpu]
hf = pytest.importorskip("transformers")

TESTS = Path(__file__).resolve().parents[1]
MIB = 2**20


def pretrained(path: Path, hidden: int, layers: int, vocab: int) -> int:
    """A Llama-style model saved with save_pretrained; its size in bytes."""
    import torch

    torch.manual_seed(0)
    cfg = hf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=32,
                         tie_word_embeddings=False)
    model = hf.LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    return sum(p.numel() * p.element_size() for p in model.parameters())


KINDS = {
    "yaml": ("cfg.yaml", """
model: {{type: transformers.LlamaForCausalLM, pretrained: {model}}}
train_dataloader: {{dataset: {{type: config.big_model_door.Tokens, vocab: 1000}}, batch_size: 2}}
optimizer: {{type: SGD, lr: 0.0}}
strategy: {{type: fsdp, wrap: [LlamaDecoderLayer]}}
max_iters: 1
checkpoint: false
hooks: [{{type: config.big_model_door.PeakBeforeTraining, out: {out}}}]
seed: 0
progress: false
"""),
    "python": ("cfg.py", """
model = dict(type='transformers.LlamaForCausalLM', pretrained='{model}')
train_dataloader = dict(dataset=dict(type='config.big_model_door.Tokens', vocab=1000), batch_size=2)
optimizer = dict(type='SGD', lr=0.0)
strategy = dict(type='fsdp', wrap=['LlamaDecoderLayer'])
max_iters = 1
checkpoint = False
hooks = [dict(type='config.big_model_door.PeakBeforeTraining', out='{out}')]
seed = 0
progress = False
"""),
    "mmengine": ("cfg_mm.py", """
model = dict(type='transformers.LlamaForCausalLM', pretrained='{model}')
train_dataloader = dict(dataset=dict(type='config.big_model_door.Tokens', vocab=1000), batch_size=2,
                        sampler=dict(type='DefaultSampler', shuffle=True))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.0))
train_cfg = dict(by_epoch=False, max_iters=1)
default_hooks = dict(checkpoint=None)
custom_hooks = [dict(type='config.big_model_door.PeakBeforeTraining', out='{out}')]
strategy = dict(type='FSDPStrategy', model_wrapper=dict(auto_wrap_policy=dict(
    type='torch.distributed.fsdp.wrap.transformer_auto_wrap_policy', transformer_layer_cls=['LlamaDecoderLayer'])))
randomness = dict(seed=0)
"""),
}


def peaks(tmp: Path, kind: str, model: Path) -> list[int]:
    """Each rank's peak resident memory at ``before_train`` of ``treadle train`` of a config of
    ``kind`` over the pretrained ``model`` on 2 processes."""
    out = tmp / f"{kind}-{model.name}"
    out.mkdir()
    name, text = KINDS[kind]
    (out / name).write_text(text.format(model=model, out=out))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "treadle", "train", str(out / name), "--nproc", "2", "--work-dir", str(out / "run")]
    proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads((out / f"peak.rank{r}.json").read_text())["peak"] for r in range(2)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    big = pretrained(root / "big", hidden=512, layers=4, vocab=8000)
    pretrained(root / "tiny", hidden=64, layers=1, vocab=1000)
    return root, big


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_config_files_pretrained_model_is_never_whole_in_one_process(tmp_path, models, kind):
    root, size = models
    tiny = peaks(tmp_path, kind, root / "tiny")
    big = peaks(tmp_path, kind, root / "big")
    above = [(b - t) / MIB for b, t in zip(big, tiny)]
    share = size / 2 / MIB
    # Built whole, a process peaks at least the whole model above the tiny run (86 MiB); on the meta device,
    # its half and a few MiB (the largest tensor read at once, buffers): well under 3/4 of the model.
    assert all(a < 0.75 * size / MIB for a in above), (above, share, size / MIB)
