"""Tiny models and in-memory data shared by the tests (tests/ is on sys.path)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset, get_worker_info

from treadle.compat import fsdp_cpu_problem, reshard_problem
from treadle.strategies.base import move_to, pick_device

#: The device a one-process Trainer with ``strategy="auto"`` trains on: CUDA where a GPU
#: is present, else the CPU. A reference that a test compares with a run is built here
#: (the same ops on the same device give the same bits), so the suite holds on both.
DEVICE = pick_device()

#: What treadle adds to an Adam, AdamW or SGD it builds from a config dict on CUDA
#: (treadle/optim/builder.py): a hand-written reference passes it too, as fused and
#: foreach kernels need not give the same bits.
FUSED = {"fused": True} if DEVICE.type == "cuda" else {}

#: ``strategy=ON_CPU`` pins a run to the CPU on purpose: for a test about something only
#: the CPU path shows (its messages, its host reads), which a GPU machine must still run.
ON_CPU = {"type": "single", "device": "cpu"}

#: Marks a test of a CUDA-only path: it runs where CUDA is, and is skipped elsewhere.
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

#: Marks for tests of FSDP on several CPU processes (gloo) and of loading a sharded
#: checkpoint onto another number of processes, which older torch releases cannot do right
#: (treadle/compat.py says which, and treadle refuses them there): skipped, with compat's reason.
fsdp_on_cpu = pytest.mark.skipif(fsdp_cpu_problem(False) is not None, reason=str(fsdp_cpu_problem(False)))
fsdp_mixed_on_cpu = pytest.mark.skipif(fsdp_cpu_problem(True) is not None, reason=str(fsdp_cpu_problem(True)))
hsdp_on_cpu = pytest.mark.skipif(fsdp_cpu_problem(False, replicas=True) is not None,
                                 reason=str(fsdp_cpu_problem(False, replicas=True)))
reshards = pytest.mark.skipif(reshard_problem(1, 2) is not None, reason=str(reshard_problem(1, 2)))


def to_device(obj: Any) -> Any:
    """``obj`` (a tensor, a module, or tensors nested in tuples, lists and dicts) on :data:`DEVICE`."""
    if isinstance(obj, nn.Module):
        return obj.to(DEVICE)
    return move_to(obj, DEVICE)


def make_data(n: int = 32, dim: int = 6, classes: int = 3, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(x, y)


class SizedData(TensorDataset):
    """``make_data``'s samples with an image size per item, read as MMEngine datasets give it
    (``get_data_info(i)``: ``width`` and ``height``): portrait for about a third of them."""

    def __init__(self, n: int = 32, dim: int = 6, classes: int = 3, seed: int = 0) -> None:
        base = make_data(n, dim, classes, seed)
        super().__init__(*base.tensors)
        g = torch.Generator().manual_seed(seed + 1)
        self.portrait = (torch.rand(n, generator=g) < 0.35).tolist()

    def get_data_info(self, index: int) -> dict[str, int]:
        return {"width": 480, "height": 640} if self.portrait[index] else {"width": 640, "height": 480}


def make_sized_data(n: int = 32, dim: int = 6, classes: int = 3, seed: int = 0) -> SizedData:
    """A :class:`SizedData` (a config's ``dataset: {type: support.make_sized_data, n: 8}``)."""
    return SizedData(n, dim, classes, seed)


class Count:
    """A counter for :class:`Stream` read in the main process (Hugging Face's pickles its
    generator to name it, which a shared ``multiprocessing.Value`` refuses)."""

    def __init__(self) -> None:
        self.value = 0

    def get_lock(self):
        return contextlib.nullcontext()


class Stream(IterableDataset):
    """``make_data(n)``'s samples as a stream, split between DataLoader workers; ``read``
    counts the samples produced (a ``multiprocessing.Value``, which the workers' copies
    count into, or a :class:`Count`)."""

    def __init__(self, read: Any = None, n: int = 30) -> None:
        self.data, self.read = make_data(n), Count() if read is None else read

    def _mine(self) -> list[int]:
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        return list(range(start, len(self.data), step))

    def _produce(self, i: int):
        with self.read.get_lock():
            self.read.value += 1
        return self.data[i]

    def __iter__(self):
        for i in self._mine():
            yield self._produce(i)


class StatefulStream(Stream):
    """The same stream with its own position: samples of its share taken so far."""

    def __init__(self, read: Any = None, n: int = 30) -> None:
        super().__init__(read, n)
        self.taken, self._start = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = int(state["taken"])

    def __iter__(self):
        self.taken, start, self._start = self._start, self._start, 0
        for i in self._mine()[start:]:
            sample = self._produce(i)
            self.taken += 1
            yield sample


class TinyNet(nn.Module):
    def __init__(self, dim: int = 6, classes: int = 3, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 16)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class TinyParts(nn.Module):
    """A TinyNet per name (a GAN config's ``generator`` and ``discriminator``...), with an
    MMEngine-style ``train_step(data, optim_wrapper)``: each part is stepped by the
    optimizer of its name on the batch's classification loss; evaluation averages them."""

    def __init__(self, parts: tuple[str, ...] | list[str] = ("generator", "discriminator")) -> None:
        super().__init__()
        self.parts = list(parts)
        for name in self.parts:
            self.add_module(name, TinyNet())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(getattr(self, p)(x) for p in self.parts) / len(self.parts)

    def train_step(self, data, optim_wrapper):
        x, y = data
        logs = {}
        for name in self.parts:
            wrapper = optim_wrapper[name] if isinstance(optim_wrapper, dict) else optim_wrapper
            part = getattr(self, name)
            with wrapper.optim_context(part):
                loss = nn.functional.cross_entropy(part(x), y)
            wrapper.update_params(loss)
            logs[f"loss_{name}"] = loss.detach()
        return logs


class TinyAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a share of them.
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = TinyAttention(dim, heads)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    """A decoder-only transformer of ``layers`` blocks: token ids (B, T) -> logits (B, T, vocab)."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


#: TinyLM's tensor-parallel plan: attention and MLP split Megatron-style, the embedding on
#: the vocabulary (``head``'s style is the caller's: "colwise_rep", or "loss_parallel").
TINY_LM_PLAN = {"embed": "embedding_rowwise", "layers.*.attn.q_proj": "colwise", "layers.*.attn.k_proj": "colwise",
                "layers.*.attn.v_proj": "colwise", "layers.*.attn.o_proj": "rowwise", "layers.*.up": "colwise",
                "layers.*.down": "rowwise"}


def tiny_llama() -> nn.Module:
    """A 2-layer Llama from transformers (no download), with grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def tiny_qwen3() -> nn.Module:
    """A 2-layer Qwen3 from transformers: Llama's layout plus per-head norms of q and k
    (``q_norm``/``k_norm``), whose tensor-parallel style sums their gradients over the group."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=16,
                         tie_word_embeddings=False)
    return Qwen3ForCausalLM(config)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of (B, T, V) logits against (B, T) ids."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_tokens(n: int = 32, length: int = 8, vocab: int = 64, seed: int = 0) -> TensorDataset:
    """``n`` sequences as (ids, next ids) pairs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length + 1), generator=g)
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def make_token_batches(n: int = 32, length: int = 8, vocab: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` sequences as a Hugging Face causal LM takes them: ``input_ids`` and ``labels``
    (the same ids; the model shifts them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def labelled_texts(n: int = 16, length: int = 8, vocab: int = 40, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` tokenized "texts" as a Hugging Face classifier takes them: ``input_ids``,
    ``attention_mask`` and ``labels`` (1 when the first token is even)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    return [{"input_ids": row, "attention_mask": torch.ones(length, dtype=torch.long),
             "labels": torch.tensor(int(row[0]) % 2)} for row in ids]


def count_host_reads(monkeypatch) -> dict[str, int]:
    """Count ``Tensor.item`` and ``Tensor.tolist`` calls (the ways code reads device values)."""
    calls = {"item": 0, "tolist": 0}
    for name in calls:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _name=name, _orig=original, **k):
            calls[_name] += 1
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return calls


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, args: list[str], nproc: int = 2, timeout: float = 120.0,
              env: dict[str, str] | None = None, signal_rank: tuple[int, int, float] | None = None):
    """Run ``python script args`` as ``nproc`` processes with torchrun's environment
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); returns [(returncode, output)].

    The processes see no GPU (CUDA_VISIBLE_DEVICES="", unless ``env`` says otherwise):
    distributed tests run 2 processes on gloo, and a 1-GPU machine cannot give 2 nccl
    ranks a GPU each. ``env`` adds to (or overrides) the environment.
    A hang fails the test after ``timeout`` seconds instead of blocking the suite.
    """
    import os
    import subprocess
    import sys

    port = str(free_port())
    procs = []
    for rank in range(nproc):
        penv = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
        procs.append(subprocess.Popen([sys.executable, script, *args], env=penv, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return wait_all(procs, timeout)


def wait_all(procs, timeout: float = 300.0) -> list[tuple[int, str]]:
    """[(returncode, output)] of each subprocess (output piped, text); any still running
    after ``timeout`` seconds (a hang) is killed instead of blocking the suite."""
    out = []
    try:
        for p in procs:
            stdout, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def assert_state_equal(a: Any, b: Any, path: str = "") -> None:
    """Two (nested) states equal bit for bit: tensors exactly, containers entry by entry,
    other leaves by ==; the failing entry's path in the message."""
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=path)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_state_equal(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_state_equal(x, y, f"{path}/{i}")
    else:
        assert a == b, path


def load_module_file(name: str, path: Any, stubs: dict[str, Any]) -> Any:
    """The module at ``path`` (one file of an installed package), executed as ``name`` while
    ``stubs`` stand in for the modules it imports (``{module name: module}``); ``sys.modules``
    is left as it was. For OpenMMLab's classes, whose packages' ``__init__`` needs mmcv's
    compiled ops that the one file does not."""
    import importlib.util
    import sys

    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


def checkpointed_modules(model: nn.Module) -> list[str]:
    """The names of ``model``'s submodules that activation checkpointing wraps, in module order."""
    from treadle.strategies.activation_checkpointing import is_checkpointed

    return [name for name, m in model.named_modules() if is_checkpointed(m)]
