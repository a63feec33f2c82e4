"""A big pretrained model given on the command line is never held whole by one process under a
strategy that shards it: ``treadle train CONFIG --nproc 2`` with FSDP, for a YAML file, a
Python file and an MMEngine-style file; a config naming a tiny model pointed at the big one by
``--set model.pretrained=DIR``; and ``treadle validate`` of a config on 2 processes (torchrun).
Each rank's peak memory when the run starts against the same run of a tiny model
(tests/big_model_support.py). The model's spec goes to the Trainer as it is, which builds it
on the meta device and fills each process's shards (treadle/config/assemble.py): a process
built whole would peak a whole model (here about 79 MiB) above the tiny run; each holds
about its half."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from big_model_support import assert_never_whole, save_models, written_peaks
from support import fsdp_on_cpu

pytestmark = [pytest.mark.slow, fsdp_on_cpu]
pytest.importorskip("transformers")

TESTS = Path(__file__).resolve().parents[1]

YAML = """
model: {{type: transformers.LlamaForCausalLM, pretrained: {model}}}
train_dataloader: {{dataset: {{type: big_model_support.Tokens}}, batch_size: 2}}
optimizer: {{type: SGD, lr: 0.0}}
strategy: {{type: fsdp, wrap: [LlamaDecoderLayer]}}
max_iters: 1
checkpoint: false
hooks: [{{type: big_model_support.PeakAtStart, out: {out}}}]
seed: 0
progress: false
"""

#: Each door: the config file's name and text (``{model}``: the folder it names, ``{out}``: where
#: the hook writes each rank's peak), and the command after ``python -m`` (``{cfg}``, ``{model}``).
TRAIN = ["treadle", "train", "{cfg}", "--nproc", "2", "--work-dir", "{out}/run"]
DOORS = {
    "yaml": ("cfg.yaml", YAML, TRAIN),
    "python": ("cfg.py", """
model = dict(type='transformers.LlamaForCausalLM', pretrained='{model}')
train_dataloader = dict(dataset=dict(type='big_model_support.Tokens'), batch_size=2)
optimizer = dict(type='SGD', lr=0.0)
strategy = dict(type='fsdp', wrap=['LlamaDecoderLayer'])
max_iters = 1
checkpoint = False
hooks = [dict(type='big_model_support.PeakAtStart', out='{out}')]
seed = 0
progress = False
""", TRAIN),
    "mmengine": ("cfg_mm.py", """
model = dict(type='transformers.LlamaForCausalLM', pretrained='{model}')
train_dataloader = dict(dataset=dict(type='big_model_support.Tokens'), batch_size=2,
                        sampler=dict(type='DefaultSampler', shuffle=True))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.0))
train_cfg = dict(by_epoch=False, max_iters=1)
default_hooks = dict(checkpoint=None)
custom_hooks = [dict(type='big_model_support.PeakAtStart', out='{out}')]
strategy = dict(type='FSDPStrategy', model_wrapper=dict(auto_wrap_policy=dict(
    type='torch.distributed.fsdp.wrap.transformer_auto_wrap_policy', transformer_layer_cls=['LlamaDecoderLayer'])))
randomness = dict(seed=0)
""", TRAIN),
    # The config names the tiny model; the command line points it at the one measured.
    "set": ("cfg.yaml", YAML.replace("{model}", "{tiny}"), [*TRAIN, "--set", "model.pretrained={model}"]),
    "validate": ("val.yaml", """
model: {{type: transformers.LlamaForCausalLM, pretrained: {model}}}
val_dataloader: {{dataset: {{type: big_model_support.Tokens}}, batch_size: 2}}
strategy: {{type: fsdp, wrap: [LlamaDecoderLayer]}}
hooks: [{{type: big_model_support.PeakAtStart, out: {out}}}]
seed: 0
progress: false
""", ["torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "treadle", "validate", "{cfg}",
              "--checkpoint", "{model}"]),
}


def peaks(tmp: Path, door: str, model: Path) -> list[int]:
    """Each rank's peak resident memory when the run starts, through ``door`` over the
    pretrained ``model`` on 2 processes."""
    out = tmp / f"{door}-{model.name}"
    out.mkdir()
    name, text, argv = DOORS[door]
    fill = {"model": model, "tiny": model.parent / "tiny", "out": out, "cfg": out / name}
    (out / name).write_text(text.format(**fill))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", *(a.format(**fill) for a in argv)]
    proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return written_peaks(out)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return root, save_models(root)


@pytest.mark.parametrize("door", list(DOORS))
def test_a_pretrained_model_from_the_command_line_is_never_whole_in_one_process(tmp_path, models, door):
    root, size = models
    assert_never_whole(peaks(tmp_path, door, root / "big"), peaks(tmp_path, door, root / "tiny"), size)
