"""MMEngine on the workload of peers_common.py, set up as its docs say:

* the model a registered ``BaseModel`` built from a dict, the loader a dict with
  ``DefaultSampler(shuffle=True)``, ``randomness=dict(seed=...)`` (which seeds the sampler
  and the workers) ("Runner", "Dataset and DataLoader", "Randomness");
* checkpoints: ``default_hooks.checkpoint = CheckpointHook(interval=..., by_epoch=False)``,
  resumed with ``Runner(..., resume=True)`` (the newest checkpoint of ``work_dir``)
  ("Resume training", "CheckpointHook");
* several processes: ``torchrun --nproc-per-node 2 run_mmengine.py dist --launcher pytorch``
  (its ``tools/dist_train.sh``), ``env_cfg.dist_cfg = dict(backend="gloo", timeout=...)``
  ("Distributed training"). MMEngine 0.10.7's ``launcher="pytorch"`` calls
  ``torch.cuda.set_device``, which a CPU build of torch lacks, so this script starts the
  process group itself with the same backend and timeout before the Runner, which then
  uses it (``Runner.setup_env`` initialises only when no group exists); and its default
  wrapper gives DDP ``device_ids=[LOCAL_RANK]``, which DDP refuses for a CPU module, so
  the config's ``model_wrapper_cfg`` sets ``device_ids=None`` (``Runner.wrap_model``).

    python run_mmengine.py train --work-dir D --out W [--resume]
    torchrun --nproc-per-node 2 run_mmengine.py dist --work-dir D --launcher pytorch [--timeout S]
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import HOOKS, MODELS
from mmengine.runner import Runner
from torch.nn import functional as F

from peers_common import (BATCH, CKPT_EVERY, EPOCHS, LR, Net, Noisy, SEED,
                          WORKERS, arguments, kill_if_due, save_weights)


@MODELS.register_module()
class PeersModel(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, inputs: torch.Tensor, targets: Any = None, mode: str = "tensor") -> Any:
        out = self.net(inputs)
        return {"loss": F.cross_entropy(out, targets)} if mode == "loss" else out


@HOOKS.register_module()
class KillHook(Hook):
    priority = "HIGHEST"

    def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
        kill_if_due(runner.iter)  # optimizer steps done so far


def main() -> None:
    args = arguments(__doc__, launcher="none")
    dist_cfg: dict[str, Any] = dict(backend="gloo")
    if args.timeout:
        dist_cfg["timeout"] = int(args.timeout)
    if args.launcher == "pytorch" and not torch.cuda.is_available():
        timeout = dict(timeout=timedelta(seconds=dist_cfg["timeout"])) if args.timeout else {}
        torch.distributed.init_process_group("gloo", **timeout)
    runner = Runner(
        model=dict(type="PeersModel"), work_dir=args.work_dir,
        train_dataloader=dict(dataset=Noisy(), sampler=dict(type="DefaultSampler", shuffle=True), batch_size=BATCH,
                              num_workers=WORKERS, collate_fn=dict(type="default_collate")),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR)),
        train_cfg=dict(by_epoch=True, max_epochs=EPOCHS),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=CKPT_EVERY, by_epoch=False),
                           logger=dict(type="LoggerHook", interval=5)),
        custom_hooks=[dict(type="KillHook")], randomness=dict(seed=SEED),
        env_cfg=dict(dist_cfg=dist_cfg), launcher=args.launcher, resume=args.resume,
        cfg=dict(model_wrapper_cfg=dict(type="MMDistributedDataParallel", device_ids=None, broadcast_buffers=False)))
    runner.train()
    if args.out:
        save_weights(runner.model, args.out)


if __name__ == "__main__":
    main()
