"""Fine-tune a small pretrained causal language model with LoRA, then export the adapter.

    python examples/lora/finetune.py [--work-dir runs/lora] [--max-iters 300] [--nproc 1]

Nothing is downloaded. The script first makes its own "pretrained" model: a 2-layer
Llama-style decoder trained to continue sequences that count up by 1 (mod 64), saved with
``save_pretrained`` into ``WORK_DIR/base``. It then fine-tunes a LoRA adapter on sequences
that count up by 3, a skill the base lacks: the model is given as a spec,

    model=dict(type=LlamaForCausalLM, pretrained=WORK_DIR/base,
               peft=dict(peft_type="LORA", r=8, lora_alpha=16, target_modules=[...]))

the same dict a config file's ``model:`` holds, so the base is read as ``from_pretrained``
reads it (on several processes with FSDP, each process reads its shards only). Only the
adapter trains, and only the adapter is written into each checkpoint (the frozen base is
checked by its digest on resume). Finally ``treadle export`` writes the adapter as a PEFT
folder (``WORK_DIR/adapter``) and the script loads it with ``PeftModel.from_pretrained`` to
continue a count by 3.

On a CPU, on one thread (set below: a model this small steps several times faster so than on
many), imports and the base included, under 30 s of CPU time, val/loss 0.007 (the base, which
predicts a step of 1, scores 10.0 there; guessing would be ln 64 = 4.2), and the exported
adapter continues 5, 8, 11, 14 with 17, 20, 23, 26. ``--nproc 2`` fine-tunes on two processes (FSDP: the base built on the meta
device, each process reading its shards). Needs ``pip install 'treadle[hf]'``
(transformers and peft).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

VOCAB, LENGTH = 64, 16
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=LENGTH, tie_word_embeddings=False,
             bos_token_id=0, eos_token_id=0, pad_token_id=0)
LORA = dict(peft_type="LORA", task_type="CAUSAL_LM", r=8, lora_alpha=16, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


class Counting(Dataset):
    """Sequences counting up from a random start by ``step`` (mod VOCAB)."""

    def __init__(self, n: int, step: int, seed: int) -> None:
        start = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (start + step * torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_base(folder: Path, steps: int = 300) -> None:
    """The "pretrained" model: counting by 1, trained in a plain loop, saved with save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(Counting(2048, step=1, seed=0), batch_size=32, shuffle=True)
    done = 0
    while done < steps:
        for batch in loader:
            loss = model(**batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    model.save_pretrained(folder)


def fine_tune(work_dir: Path, max_iters: int, nproc: int) -> dict[str, Any]:
    """The LoRA fine-tune through treadle's Trainer (one process here; ``--nproc``: FSDP)."""
    from transformers import LlamaForCausalLM

    import treadle

    trainer = treadle.Trainer(
        dict(type=LlamaForCausalLM, pretrained=str(work_dir / "base"), peft=LORA),
        work_dir=work_dir / "run",
        train_dataloader=DataLoader(Counting(2048, step=3, seed=1), batch_size=32, shuffle=True),
        val_dataloader=DataLoader(Counting(256, step=3, seed=2), batch_size=128),
        optimizer=dict(type="AdamW", lr=1e-2), max_iters=max_iters, val_interval=max_iters, log_interval=50,
        strategy=dict(type="fsdp", wrap=["LlamaDecoderLayer"]) if nproc > 1 else "auto", seed=0)
    return trainer.fit()


def continue_count(work_dir: Path, start: list[int]) -> list[int]:
    """The exported adapter on the base, as PEFT loads it: the next tokens after ``start``."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    with warnings.catch_warnings():  # peft 0.21 asks transformers 5 a deprecated question (is_gradient_checkpointing)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(work_dir / "base"), work_dir / "adapter")
    out = model.generate(input_ids=torch.tensor([start]), max_new_tokens=4, do_sample=False)
    return out[0, len(start):].tolist()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="runs/lora")
    parser.add_argument("--max-iters", type=int, default=300)
    parser.add_argument("--nproc", type=int, default=1, help="processes (FSDP over them when more than one)")
    parser.add_argument("--fine-tune-only", action="store_true", help=argparse.SUPPRESS)  # one rank of --nproc
    args = parser.parse_args(argv)
    work_dir = Path(args.work_dir)
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # a model this small steps several times faster on one thread than on many
        # save_pretrained (accelerate) imports DeepSpeed when it is installed, which then warns that it
        # guessed the CPU: it is told instead (nothing here uses DeepSpeed)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not args.fine_tune_only and not (work_dir / "base" / "model.safetensors").is_file():
        print(f"making the pretrained base: a 2-layer Llama taught to count by 1 ({work_dir / 'base'})", flush=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # from_pretrained's bar over a model of 21 tensors
    if args.fine_tune_only:  # one of the processes torchrun started
        return fine_tune(work_dir, args.max_iters, int(os.environ.get("WORLD_SIZE", "1")))
    if not (work_dir / "base" / "model.safetensors").is_file():
        make_base(work_dir / "base")
    print(f"fine-tuning a LoRA adapter to count by 3 ({work_dir / 'run'})", flush=True)
    if args.nproc > 1:  # torchrun's launcher, as treadle train --nproc starts it
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
                        __file__, "--fine-tune-only", "--work-dir", str(work_dir), "--max-iters",
                        str(args.max_iters)], check=True)
        metrics: dict[str, Any] = {}
    else:
        metrics = fine_tune(work_dir, args.max_iters, args.nproc)
    subprocess.run([sys.executable, "-m", "treadle", "export", str(work_dir / "run"), "--out",
                    str(work_dir / "adapter")], check=True)
    start = [5, 8, 11, 14]
    print(f"the adapter continues {start} with {continue_count(work_dir, start)}")
    return metrics


if __name__ == "__main__":
    main()
