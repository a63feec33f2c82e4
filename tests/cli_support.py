"""The tiny config and helpers the command-line tests share (tests/ is on sys.path)."""

from __future__ import annotations

from treadle.cli import main

# A tiny run on tests/support.py's data and model: under a second.
TINY = """\
model: {type: support.TinyNet}
train_dataloader:
  dataset: {type: support.make_data, n: 32}
  batch_size: 8
  shuffle: true
val_dataloader:
  dataset: {type: support.make_data, n: 16, seed: 1}
  batch_size: 16
loss_fn: {type: CrossEntropyLoss}
optimizer: {type: SGD, lr: 0.1, momentum: 0.9}
max_epochs: 2
metrics: {acc: {type: Accuracy}}
log_interval: 2
log_writers: [jsonl]
seed: 0
"""


def run(capsys, *argv):
    """``treadle ARGV`` in this process: ``(exit status, stdout, stderr)``."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err
