"""What activation checkpointing saves, and what it costs, for a small decoder-only transformer.

The model (:class:`TinyDecoder`): token and position embeddings, ``--layers`` pre-norm
blocks (LayerNorm, causal self-attention through ``F.scaled_dot_product_attention``,
LayerNorm, a 4x GELU MLP, dropout ``--dropout``, residual additions), a final LayerNorm
and a linear head; cross-entropy over next tokens. Three copies with equal weights: no
checkpointing, ``"full"`` and ``"selective"`` (treadle/strategies/activation_checkpointing.py,
the blocks found by its rule: the ``blocks`` ModuleList).

Memory, one forward and backward of a ``--batch`` x ``--seq`` batch of random tokens:

* saved bytes: the tensors autograd keeps for backward, as
  ``torch.autograd.graph.saved_tensors_hooks`` sees them during the forward (each storage
  once; the model's parameters left out). With ``full`` that is what stays outside the
  checkpointed blocks plus each block's inputs (checkpointing saves them through the
  same hooks). ``selective`` keeps its matmul outputs in its own cache, which these hooks
  do not see: its figure is marked as a lower bound, and the next one is the measure;
* peak bytes: the most bytes held at once by tensors that the step's ops created
  (activations, temporaries, gradients), counted by a ``TorchDispatchMode`` that records
  every op's output storages and drops them when they are freed: a CPU stand-in for
  ``torch.cuda.max_memory_allocated``;
* on CUDA (``--device cuda``), also ``torch.cuda.max_memory_allocated`` during the step
  minus what was allocated before it.

Time: whole training steps (forward, backward, AdamW step) of each copy, ``--steps`` per
round, the copies taking turns in each round (the order rotated), ``--warmup`` rounds
left out, then ``--rounds``; the median time per step of each and its ratio to no
checkpointing. ``--clock cpu`` (the default on the CPU) times the CPU the process used
(``time.process_time``), which other processes on a shared machine disturb far less than
the wall clock; ``--clock wall`` (the default on CUDA, after a device synchronization)
the elapsed time.

    python benchmarks/activation_checkpointing.py [--layers 8] [--width 256] [--heads 4] [--seq 128]
        [--batch 8] [--vocab 1024] [--dropout 0.1] [--rounds 5] [--warmup 1] [--steps 3] [--threads 1]
        [--device cpu|cuda] [--clock cpu|wall]

About a minute on one CPU thread with the defaults.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treadle.strategies.activation_checkpointing import apply_activation_checkpointing

MODES = ("none", "full", "selective")


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention and a 4x GELU MLP, each residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyDecoder(nn.Module):
    """A GPT-style decoder-only transformer; ``forward(tokens)`` returns the next-token loss."""

    def __init__(self, vocab: int = 1024, width: int = 256, layers: int = 8, heads: int = 4, seq: int = 256,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.tok(tokens[:, :-1]) + self.pos(torch.arange(tokens.shape[1] - 1, device=tokens.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def models(mode_names: tuple[str, ...] = MODES, **kwargs: Any) -> dict[str, TinyDecoder]:
    """One :class:`TinyDecoder` per mode, equal weights, each checkpointed as its mode says."""
    torch.manual_seed(0)
    base = TinyDecoder(**kwargs)
    out = {}
    for mode in mode_names:
        model = copy.deepcopy(base)
        if mode != "none":
            apply_activation_checkpointing(model, mode)
        out[mode] = model
    return out


def saved_tensor_bytes(model: nn.Module, tokens: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves during ``model(tokens)`` (each storage once;
    parameters left out), through ``saved_tensors_hooks``; then runs backward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(tokens)
    loss.backward()
    return sum(seen.values())


def _live_tracker(exclude: set[int]) -> Any:
    """A ``TorchDispatchMode`` that keeps the peak of bytes held by the storages of its
    ops' outputs (each storage once, from its first output until it is freed), leaving
    out the storages whose ``data_ptr`` is in ``exclude`` (the parameters: views of them)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.refs: dict[int, tuple[Any, int]] = {}
            self.live = 0
            self.peak = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for key, (ref, size) in list(self.refs.items()):  # first: a freed storage's address may be reused
                if ref.expired():
                    del self.refs[key]
                    self.live -= size
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    storage = t.untyped_storage()
                    key, size = storage.data_ptr(), storage.nbytes()
                    if size and key not in self.refs and key not in exclude:
                        self.refs[key] = (StorageWeakRef(storage), size)
                        self.live += size
            self.peak = max(self.peak, self.live)
            return out

    return LiveBytes()


def peak_live_bytes(model: nn.Module, tokens: torch.Tensor) -> int:
    """The most bytes held at once by tensors that a forward and backward of ``model``
    created (a CPU stand-in for ``torch.cuda.max_memory_allocated``)."""
    tracker = _live_tracker({p.untyped_storage().data_ptr() for p in model.parameters()})
    with tracker:
        model(tokens).backward()
    return tracker.peak


def cuda_peak_bytes(model: nn.Module, tokens: torch.Tensor) -> int:
    """``torch.cuda.max_memory_allocated`` during a forward and backward, less what was
    allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model(tokens).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure_memory(copies: dict[str, nn.Module], tokens: torch.Tensor) -> dict[str, dict[str, int]]:
    """Each copy's saved bytes, peak live bytes and (on CUDA) peak allocated bytes."""
    out: dict[str, dict[str, int]] = {}
    for mode, model in copies.items():
        row: dict[str, int] = {}
        for name, fn in (("saved", saved_tensor_bytes), ("peak", peak_live_bytes),
                         *((("cuda_peak", cuda_peak_bytes),) if tokens.device.type == "cuda" else ())):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            row[name] = fn(model, tokens)
        model.zero_grad(set_to_none=True)
        out[mode] = row
    return out


def time_steps(copies: dict[str, nn.Module], tokens: torch.Tensor, *, rounds: int, warmup: int,
               steps: int, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per training step (forward, backward, AdamW) of each copy, the
    copies taking turns each round (order rotated), read on ``clock``."""
    optimizers = {m: torch.optim.AdamW(model.parameters(), lr=1e-4) for m, model in copies.items()}
    sync: Callable[[], None] = torch.cuda.synchronize if tokens.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {m: [] for m in copies}
    order = list(copies)
    for r in range(warmup + rounds):
        for mode in order[r % len(order):] + order[:r % len(order)]:
            model, opt = copies[mode], optimizers[mode]
            sync()
            start = clock()
            for _ in range(steps):
                model(tokens).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            sync()
            if r >= warmup:
                times[mode].append((clock() - start) / steps)
    return {m: statistics.median(t) for m, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clock", choices=("cpu", "wall"), default=None,
                        help="process CPU time (default on the CPU) or wall time (default on CUDA)")
    args = parser.parse_args(argv)
    clock_name = args.clock or ("wall" if args.device.startswith("cuda") else "cpu")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    copies = {m: model.to(device) for m, model in models(vocab=args.vocab, width=args.width, layers=args.layers,
                                                          heads=args.heads, seq=args.seq + 1,
                                                          dropout=args.dropout).items()}
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    params = sum(p.numel() for p in copies["none"].parameters())
    print(f"TinyDecoder: {args.layers} layers, width {args.width}, {args.heads} heads, seq {args.seq}, batch "
          f"{args.batch}, vocab {args.vocab}, {params / 1e6:.2f} M parameters; torch {torch.__version__}, "
          f"{device}, {torch.get_num_threads()} threads, {clock_name} clock")
    memory = measure_memory(copies, tokens)
    seconds = time_steps(copies, tokens, rounds=args.rounds, warmup=args.warmup, steps=args.steps,
                         clock=time.process_time if clock_name == "cpu" else time.perf_counter)
    cuda = device.type == "cuda"
    head = "| mode | saved bytes (hooks) | peak live bytes |" + (" cuda max_memory_allocated |" if cuda else "")
    print("\n" + head + " ms/step | time vs none |")
    print("|" + " --- |" * (head.count("|") + 1))
    base = memory["none"]
    for mode in copies:
        row = memory[mode]
        saved = f"{row['saved'] / 2**20:.1f} MiB ({row['saved'] / base['saved']:.2f}x)"
        if mode == "selective":
            saved += ", lower bound"
        cells = [mode, saved, f"{row['peak'] / 2**20:.1f} MiB ({row['peak'] / base['peak']:.2f}x)"]
        if cuda:
            cells.append(f"{row['cuda_peak'] / 2**20:.1f} MiB ({row['cuda_peak'] / base['cuda_peak']:.2f}x)")
        cells += [f"{seconds[mode] * 1e3:.1f}", f"{seconds[mode] / seconds['none']:.2f}x"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
