"""Memory per rank and time per step of data parallelism, FSDP, HSDP and FSDP x tensor
parallel, for a small decoder-only transformer, through treadle's public Strategy API.

    python benchmarks/parallel.py [--nproc 4] [--steps 20] [--warmup 5] [--device cpu|cuda]
                                  [--layers 4] [--dim 256] [--heads 8] [--vocab 2048] [--seq 128]
                                  [--global-batch 16] [--configs ddp,fsdp,hsdp,fsdp_tp]

For each configuration the script starts ``--nproc`` fresh processes of itself (torchrun's
variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; gloo on the CPU with one
intra-op thread each, nccl on CUDA with a GPU each). Each builds the same model (seed 0),
prepares it with ``treadle.build_strategy(...)`` and ``strategy.prepare(model,
optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))``, and trains on random tokens:
the global batch is the same in every configuration (``--global-batch`` sequences of
``--seq`` tokens), split over the data-parallel ranks. After ``--warmup`` steps,
``--steps`` steps are timed one by one between barriers (a device synchronization before
each mark on CUDA); the slowest rank's time counts.

Memory: the bytes this rank holds of the parameters, of their gradients (after a
backward) and of the optimizer state (AdamW's two moments and step), counting a DTensor's
local shard only, and the activations autograd saved for backward in the first step
(``saved_tensors_hooks``, each storage once: the CPU's stand-in for a GPU's peak); the
largest rank's. Configurations (``--nproc`` 4):

==========  ==================================================================
``ddp``     DDPStrategy: every rank holds the whole model
``fsdp``    FSDPStrategy: dp_shard=4
``hsdp``    FSDPStrategy: dp_replicate=2 x dp_shard=2
``fsdp_tp`` FSDPStrategy: dp_shard=2 x tp=2 (attention and MLP split Megatron-style,
            the embedding on the vocabulary, the output layer on the classes with
            the loss on the shards)
==========  ==================================================================

Prints one markdown table: MiB per rank of parameters, gradients, optimizer state and
their sum, and the median ms/step with its interquartile range.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "ddp": dict(type="ddp"),
    "fsdp": dict(type="fsdp", wrap=("Block",)),
    "hsdp": dict(type="fsdp", wrap=("Block",), dp_replicate=2, dp_shard=-1),
    "fsdp_tp": dict(type="fsdp", wrap=("Block",), tp=2, tp_plan={
        "embed": "embedding_rowwise", "layers.*.attn.q": "colwise", "layers.*.attn.k": "colwise",
        "layers.*.attn.v": "colwise", "layers.*.attn.o": "rowwise", "layers.*.up": "colwise",
        "layers.*.down": "rowwise", "head": "loss_parallel"}),
}


def build_model(a: argparse.Namespace):
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head_dim = a.dim // a.heads
            self.q, self.k, self.v, self.o = (nn.Linear(a.dim, a.dim, bias=False) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, t, -1))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(a.dim), nn.LayerNorm(a.dim)
            self.attn = Attention()
            self.up, self.down = nn.Linear(a.dim, 4 * a.dim), nn.Linear(4 * a.dim, a.dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.norm1(x))
            return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(a.vocab, a.dim)
            self.layers = nn.ModuleList(Block() for _ in range(a.layers))
            self.norm = nn.LayerNorm(a.dim)
            self.head = nn.Linear(a.dim, a.vocab, bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for block in self.layers:
                x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    return Decoder()


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


@contextlib.contextmanager
def saved_tensors(into: dict):
    """Record the bytes of every tensor autograd saves for backward (each storage once; a
    DTensor's local shard), by ``(data_ptr, nbytes)`` into ``into``."""
    import torch

    def pack(t):
        local = t.to_local() if hasattr(t, "to_local") else t
        if isinstance(t, torch.nn.Parameter) or local.device.type == "meta":
            return t  # weights, not activations
        try:
            storage = local.untyped_storage()
            into[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        except RuntimeError:  # FSDP's gathered parameters: their storage is freed after forward
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import treadle

    torch.set_num_threads(1)
    spec = dict(CONFIGS[a.config])
    if a.device == "cpu":
        spec["backend"] = "gloo"
    strategy = treadle.build_strategy(spec, seed=0)
    model, ow = strategy.prepare(build_model(a), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))
    device = strategy.device
    per_rank = a.global_batch // strategy.dp_size
    gen = torch.Generator().manual_seed(strategy.dp_rank)  # the ranks of one tp group: the same tokens
    batches = [torch.randint(0, a.vocab, (per_rank, a.seq + 1), generator=gen).to(device) for _ in range(4)]
    if strategy.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel
        context = loss_parallel
    else:
        context = contextlib.nullcontext
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    saved: dict[tuple[int, int], int] = {}
    times = []
    for i in range(a.warmup + a.steps):
        ids = batches[i % len(batches)]
        dist.barrier()
        sync()
        start = time.perf_counter()
        with context(), (saved_tensors(saved) if i == 0 else contextlib.nullcontext()):
            logits = model(ids[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        with context():
            if i == 0:  # gradients exist between backward and the step: measured once
                loss.backward()
                grads = local_bytes(p.grad for p in model.parameters())
                ow.step()
                ow.zero_grad()
            else:
                ow.update_params(loss)
        sync()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    params = local_bytes(model.parameters())
    optim = local_bytes(v for st in ow.optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    mine = {"params": params, "grads": grads, "optim": optim, "activations": sum(saved.values()), "times": times}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if strategy.rank == 0:
        slowest = [max(r["times"][i] for r in everyone) for i in range(len(times))]
        out = {k: max(r[k] for r in everyone) for k in ("params", "grads", "optim", "activations")}
        out["times"] = slowest
        print("RESULT " + json.dumps(out), flush=True)
    # treadle's shutdown, not torch's destroy_process_group alone: the DDP model still holds
    # the group, and the last reference dropped at exit would join gloo's threads holding the GIL
    from treadle.distributed import comm

    comm.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: str, a: argparse.Namespace, argv: list[str]) -> dict:
    port = str(free_port())
    procs = []
    for rank in range(a.nproc):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(a.nproc), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(a.nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        if a.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        log = tempfile.TemporaryFile("w+")  # a file, not a pipe: no rank blocks on a full pipe
        procs.append((subprocess.Popen([sys.executable, __file__, *argv, "--worker", config], env=env, stdout=log,
                                       stderr=subprocess.STDOUT, text=True), log))
    deadline = time.monotonic() + 1800
    while any(p.poll() is None for p, _ in procs):
        failed = [(p, log) for p, log in procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:  # one rank failed (or hangs): the others would wait forever
            for p, _ in procs:
                p.kill()
            p, log = failed[0] if failed else procs[0]
            log.seek(0)
            raise SystemExit(f"{config}: a rank exited {p.returncode}:\n{log.read()[-3000:]}")
        time.sleep(0.2)
    outs = []
    for p, log in procs:
        log.seek(0)
        outs.append(log.read())
        if p.returncode:
            raise SystemExit(f"{config}: a rank exited {p.returncode}:\n{outs[-1][-3000:]}")
    line = next(x for x in outs[0].splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        a.config = a.worker
        worker(a)
        return
    argv = [x for x in sys.argv[1:]]
    mib = 1 << 20
    print(f"decoder: {a.layers} layers, {a.dim} wide, {a.heads} heads, vocab {a.vocab}, seq {a.seq}, global batch "
          f"{a.global_batch}; AdamW; {a.nproc} processes on {a.device} "
          f"({'gloo, one thread each' if a.device == 'cpu' else 'nccl'}); {a.steps} steps timed after {a.warmup}\n")
    print("| configuration | parameters MiB/rank | gradients MiB/rank | optimizer MiB/rank | total MiB/rank "
          "| saved activations MiB/rank | ms/step (IQR) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for config in a.configs.split(","):
        r = launch(config, a, argv)
        ms = sorted(t * 1000 for t in r["times"])
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0], ms[0], ms[0]]
        total = r["params"] + r["grads"] + r["optim"]
        print(f"| {config} | {r['params'] / mib:.2f} | {r['grads'] / mib:.2f} | {r['optim'] / mib:.2f} | "
              f"{total / mib:.2f} | {r['activations'] / mib:.1f} | {statistics.median(ms):.0f} ({q[0]:.0f} to "
              f"{q[2]:.0f}) |", flush=True)


if __name__ == "__main__":
    main()
