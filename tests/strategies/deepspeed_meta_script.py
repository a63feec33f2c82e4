"""One rank of a DeepSpeed ZeRO-3 run over a model spec, started by
tests/strategies/test_deepspeed_meta.py with torchrun's environment.

    python deepspeed_meta_script.py OUT MODEL_JSON STRATEGY_JSON PRECISION

MODEL_JSON: ``{"pretrained": DIR}`` or ``{"config": {...LlamaConfig...}}``. The Trainer trains
a Llama built from it for 3 steps (SGD) and writes OUT/final.pt (the trained weights,
gathered on rank 0), OUT/built.pt (the weights as built, before the first step) and
OUT/rss_rank<r>.json: the process's peak resident memory (Linux's VmHWM) when the engine
is about to be made, the model built and partitioned (``setup_optim_wrappers`` starts).
"""

from __future__ import annotations

import json
import os
import sys

from pathlib import Path

import torch
from torch.utils.data import DataLoader

import treadle
from treadle.strategies.deepspeed import DeepSpeedStrategy
from transformers import LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared measure
from big_model_support import peak_rss


class Built(treadle.Hook):
    def __init__(self, out: str) -> None:
        self.out = out

    def before_train(self, trainer) -> None:
        full = trainer.strategy.model_state_dict()
        if trainer.strategy.rank == 0:
            torch.save(full, os.path.join(self.out, "built.pt"))


def main() -> None:
    out, model, strategy, precision = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    rank = int(os.environ["RANK"])
    engine = DeepSpeedStrategy.setup_optim_wrappers

    def measured(self, *args, **kwargs):  # the model built (and partitioned), the engine not made yet
        with open(os.path.join(out, f"rss_rank{rank}.json"), "w") as f:
            json.dump(peak_rss(), f)
        return engine(self, *args, **kwargs)

    DeepSpeedStrategy.setup_optim_wrappers = measured
    vocab = (json.load(open(os.path.join(model["pretrained"], "config.json"))) if "pretrained" in model
             else model["config"])["vocab_size"]
    ids = torch.randint(0, vocab, (6, 12), generator=torch.Generator().manual_seed(0))
    trainer = treadle.Trainer(dict(type=LlamaForCausalLM, **model), work_dir=os.path.join(out, "run"),
                              train_dataloader=DataLoader([{"input_ids": r, "labels": r} for r in ids], batch_size=1),
                              optimizer=dict(type="SGD", lr=0.5), max_iters=3, strategy=strategy, precision=precision,
                              hooks=[Built(out)], progress=False, seed=0, checkpoint=False)
    trainer.fit()
    full = trainer.strategy.model_state_dict()
    if trainer.strategy.rank == 0:
        torch.save(full, os.path.join(out, "final.pt"))


if __name__ == "__main__":
    main()
