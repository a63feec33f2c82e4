"""A big pretrained model through each door by which its spec reaches treadle, measured per
process (tests/config/test_model_doors.py: a config file, the command line's ``--set``,
``treadle validate``; tests/strategies/test_model_doors_api.py: the Trainer from Python, a
hand-written loop on the Strategy API).

A door that builds the model on the meta device under FSDP leaves each of 2 processes its
half and a few MiB above the same run of a tiny model when the run starts (the model built,
sharded and filled, the optimizer built); one that builds it whole peaks at least the whole
model above it. tests/ is on the ranks' ``PYTHONPATH``: a config file names the classes
below as ``big_model_support.Tokens`` and ``big_model_support.PeakAtStart``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch.utils.data import Dataset

import treadle

MIB = 2**20
#: Below every saved model's vocabulary: the tiny one's.
VOCAB = 1000


def save_llama(path: Path, hidden: int, layers: int, vocab: int) -> int:
    """A Llama-style model saved with save_pretrained; its size in bytes."""
    import transformers as hf

    torch.manual_seed(0)
    cfg = hf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=32,
                         tie_word_embeddings=False)
    model = hf.LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def save_models(root: Path) -> int:
    """``root/big`` (about 79 MiB in float32: far above the noise of a process's peak) and
    ``root/tiny`` (the baseline run's); the big one's size in bytes."""
    size = save_llama(root / "big", hidden=512, layers=4, vocab=8000)
    save_llama(root / "tiny", hidden=64, layers=1, vocab=VOCAB)
    return size


class Tokens(Dataset):
    """``n`` sequences of ``seq`` token ids below ``vocab``, each its own label."""

    def __init__(self, n: int = 8, vocab: int = VOCAB, seq: int = 8) -> None:
        self.n, self.vocab, self.seq = n, vocab, seq

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = (torch.arange(self.seq) * 7 + i * 13) % self.vocab
        return {"input_ids": x, "labels": x}


def peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM: not inherited from its parent)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class PeakAtStart(treadle.Hook):
    """The process's peak resident memory at ``before_run`` (of fit, validate or test: the
    model built, sharded and filled, the optimizer built): kept as ``peak`` and, with
    ``out``, written as ``{"rank": r, "peak": bytes}`` to ``<out>/peak.rank<r>.json``."""

    def __init__(self, out: str | None = None) -> None:
        self.out, self.peak = out, None

    def before_run(self, trainer) -> None:
        self.peak = peak_rss()
        if self.out is not None:
            rank = trainer.strategy.rank
            with open(os.path.join(self.out, f"peak.rank{rank}.json"), "w") as f:
                json.dump({"rank": rank, "peak": self.peak}, f)


def written_peaks(out: Path, nproc: int = 2) -> list[int]:
    """Each rank's peak that :class:`PeakAtStart` wrote to ``out``."""
    return [json.loads((out / f"peak.rank{r}.json").read_text())["peak"] for r in range(nproc)]


def assert_never_whole(big: list[int], tiny: list[int], size: int) -> None:
    """Each rank's peak with the big model (``size`` bytes) against the same run's with the
    tiny one: built whole, a process peaks at least the whole model above it; on the meta
    device, its half and a few MiB (the largest tensor read at once, buffers): well under
    3/4 of the model."""
    above = [(b - t) / MIB for b, t in zip(big, tiny)]
    assert all(a < 0.75 * size / MIB for a in above), (
        f"each rank's peak above the tiny run {[round(a, 1) for a in above]} MiB; its share {size / 2 / MIB:.1f} "
        f"MiB, the whole model {size / MIB:.1f} MiB")
