"""Train a small CNN on scikit-learn's digits with treadle (on a GPU where there is one) and print a table.

    python examples/digits/train.py [--epochs 12] [--work-dir runs/digits-py]

Under 15 s of CPU time on a 2-core CPU; val/acc 0.99 after the 12 epochs.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import treadle
from treadle.logging import read_jsonl

from digits import DigitsCNN, digits_loaders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--work-dir", default="runs/digits-py")  # not the demo's runs/digits
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # a model this small trains fastest on one CPU thread
    train_loader, val_loader = digits_loaders()
    trainer = treadle.Trainer(
        DigitsCNN(),
        work_dir=args.work_dir,
        train_dataloader=train_loader,
        val_dataloader=val_loader,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=dict(type="AdamW", lr=2e-3, weight_decay=1e-4),
        max_epochs=args.epochs,
        metrics={"acc": treadle.Accuracy()},
        log_interval=15,
        seed=args.seed,
    )
    start = time.perf_counter()
    trainer.fit()
    elapsed = time.perf_counter() - start
    print_table(read_jsonl(f"{args.work_dir}/log.jsonl"), elapsed)


def print_table(records: list[dict], elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    last_train: dict[int, float] = {}
    table = Table(title=f"digits: validation per epoch ({elapsed:.1f} s)")
    for col in ("epoch", "train loss", "val loss", "val acc"):
        table.add_column(col, justify="right")
    for r in records:
        if r["mode"] == "train":
            last_train[r["epoch"]] = r["loss"]
        elif r["mode"] == "val":
            table.add_row(str(r["epoch"]), f"{last_train.get(r['epoch'], float('nan')):.4f}",
                          f"{r['val/loss']:.4f}", f"{r['val/acc']:.4f}")
    Console().print(table)


if __name__ == "__main__":
    main()
