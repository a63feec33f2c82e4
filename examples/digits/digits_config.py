"""The digits example as a Python config: code that runs.

    treadle train examples/digits/digits_config.py

Under 15 s of CPU time on a 2-core CPU; val/acc 0.98 after its 4 epochs.

Module-level names become config keys; names starting with "_", modules, classes and
functions do not. The result must be plain data (it is saved as config.yaml), but a
``type`` may be the class itself, so your editor jumps to it.
"""

import torch

from digits import DigitsCNN  # this file's directory is on sys.path while it runs

_base_ = "digits.yaml"

_width = 16
model = dict(type=DigitsCNN, width=_width)       # saved as "type: DigitsCNN"
optimizer = dict(type=torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True, _delete_=True)  # not merged
max_epochs = 4
# No `end`: the Trainer uses max_epochs, so `--set max_epochs=...` reshapes the schedule.
schedulers = [dict(type="CosineAnnealingLR", by_epoch=True, eta_min=1e-4)]
