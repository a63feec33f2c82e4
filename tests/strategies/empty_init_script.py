"""One rank of a model built on the meta device, started by tests/strategies/test_empty_init_ranks.py
with torchrun's environment.

    python empty_init_script.py OUT fresh STRATEGY_JSON       # a Llama spec, prepared; its full state to OUT/full.pt
    python empty_init_script.py OUT train DIR STRATEGY_JSON   # the Trainer on {pretrained: DIR}, a few steps

``train`` writes OUT/rss_rank<r>.json (the process's peak resident memory at ``before_train``,
in bytes), OUT/final.pt (the trained weights, gathered on rank 0) and the run in OUT/run
(its final checkpoint).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader

import treadle
from transformers import LlamaForCausalLM

LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=False)


def peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux's VmHWM: unlike ``ru_maxrss``,
    not inherited from the process that started this one)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def tokens(vocab: int) -> list[dict[str, torch.Tensor]]:
    """Sequences each given twice in a row: the two data shards read the same ones, so
    one process on one shard's batches is the reference."""
    ids = torch.randint(0, vocab, (8, 12), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row, "labels": row} for row in ids for _ in range(2)]


class PeakMemory(treadle.Hook):
    def __init__(self, out: str) -> None:
        self.out = out

    def before_train(self, trainer) -> None:
        peak = peak_rss()
        with open(os.path.join(self.out, f"rss_rank{trainer.strategy.rank}.json"), "w") as f:
            json.dump(peak, f)


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    if mode == "fresh":
        strategy = treadle.build_strategy(json.loads(sys.argv[3]), seed=0)
        strategy.prepare(dict(type=LlamaForCausalLM, config=LLAMA))
        full = strategy.model_state_dict()
        if strategy.rank == 0:
            torch.save(full, os.path.join(out, "full.pt"))
        return
    folder, strategy = sys.argv[3], json.loads(sys.argv[4])
    vocab = json.load(open(os.path.join(folder, "config.json")))["vocab_size"]
    trainer = treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=folder), work_dir=os.path.join(out, "run"),
                              train_dataloader=DataLoader(
        tokens(vocab), batch_size=2), optimizer=dict(type="SGD", lr=0.5), max_iters=3, strategy=strategy,
        hooks=[PeakMemory(out)], progress=False, seed=0, log_interval=1)
    trainer.fit()
    full = trainer.strategy.model_state_dict()
    if trainer.strategy.rank == 0:
        torch.save(full, os.path.join(out, "final.pt"))


if __name__ == "__main__":
    main()
