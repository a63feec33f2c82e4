"""One rank of a Trainer run on an N-D mesh (FSDP x tensor parallel x replicas), started by
tests/strategies/test_mesh.py with torchrun's environment (or as one process).

    python mesh_script.py OUT_DIR [--dp-replicate R] [--dp-shard S] [--tp T] [--head STYLE] [--hf]
        [--work-dir D] [--max-iters N] [--interval K] [--kill-at N] [--resume [PATH]] [--val] [--ac MODE]

``--head``: the TinyLM output layer's style in the plan ("loss_parallel", "colwise_rep",
"replicate"; ``--callable-plan``: given by a function); ``--hf``: a tiny Qwen3 from transformers with ``tp_plan="auto"`` instead.
Writes OUT_DIR/final_rank0.pt (full weights, gathered), OUT_DIR/loaded_rank0.pt (full
weights and optimizer state right after a resume loaded them) and
OUT_DIR/result_rank<r>.pt (metrics, counters, this rank's place in the mesh).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import TINY_LM_PLAN, TinyLM, lm_loss, make_tokens, tiny_qwen3

import treadle


class Probe(treadle.Hook):
    """Kills rank 1 after iteration ``kill_at``; dumps the full state a resume loaded."""

    priority = "LOWEST"

    def __init__(self, out: str, kill_at: int | None) -> None:
        self.out, self.kill_at = out, kill_at

    def after_load_checkpoint(self, trainer, checkpoint):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        module, strategy = trainer.module, trainer.strategy
        weights = strategy.get_full_model_state(module)  # collectives: every rank
        optim = get_optimizer_state_dict(module, trainer.optim_wrapper.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if strategy.is_main:
            torch.save({"model": weights, "optim": optim["state"], "iter": trainer.state.iter},
                       os.path.join(self.out, "loaded_rank0.pt"))

    def after_train_iter(self, trainer, batch, outputs):
        if self.kill_at is not None and trainer.state.iter + 1 == self.kill_at and trainer.strategy.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)


class HFBatches(torch.utils.data.Dataset):
    """TinyLM's token pairs as Hugging Face batches: input_ids and labels (shifted inside)."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        x, y = self.pairs[i]
        ids = torch.cat([x, y[-1:]])
        return {"input_ids": ids, "labels": ids}


class Seen:
    """Counts the validation sequences this rank saw; compute() sums over the data shards."""

    def reset(self):
        self.n = 0

    def update(self, outputs, targets):
        self.n += targets.shape[0]

    def compute(self):
        return treadle.metrics.sum_over_ranks(self.n)[0]


def seen_torchmetrics():
    """The same count by a torchmetrics object (it reduces over its own process group)."""
    import torchmetrics

    class SeenTM(torchmetrics.SumMetric):
        def update(self, outputs, targets):
            super().update(torch.ones(targets.shape[0]))
    return SeenTM()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--work-dir")
    p.add_argument("--dp-replicate", type=int, default=1)
    p.add_argument("--dp-shard", type=int, default=-1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--head", default="loss_parallel")
    p.add_argument("--hf", action="store_true")
    p.add_argument("--callable-plan", action="store_true")
    p.add_argument("--ac", help="activation_checkpointing=")
    p.add_argument("--max-iters", type=int, default=12)
    p.add_argument("--interval", type=int)
    p.add_argument("--kill-at", type=int)
    p.add_argument("--resume", nargs="?", const=True, default=False)
    p.add_argument("--val", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    if a.hf:
        model, plan, wrap, loss_fn = tiny_qwen3(), "auto", ("Qwen3DecoderLayer",), None
        train, val = HFBatches(make_tokens(32)), HFBatches(make_tokens(12, seed=1))
    else:
        model, wrap, loss_fn = TinyLM(), ("Block",), lm_loss
        plan = {**TINY_LM_PLAN, "head": a.head}
        if a.callable_plan:  # the plan from a function of the model and the tp mesh
            static, plan = plan, lambda model, tp_mesh: static if tp_mesh.size() == a.tp else None
        train, val = make_tokens(32), make_tokens(12, seed=1)
    strategy = dict(type="fsdp", backend="gloo", dp_replicate=a.dp_replicate, dp_shard=a.dp_shard, tp=a.tp,
                    tp_plan=plan if a.tp > 1 else None, wrap=wrap)
    trainer = treadle.Trainer(
        model, work_dir=a.work_dir, train_dataloader=DataLoader(train, batch_size=4, shuffle=True),
        val_dataloader=DataLoader(val, batch_size=3) if a.val else None, loss_fn=loss_fn,
        optimizer=dict(type="SGD", lr=0.1, momentum=0.9), clip_grad=dict(max_norm=0.5), max_iters=a.max_iters,
        val_interval=a.max_iters, seed=7,
        metrics={"acc": treadle.Accuracy(), "seen": Seen(), "seen_tm": seen_torchmetrics()} if a.val else None,
        train_metrics={"acc": treadle.Accuracy()} if a.val and not a.hf else None,
        resume=a.resume, checkpoint=dict(interval=a.interval, by_epoch=False, keep=None) if a.interval else False,
        hooks=[Probe(a.out, a.kill_at)], log_interval=4, strategy=strategy, activation_checkpointing=a.ac)
    metrics = trainer.fit()
    s = trainer.strategy
    weights = s.get_full_model_state(trainer.module)  # gathered on rank 0 only
    if s.is_main:
        torch.save({k: v.detach().clone() for k, v in weights.items()}, os.path.join(a.out, "final_rank0.pt"))
    torch.save({"metrics": metrics, "iter": trainer.state.iter, "world_size": s.world_size, "dp_rank": s.dp_rank,
                "dp_size": s.dp_size, "tp_size": s.tp_size, "loss_parallel": s.loss_parallel},
               os.path.join(a.out, f"result_rank{s.rank}.pt"))


if __name__ == "__main__":
    main()
