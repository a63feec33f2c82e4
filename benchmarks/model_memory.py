"""Peak resident memory per rank when a pretrained model is built whole on every process,
against built on the meta device and read shard by shard.

    python benchmarks/model_memory.py [--nproc 1 2 4] [--hidden 768] [--layers 8] [--vocab 32000]

A Llama-style model (``--hidden``, ``--layers``, ``--vocab``; the default about 400 MiB in
float32) is saved with ``save_pretrained`` into a temporary folder, beside a tiny one. For
each number of processes, fresh processes of this script (torchrun's variables, gloo, one
intra-op thread each) run ``treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=DIR),
strategy=...)`` and read the process's peak resident memory (Linux's ``VmHWM``) in a
``before_train`` hook, when the model is placed and sharded and its optimizer built, and after
the first step (which has read every weight: ``from_pretrained`` maps the file and reads a
page when it is first used):

* ``whole``: ``empty_init=False``, every process builds the model with ``from_pretrained``,
  then FSDP shards it (what treadle did before building on the meta device);
* ``meta``: the default under several processes (``empty_init=True`` on one): the model
  built on the meta device, sharded there, each process reading its shards of the
  safetensors file.

The strategy is FSDP over all processes (``dp_shard=N``), and on 4 also ``2 x tp 2``
(``tp_plan="auto"``); the optimizer SGD without momentum (no state of its own). Each figure
is the largest rank's peak above the same run's with the tiny model (what Python, torch
and transformers take), in MiB, beside the model's size and a process's share of it.
Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux's VmHWM: unlike ``ru_maxrss``,
    not inherited from the process that started this one)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _child(folder: str, strategy: str, out: str) -> None:
    import torch
    from torch.utils.data import DataLoader
    from transformers import LlamaForCausalLM

    import treadle

    class Peak(treadle.Hook):
        def before_train(self, trainer) -> None:
            self.before = peak_rss()

        def after_train_iter(self, trainer, batch, outputs) -> None:  # the first step touched every weight
            Path(out, f"rank{trainer.strategy.rank}.json").write_text(json.dumps([self.before, peak_rss()]))

    vocab = json.loads(Path(folder, "config.json").read_text())["vocab_size"]
    ids = torch.randint(0, vocab, (8, 8), generator=torch.Generator().manual_seed(0))
    treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=folder), strategy=json.loads(strategy),
                    train_dataloader=DataLoader([{"input_ids": r, "labels": r} for r in ids], batch_size=2),
                    optimizer=dict(type="SGD", lr=0.1), max_iters=1, hooks=[Peak()], progress=False, seed=0).fit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(folder: Path, strategy: dict, nproc: int) -> tuple[int, int]:
    """The largest rank's peak resident memory, in bytes, before the first step and after it."""
    with tempfile.TemporaryDirectory() as out:
        port = str(_free_port())
        procs = [subprocess.Popen(
            [sys.executable, __file__, "--child", str(folder), json.dumps(strategy), out],
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                 "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                 "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(nproc)]
        for p in procs:
            output, _ = p.communicate(timeout=1200)
            if p.returncode:
                raise SystemExit(f"a rank failed ({strategy}, {nproc} processes):\n{output[-3000:]}")
        peaks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]
        return max(p[0] for p in peaks), max(p[1] for p in peaks)


def _save(folder: Path, hidden: int, layers: int, vocab: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                                         num_hidden_layers=layers, num_attention_heads=max(4, hidden // 64),
                                         num_key_value_heads=4, tie_word_embeddings=False))
    model.save_pretrained(folder)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        size = _save(Path(root, "big"), args.hidden, args.layers, args.vocab)
        _save(Path(root, "tiny"), 64, 1, 256)
        mib = 2**20
        print(f"model: {size / mib:.0f} MiB (float32), hidden {args.hidden}, {args.layers} layers, "
              f"vocabulary {args.vocab}\n")
        print("| processes | layout | a process's share | whole build: before the first step | after it | "
              "meta build: before the first step | after it |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for nproc in args.nproc:
            layouts = [("FSDP" if nproc > 1 else "one process", dict(type="fsdp", wrap=["LlamaDecoderLayer"]))]
            if nproc == 4:
                layouts.append(("FSDP 2 x tp 2", dict(type="fsdp", wrap=["LlamaDecoderLayer"], dp_shard=2, tp=2,
                                                      tp_plan="auto")))
            for name, strategy in layouts:
                base = _run(Path(root, "tiny"), {**strategy, "empty_init": True}, nproc)
                cells = [f"{(peak - b) / mib:.0f} MiB" for empty in (False, True)
                         for peak, b in zip(_run(Path(root, "big"), {**strategy, "empty_init": empty}, nproc), base)]
                print(f"| {nproc} | {name} | {size / nproc / mib:.0f} MiB | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
