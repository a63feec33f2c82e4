"""Peak resident memory per rank of a big pretrained model through each door by which its spec
reaches treadle, under each strategy that shards it.

    python benchmarks/model_doors.py [--doors config,set,python,loop] [--strategies fsdp,fsdp_tp,zero3]
                                     [--hidden 768] [--layers 8] [--vocab 32000] [--timeout 1200]

A Llama-style model (``--hidden``, ``--layers``, ``--vocab``; by default about 380 MiB in
float32, benchmarks/model_memory.py's) is saved with ``save_pretrained`` into a temporary
folder, beside a tiny one, and given as ``dict(type=LlamaForCausalLM, pretrained=DIR)``
through each door:

* ``config``: a YAML config file naming it, ``treadle train CFG --nproc N``;
* ``set``: a config file naming the tiny model, ``treadle train CFG --nproc N --set
  model.pretrained=DIR``;
* ``python``: N processes of a script (torchrun's variables) calling
  ``treadle.Trainer(dict(...), strategy=...).fit()``;
* ``loop``: N processes of a hand-written loop: ``treadle.build_strategy(...)``,
  ``strategy.prepare(dict(...), optim_wrapper=...)``, one step by hand.

and each strategy: ``fsdp`` (FSDP over 2 processes), ``fsdp_tp`` (FSDP ``2 x tp 2`` over 4,
``tp_plan="auto"``), ``zero3`` (DeepSpeed ZeRO-3 over 2, on the CPU: ``DS_ACCELERATOR=cpu``,
``DS_BUILD_OPS=0``). One step of SGD without momentum (no state of its own), batches of 2
sequences of 8 tokens, gloo, one intra-op thread per process.

Each process reads its peak resident memory (Linux's ``VmHWM``) when the run starts (the
model built, sharded and filled, the optimizer built: the Trainer's ``before_run``, the loop
after ``prepare``) and after the first step (which has read every weight). Each figure is the
largest over the ranks of the rank's peak above its peak in the same run with the tiny model
(what Python, torch and transformers take), in MiB, beside a rank's share of the model and
the whole model. A run that fails shows its error line in its cells; the table goes on.
Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import Dataset

import treadle

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MIB = 2**20
TINY_VOCAB = 256  # the tiny model's vocabulary: every token id is below it
STRATEGIES = {  # name: (label, processes, strategy)
    "fsdp": ("FSDP", 2, dict(type="fsdp", wrap=["LlamaDecoderLayer"])),
    "fsdp_tp": ("FSDP `2 x tp 2`", 4, dict(type="fsdp", wrap=["LlamaDecoderLayer"], dp_shard=2, tp=2, tp_plan="auto")),
    "zero3": ("DeepSpeed ZeRO-3", 2, dict(type="deepspeed", zero_stage=3)),
}
DOORS = {"config": "config file", "set": "command line `--set`", "python": "Python (Trainer)", "loop": "hand loop"}
CONFIG = """\
model: {{type: transformers.LlamaForCausalLM, pretrained: {model}}}
train_dataloader: {{dataset: {{type: model_doors.Tokens}}, batch_size: 2}}
optimizer: {{type: SGD, lr: 0.1}}
strategy: {strategy}
max_iters: 1
checkpoint: false
hooks: [{{type: model_doors.Peaks, out: {out}}}]
seed: 0
progress: false
"""


def peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux's VmHWM: unlike ``ru_maxrss``,
    not inherited from the process that started this one)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class Tokens(Dataset):
    """8 sequences of 8 token ids below the tiny model's vocabulary, each its own label."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = (torch.arange(8) * 7 + i * 13) % TINY_VOCAB
        return {"input_ids": x, "labels": x}


class Peaks(treadle.Hook):
    """Writes ``[peak when the run starts, peak after the first step]`` to ``<out>/rank<r>.json``."""

    def __init__(self, out: str) -> None:
        self.out, self.before = out, 0

    def before_run(self, trainer) -> None:
        self.before = peak_rss()

    def after_train_iter(self, trainer, batch, outputs) -> None:
        if trainer.state.iter == 0:
            Path(self.out, f"rank{trainer.strategy.rank}.json").write_text(json.dumps([self.before, peak_rss()]))


def _python_door(folder: str, strategy: dict, out: str) -> None:
    from torch.utils.data import DataLoader
    from transformers import LlamaForCausalLM

    treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=folder), strategy=strategy,
                    train_dataloader=DataLoader(Tokens(), batch_size=2), optimizer=dict(type="SGD", lr=0.1),
                    max_iters=1, checkpoint=False, hooks=[Peaks(out)], progress=False, seed=0).fit()


def _loop_door(folder: str, strategy: dict, out: str) -> None:
    from torch.utils.data import DataLoader
    from transformers import LlamaForCausalLM

    strategy = treadle.build_strategy(strategy, seed=0)
    model, optim_wrapper = strategy.prepare(dict(type=LlamaForCausalLM, pretrained=folder),
                                            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    before = peak_rss()
    batch = next(iter(strategy.prepare_dataloader(DataLoader(Tokens(), batch_size=2))))
    with optim_wrapper.optim_context(model):
        optim_wrapper.update_params(model(**batch).loss)
    Path(out, f"rank{strategy.rank}.json").write_text(json.dumps([before, peak_rss()]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
            "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}


def _error_line(output: str) -> str:
    """The line that names a failed run's error (the last ``SomethingError: ...``)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^(\w+\.)*\w*(Error|Exception)\b", ln) and "ChildFailedError" not in ln]
    line = (errors or lines or ["no output"])[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def _run(door: str, strategy: dict, nproc: int, folder: Path, tiny: Path, timeout: float) -> list[list[int]]:
    """Each rank's ``[peak when the run starts, after the first step]``, in bytes; a failed
    run raises RuntimeError with its error line."""
    with tempfile.TemporaryDirectory() as out:
        if door in ("config", "set"):
            cfg = Path(out, "cfg.yaml")
            cfg.write_text(CONFIG.format(model=tiny if door == "set" else folder, strategy=json.dumps(strategy),
                                         out=out))
            cmd = [sys.executable, "-m", "treadle", "train", str(cfg), "--nproc", str(nproc),
                   "--work-dir", str(Path(out, "run"))]
            if door == "set":
                cmd += ["--set", f"model.pretrained={folder}"]
            procs = [subprocess.Popen(cmd, env=_env(), cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)]
        else:
            port = str(_free_port())
            procs = [subprocess.Popen(
                [sys.executable, __file__, "--child", door, str(folder), json.dumps(strategy), out],
                env={**_env(), "RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                     "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(nproc)]
        failed = None
        try:
            for p in procs:
                output, _ = p.communicate(timeout=timeout)
                if p.returncode and failed is None:
                    failed = _error_line(output)
        except subprocess.TimeoutExpired:
            failed = f"timed out after {timeout:.0f} s"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if failed is not None:
            raise RuntimeError(failed)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]


def _save(folder: Path, hidden: int, layers: int, vocab: int) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                                         num_hidden_layers=layers, num_attention_heads=max(4, hidden // 64),
                                         num_key_value_heads=4, tie_word_embeddings=False))
    model.save_pretrained(folder)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _names(text: str, known: dict) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {', '.join(unknown)}; expected some of {','.join(known)}")
    return names


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        door, folder, strategy, out = sys.argv[2:6]
        (_python_door if door == "python" else _loop_door)(folder, json.loads(strategy), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doors", default=",".join(DOORS), help=f"some of {','.join(DOORS)}")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help=f"some of {','.join(STRATEGIES)}")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds a run may take")
    args = parser.parse_args()
    doors, strategies = _names(args.doors, DOORS), _names(args.strategies, STRATEGIES)
    with tempfile.TemporaryDirectory() as root:
        big, tiny = Path(root, "big"), Path(root, "tiny")
        size = _save(big, args.hidden, args.layers, args.vocab)
        _save(tiny, 64, 1, TINY_VOCAB)
        print(f"model: {size / MIB:.0f} MiB (float32), hidden {args.hidden}, {args.layers} layers, "
              f"vocabulary {args.vocab}\n")
        print("| door | strategy | processes | a rank's share | whole model | before the first step | after it |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for door in doors:
            for name in strategies:
                label, nproc, strategy = STRATEGIES[name]
                runs = {}
                for model in (tiny, big):
                    try:
                        runs[model] = _run(door, strategy, nproc, model, tiny, args.timeout)
                    except RuntimeError as e:
                        runs[model] = f"failed{' (the tiny run)' if model == tiny else ''}: {str(e).replace('|', '/')}"
                        break
                failed = [r for r in runs.values() if isinstance(r, str)]
                cells = failed * 2 if failed else [
                    f"{max(p[i] - b[i] for p, b in zip(runs[big], runs[tiny])) / MIB:.0f} MiB" for i in (0, 1)]
                print(f"| {DOORS[door]} | {label} | {nproc} | {size / nproc / MIB:.0f} MiB | {size / MIB:.0f} MiB | "
                      f"{' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
