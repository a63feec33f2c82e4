"""Fine-tune Hugging Face models with no wrapper: a small GPT-2 (causal language model)
and a small BERT (sequence classification), built from configs (nothing is downloaded).

    python examples/huggingface/train.py --model bert [--max-iters 800] [--work-dir runs/hf-bert]
    python examples/huggingface/train.py --model gpt2 --resume      # goes on where it stopped

On a 2-core CPU, imports included:

--model bert: under 20 s of CPU time, val/acc 0.99 (chance: 0.5);
--model gpt2: under 20 s of CPU time, val/loss 0.5 (guessing: ln 64 = 4.2).

Batches are dicts named as the model's forward arguments (``input_ids``,
``attention_mask``, ``labels``): the Trainer calls ``model(**batch)``, takes the loss from
the returned ``ModelOutput`` and logs only it (the logits are never held for the log).
Validation metrics get the output's ``logits`` and the batch's ``labels``. The run uses
accumulation over 2 batches, a linear warmup then cosine annealing, a torchmetrics
accuracy for BERT, and bf16 autocast on a GPU (on a CPU, bf16 is several times slower than
float32 for models this small: float32 there). Needs ``pip install 'treadle[hf]'``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import treadle

VOCAB, LENGTH = 64, 16


class Sequences(Dataset):
    """Token sequences that count up from a random start by a random step (mod VOCAB).
    GPT-2 learns to continue them; BERT tells steps of 1 (label 0) from steps of 2 or 3."""

    def __init__(self, n: int, seed: int, classify: bool) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        step = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(LENGTH)) % VOCAB
        self.labels = (step[:, 0] > 1).long() if classify else self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def build_model(name: str) -> torch.nn.Module:
    """A few-layer model from a config: random weights, no download."""
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        # No bos/eos token: GPT-2's (50256) are outside this vocabulary.
        model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                                           bos_token_id=None, eos_token_id=None))
        model.loss_type = "ForCausalLM"  # transformers infers it from class names ending so; GPT-2's does not
        return model
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=64,
                                                    max_position_embeddings=LENGTH, num_labels=2))


def build_trainer(name: str, work_dir: str | Path, max_iters: int = 800, resume: bool = False,
                  hooks: list[Any] = (), precision: str | None = None, **options: Any) -> treadle.Trainer:
    """The example's Trainer; ``hooks`` and ``options`` are added (tests inject faults).
    ``precision``: None for bf16 on a GPU, float32 on the CPU."""
    classify = name == "bert"
    torch.manual_seed(0)  # the initial weights
    model = build_model(name)
    metrics = None
    if classify:
        from torchmetrics.classification import MulticlassAccuracy

        metrics = {"acc": MulticlassAccuracy(num_classes=2)}
    warmup = max(1, max_iters // 10)
    return treadle.Trainer(
        model, work_dir=work_dir,
        train_dataloader=DataLoader(Sequences(2048, seed=1, classify=classify), batch_size=32, shuffle=True),
        val_dataloader=DataLoader(Sequences(256, seed=2, classify=classify), batch_size=128),
        optimizer=dict(type="AdamW", lr=3e-3, weight_decay=0.01), accumulate=2,
        precision=precision or ("bf16" if torch.cuda.is_available() else "32"),
        schedulers=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=warmup),
                    dict(type="CosineAnnealingLR", by_epoch=False, begin=warmup, end=max_iters, eta_min=1e-5)],
        metrics=metrics, max_iters=max_iters, val_interval=max(1, max_iters // 2), log_interval=50,
        checkpoint=dict(interval=max_iters // 2, by_epoch=False, keep=2), seed=0, resume=resume,
        hooks=list(hooks), **options)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt2", "bert"), default="bert")
    parser.add_argument("--max-iters", type=int, default=800)
    parser.add_argument("--work-dir", default=None, help="default: runs/hf-<model>")
    parser.add_argument("--resume", action="store_true", help="go on from the newest checkpoint in work_dir")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # models this small train fastest on one CPU thread (and the same on any machine)
    work_dir = args.work_dir or f"runs/hf-{args.model}"
    return build_trainer(args.model, work_dir, args.max_iters, args.resume).fit()


if __name__ == "__main__":
    print(main())
