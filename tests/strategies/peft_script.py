"""One process of a PEFT fine-tune of a tiny Llama with the Trainer's default step, for
tests/strategies/test_peft_resume.py (one process, or each rank of 2 with torchrun's
environment variables).

    python peft_script.py WORK_DIR [--strategy single|ddp|fsdp] [--adapter lora|ia3] [--max-iters N]
        [--interval K] [--kill-at N] [--resume [PATH]] [--init-range R] [--save-frozen] [--load-checkpoint PATH]
        [--async-save]

The model is the config dict a YAML file would hold (``type``, ``config``, ``peft``), built
by the Trainer after seeding: the same base in every run unless ``--init-range`` changes
it. ``--kill-at N``: every rank SIGKILLs itself once N iterations are done (after the
checkpoint hook). ``--load-checkpoint PATH``: the weights of PATH loaded through the
strategy's ``load_checkpoint`` (strict) before training, as a hand-written loop loads them.
"""

from __future__ import annotations

import argparse
import os
import sys

from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from faults import SigkillAt
from support import make_token_batches

import treadle

LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, attention_dropout=0.1)
ADAPTERS = {
    "lora": dict(peft_type="LORA", r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"],
                 task_type="CAUSAL_LM"),
    "ia3": dict(peft_type="IA3", target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"],
                task_type="CAUSAL_LM"),
}
STRATEGIES = {"single": "single", "ddp": "ddp", "fsdp": dict(type="fsdp", wrap=["LlamaDecoderLayer"])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("work_dir")
    p.add_argument("--strategy", default="single", choices=sorted(STRATEGIES))
    p.add_argument("--adapter", default="lora", choices=sorted(ADAPTERS))
    p.add_argument("--max-iters", type=int, default=12)
    p.add_argument("--interval", type=int, default=4)
    p.add_argument("--kill-at", type=int)
    p.add_argument("--resume", nargs="?", const=True, default=False)  # alone: the latest checkpoint in WORK_DIR
    p.add_argument("--init-range", type=float, default=0.02)  # LlamaConfig's default: the base of every run
    p.add_argument("--save-frozen", action="store_true")
    p.add_argument("--load-checkpoint")
    p.add_argument("--async-save", action="store_true")
    a = p.parse_args()
    model = dict(type="transformers.LlamaForCausalLM", config=dict(LLAMA, initializer_range=a.init_range),
                 peft=ADAPTERS[a.adapter])
    trainer = treadle.Trainer(
        model, work_dir=a.work_dir, strategy=STRATEGIES[a.strategy], seed=0,
        train_dataloader=DataLoader(make_token_batches(n=48), batch_size=4, shuffle=True),
        optimizer=dict(type="AdamW", lr=1e-2), max_iters=a.max_iters, log_interval=2,
        checkpoint=dict(interval=a.interval, by_epoch=False, keep=None, save_frozen=a.save_frozen,
                        async_save=a.async_save),
        resume=a.resume, hooks=[SigkillAt(None, a.kill_at)] if a.kill_at else [], progress=False)
    if a.load_checkpoint:
        trainer.strategy.load_checkpoint(a.load_checkpoint, strict=True)
    trainer.fit()


if __name__ == "__main__":
    main()
