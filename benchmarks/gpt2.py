"""GPT-2 small (124M) training throughput: treadle against a hand-written loop.

Both train the same decoder (12 layers, 768 wide, 12 heads, 1024 tokens, vocabulary
50257, tied embeddings; written below with torch.nn and
``F.scaled_dot_product_attention``) on synthetic tokens with the same settings: bf16
autocast, AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1; fused on CUDA, as
treadle picks by default), gradient clipping at 1.0, batches from pinned host memory
moved with ``non_blocking``. treadle runs with its default hooks (timer, logger writing
log.jsonl/log.csv/TensorBoard every ``--log-interval`` iterations, NaN guard, final
checkpoint). Runs alternate (hand, treadle, treadle, hand, ...); each times
``--steps`` iterations after ``--warmup`` ones, between two device synchronizations.
Printed: tokens/s of both (median over ``--rounds``), their ratio, and the model FLOPs
utilisation MFU = 6 * N * tokens/s / peak (N: parameters; the attention term is left
out, as in the 6N rule), with the peak from ``--peak-tflops`` or the GPU's name.

    python benchmarks/gpt2.py                     # on a GPU
    python benchmarks/gpt2.py --compile           # both loops torch.compile the model
    python benchmarks/gpt2.py --tiny              # a tiny config on the CPU: a smoke test in seconds
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# Dense bf16 tensor-core peaks in TFLOP/s (no sparsity), by a substring of the device name.
PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0),
               ("A10G", 70.0), ("L4", 121.0), ("4090", 165.0), ("3090", 71.0), ("V100", 125.0))


@dataclass
class Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    seq: int = 1024
    vocab: int = 50257


# -- the model -------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.n_head = c.n_head
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.qkv = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.proj = nn.Linear(c.n_embd, c.n_embd)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.fc = nn.Linear(c.n_embd, 4 * c.n_embd)
        self.fc_proj = nn.Linear(4 * c.n_embd, c.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2: token and position embeddings, pre-norm blocks, a head tied to the token embedding."""

    def __init__(self, c: Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.n_embd)
        self.wpe = nn.Embedding(c.seq, c.n_embd)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2's init; residual projections scaled by depth
                std = 0.02 / math.sqrt(2 * c.n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# -- the runs --------------------------------------------------------------------------
def make_batches(c: Config, batch: int, n: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, c.vocab, (batch, c.seq + 1), generator=g)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        out.append((x, y))
    return out


def build(c: Config, device: torch.device, compile_model: bool) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = GPT(c).to(device)
    return model, (torch.compile(model) if compile_model else model)


def optim_cfg(device: torch.device) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(type="AdamW", lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if device.type == "cuda":
        cfg["fused"] = True  # what treadle picks by default on CUDA; stated for the hand loop
    return cfg


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_hand(args: argparse.Namespace, c: Config, device: torch.device, batches: list) -> float:
    """Seconds for ``args.steps`` iterations after ``args.warmup``."""
    module, model = build(c, device, args.compile)
    cfg = dict(optim_cfg(device))
    opt = getattr(torch.optim, cfg.pop("type"))(module.parameters(), **cfg)
    dtype = {"bf16": torch.bfloat16, "32": None}[args.precision]
    start = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync(device)
            start = time.perf_counter()
        x, y = batches[i % len(batches)]
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = lm_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(device)
    return time.perf_counter() - start


def run_treadle(args: argparse.Namespace, c: Config, device: torch.device, batches: list) -> float:
    import logging

    import treadle

    marks: dict[str, float] = {}

    class Clock(treadle.Hook):
        """Times the steady-state iterations between two device synchronizations."""
        priority = "HIGHEST"

        def before_train_iter(self, trainer: Any, batch: Any) -> None:
            if trainer.state.iter == args.warmup:
                sync(device)
                marks["start"] = time.perf_counter()

    class Stop(treadle.Hook):
        priority = "LOWEST"

        def after_train_iter(self, trainer: Any, batch: Any, outputs: Any) -> None:
            if trainer.state.iter + 1 == args.warmup + args.steps:
                sync(device)
                marks["end"] = time.perf_counter()

    logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
    torch.manual_seed(0)
    model = GPT(c)
    with tempfile.TemporaryDirectory() as work_dir:
        trainer = treadle.Trainer(model, work_dir=work_dir, train_dataloader=batches, loss_fn=lm_loss,
                                  optimizer=optim_cfg(device), max_iters=args.warmup + args.steps,
                                  precision=args.precision, clip_grad=dict(max_norm=1.0), compile=args.compile,
                                  log_interval=args.log_interval, hooks=[Clock(), Stop()], strategy="single",
                                  progress=False)
        trainer.fit()
    return marks["end"] - marks["start"]


def peak_tflops(args: argparse.Namespace, device: torch.device) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS if key in name), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--steps", type=int, default=50, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=15, help="untimed iterations first (allocator, autotuning, compile)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each loop, alternating")
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--precision", choices=("bf16", "32"), default="bf16")
    p.add_argument("--compile", action="store_true", help="torch.compile the model in both loops")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense peak for MFU (default by GPU name: " +
                        ", ".join(f"{k} {v:g}" for k, v in PEAK_TFLOPS) + ")")
    p.add_argument("--tiny", action="store_true", help="a tiny model on the CPU: a smoke test that runs in seconds")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    args = p.parse_args()

    c = Config()
    if args.tiny:
        c = Config(n_layer=2, n_head=4, n_embd=64, seq=64, vocab=512)
        args.batch, args.steps, args.warmup = min(args.batch, 4), min(args.steps, 30), min(args.warmup, 5)
        args.log_interval = min(args.log_interval, 5)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        # An index: torch 2.11 refuses set_device(torch.device("cuda")) (no index given).
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device.index)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    batches = make_batches(c, args.batch, 8, device)
    n_params = sum(p.numel() for p in GPT(c).parameters())  # the tied head counted once
    tokens = args.batch * c.seq * args.steps
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"GPT-2 {'tiny' if args.tiny else 'small'}: {n_params / 1e6:.1f}M parameters, {c.n_layer} layers, "
          f"{c.n_embd} wide, {c.n_head} heads, seq {c.seq}, vocab {c.vocab}; batch {args.batch} "
          f"({args.batch * c.seq} tokens/step), {args.precision}, compile={args.compile}, on {where}, "
          f"torch {torch.__version__}")
    times: dict[str, list[float]] = {"hand": [], "treadle": []}
    runs = {"hand": run_hand, "treadle": run_treadle}
    for r in range(args.rounds):
        for name in (("hand", "treadle") if r % 2 == 0 else ("treadle", "hand")):
            seconds = runs[name](args, c, device, batches)
            times[name].append(seconds)
            print(f"  round {r + 1} {name:8s} {tokens / seconds:12,.0f} tokens/s")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    peak = peak_tflops(args, device)
    rate = {name: tokens / statistics.median(ts) for name, ts in times.items()}
    for name in ("hand", "treadle"):
        mfu = f"MFU {6 * n_params * rate[name] / (peak * 1e12):.1%}" if peak else "MFU n/a (give --peak-tflops)"
        print(f"{name:8s} {rate[name]:12,.0f} tokens/s (median of {args.rounds})  {mfu}")
    print(f"treadle/hand throughput ratio {rate['treadle'] / rate['hand']:.4f}"
          + (f"  (peak {peak:g} TFLOP/s)" if peak else ""))


if __name__ == "__main__":
    main()
