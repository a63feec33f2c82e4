"""Peak resident memory per rank when a pretrained model is built whole on every process,
against built on the meta device and read shard by shard; what the first step's peak holds,
tensor by tensor; and the same step written by hand with torch's FSDP2.

    python benchmarks/model_memory.py [--nproc 1 2 4] [--hidden 768] [--layers 8] [--vocab 32000]

A Llama-style model (``--hidden``, ``--layers``, ``--vocab``; the default about 400 MiB in
float32) is saved with ``save_pretrained`` into a temporary folder, beside a tiny one. For
each number of processes, fresh processes of this script (torchrun's variables, gloo, one
intra-op thread each) run ``treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=DIR),
strategy=...)`` and read the process's peak resident memory (Linux's ``VmHWM``) in a
``before_train`` hook, when the model is placed and sharded and its optimizer built, and after
the first step (which has read every weight: ``from_pretrained`` maps the file and reads a
page when it is first used):

* ``whole``: ``empty_init=False``, every process builds the model with ``from_pretrained``,
  then FSDP shards it (what treadle did before building on the meta device);
* ``meta``: the default under several processes (``empty_init=True`` on one): the model
  built on the meta device, sharded there, each process reading its shards of the
  safetensors file;
* ``hand``: the same step written with torch alone, as a user of FSDP2 writes it: the model
  built on the meta device, ``parallelize_module`` by the model's own plan on ``tp``,
  ``fully_shard`` on every ``LlamaDecoderLayer`` then on the model (torch's defaults), each
  process reading its shards with ``safetensors``, ``torch.optim.SGD``, ``loss.backward()``,
  ``step()``, ``zero_grad()`` (one process: ``from_pretrained``, no FSDP). Its own tiny
  model is its baseline.

The strategy is FSDP over all processes (``dp_shard=N``), and on 4 also ``2 x tp 2``
(``tp_plan="auto"``); the optimizer SGD without momentum (no state of its own). Each figure
is the largest rank's peak above the same run's with the tiny model (what Python, torch
and transformers take), in MiB, beside the model's size and a process's share of it.

The second table accounts for the peak after the first step of the meta build through the
Trainer and of the hand loop (the figures of the first table), tensor by tensor. Each is run
once more under torch's profiler (``profile_memory``: every CPU allocation and free during
the step, with the ops and FSDP's ``record_function`` ranges around it), which leaves the
tensors as they are. At the moment the step's live tensors peak, on the rank whose resident
peak is the largest: the parameters (this process's shards, allocated before the step), the
gradients (allocations that end up as the parameters' ``.grad``), the optimizer state,
FSDP's gathered parameters (all-gather output and unsharded parameters), the gradients
autograd computed that FSDP has not reduced yet (unsharded), FSDP's reduce-scatter input
buffer, gloo's copies (allocations inside a gloo collective: its all-gather's flat output,
the clone its reduce-scatter all-reduces), other tensors (activations, logits,
temporaries); then what the resident peak holds beyond every live tensor (memory freed to
glibc's malloc and not returned to the system, and what is not a tensor); where the live
tensors peak (FSDP's range around the last large allocation before it); and the largest
unit FSDP gathers (its largest all-gather output). Prints two markdown tables.

The processes inherit the environment: ``MALLOC_MMAP_THRESHOLD_=1048576`` (glibc) measures
the same runs with every block of 1 MiB or more given back to the system when it is freed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
CATEGORIES = ("params", "grads", "optimizer", "gathered", "unsharded_grads", "reduce_scatter", "gloo", "other")


def peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux's VmHWM: unlike ``ru_maxrss``,
    not inherited from the process that started this one)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _storages(tensors: Any) -> dict[int, int]:
    """Bytes of each storage behind ``tensors`` (a DTensor's local shard), by address."""
    out = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        out[storage.data_ptr()] = storage.nbytes()
    return out


class Account:
    """The step's live tensors at their peak, from torch's profiler (see the module docstring).
    ``start`` before the step, ``grads`` after backward, ``stop`` after the step."""

    def __init__(self, on: bool) -> None:
        self.on, self.prof = on, None

    def start(self, model: Any) -> None:
        if not self.on:
            return
        from torch.profiler import ProfilerActivity, profile

        self.params = sum(_storages(model.parameters()).values())
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.prof.__enter__()

    def grads(self, model: Any) -> None:
        if self.on:
            self.grad_ptrs = set(_storages(p.grad for p in model.parameters() if p.grad is not None))

    def stop(self, optimizer: Any) -> dict[str, Any] | None:
        if self.prof is None:
            return None
        self.prof.__exit__(None, None, None)
        import torch

        state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return self._peak(set(_storages(state)))

    def _peak(self, state_ptrs: set[int]) -> dict[str, Any]:
        allocs: list[tuple[int, int, int, list[str]]] = []

        def walk(events: Any, stack: list[str]) -> None:
            for e in events:
                if e.tag.name == "Allocation":
                    f = e.extra_fields
                    allocs.append((e.start_time_ns, f.ptr, f.alloc_size, list(stack)))
                else:
                    stack.append(e.name)
                    walk(e.children, stack)
                    stack.pop()

        walk(self.prof.profiler.kineto_results.experimental_event_tree(), [])
        allocs.sort(key=lambda a: a[0])
        live: dict[int, tuple[int, list[str], int]] = {}
        total = peak = 0
        at_peak: dict[int, tuple[int, list[str], int]] = {}
        largest_gathered = 0
        for time, ptr, size, stack in allocs:
            if size > 0:
                live[ptr] = (size, stack, time)
                if len(stack) > 1 and stack[-1] == "aten::empty" and stack[-2].partition(" (")[0] == "FSDP::all_gather":
                    largest_gathered = max(largest_gathered, size)  # the all-gather output of one unit
            else:
                live.pop(ptr, None)
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        sums = dict.fromkeys(CATEGORIES, 0)
        sums["params"] = self.params
        for ptr, (size, stack, _) in at_peak.items():
            sums[self._category(ptr, stack, state_ptrs)] += size
        # where: the last block of 1 MiB or more allocated before the peak (smaller ones follow it: scalars)
        where = max(((t, s) for size, s, t in at_peak.values() if size >= MIB), default=(0, []))[1]
        return {"sums": sums, "where": _where(where), "largest_gathered": largest_gathered}

    def _category(self, ptr: int, stack: list[str], state_ptrs: set[int]) -> str:
        if ptr in self.grad_ptrs:
            return "grads"
        if ptr in state_ptrs:
            return "optimizer"
        if any(s.startswith(("c10d::", "gloo:")) for s in stack):
            return "gloo"
        if any(s.startswith("FSDP::post_backward_reduce") for s in stack):
            return "reduce_scatter"
        if any(s.startswith("FSDP::all_gather") for s in stack):
            return "gathered"
        if any(s.startswith("autograd::engine::evaluate_function") for s in stack):
            return "unsharded_grads"
        return "other"


def _where(stack: list[str]) -> str:
    """Where an allocation was made, in words: FSDP's innermost range
    (``FSDP::post_backward_reduce (model.layers.3)``: the reduce-scatter of model.layers.3),
    else autograd's node (``backward, MmBackward0``), else the op."""
    fsdp = [s for s in stack if s.startswith("FSDP::")]
    if fsdp:
        name = fsdp[-1]
        unit = name.partition(" (")[2].rstrip(")") or "the root unit"
        for key, words in (("post_backward_reduce", "reduce-scatter"), ("post_backward", "post-backward"),
                           ("all_gather", "all-gather")):
            if key in name:
                return f"{words} of {unit}"
        return name
    autograd = [s for s in stack if s.startswith("autograd::engine::evaluate_function: ")]
    if autograd:
        return f"backward, {autograd[-1].rpartition(' ')[2]}"
    return stack[-1] if stack else "?"


def _treadle_child(folder: str, strategy: str, out: str, account: bool) -> None:
    import torch
    from torch.utils.data import DataLoader
    from transformers import LlamaForCausalLM

    import treadle

    acc = Account(account)

    class Peak(treadle.Hook):
        def before_train(self, trainer) -> None:
            self.before = peak_rss()

        def before_train_iter(self, trainer, batch) -> None:
            acc.start(trainer.model)

        def before_optimizer_step(self, trainer) -> None:
            acc.grads(trainer.model)

        def after_train_iter(self, trainer, batch, outputs) -> None:  # the first step touched every weight
            after = peak_rss()
            result = {"before": self.before, "after": after, "account": acc.stop(trainer.optim_wrapper.optimizer)}
            Path(out, f"rank{trainer.strategy.rank}.json").write_text(json.dumps(result))

    vocab = json.loads(Path(folder, "config.json").read_text())["vocab_size"]
    ids = torch.randint(0, vocab, (8, 8), generator=torch.Generator().manual_seed(0))
    treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=folder), strategy=json.loads(strategy),
                    train_dataloader=DataLoader([{"input_ids": r, "labels": r} for r in ids], batch_size=2),
                    optimizer=dict(type="SGD", lr=0.1), max_iters=1, hooks=[Peak()], progress=False, seed=0).fit()


def _hand_model(folder: str, strategy: dict[str, Any]) -> Any:
    """The model as a user of FSDP2 builds it: on the meta device, split by the model's own
    tensor-parallel plan, ``fully_shard`` on each decoder layer then on the root (torch's
    defaults), each process reading its shards from the safetensors file."""
    import torch
    import torch.distributed as dist
    from safetensors import safe_open
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    world = int(os.environ["WORLD_SIZE"])
    if world == 1:
        return LlamaForCausalLM.from_pretrained(folder)
    dist.init_process_group("gloo")
    tp = strategy.get("tp", 1)
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    config = LlamaConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if tp > 1:
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel,
                  "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
                  "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate())}
        parallelize_module(model, mesh["tp"], {k: styles[v]() for k, v in model.tp_plan.items()})
    layers = [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]
    for m in [*reversed(layers), model]:
        fully_shard(m, mesh=mesh["dp"])
    model.to_empty(device="cpu")
    with safe_open(str(Path(folder, "model.safetensors")), "pt") as f, torch.no_grad():
        for name, p in model.named_parameters():
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            local = p.to_local()
            if local.numel():
                local.copy_(f.get_slice(name)[tuple(slice(o, o + s) for o, s in zip(offset, shape))])
        rotary = model.model.rotary_emb
        for name, buffer in type(rotary)(config=config).named_buffers():
            getattr(rotary, name).copy_(buffer)
    return model


def _hand_child(folder: str, strategy: str, out: str, account: bool) -> None:
    import torch
    import torch.distributed as dist

    acc = Account(account)
    model = _hand_model(folder, json.loads(strategy))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    before = peak_rss()
    acc.start(model)
    model(input_ids=ids, labels=ids).loss.backward()
    acc.grads(model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    after = peak_rss()
    result = {"before": before, "after": after, "account": acc.stop(optimizer)}
    rank = dist.get_rank() if dist.is_initialized() else 0
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(folder: Path, strategy: dict, nproc: int, kind: str = "treadle", account: bool = False) -> dict[str, Any]:
    """The result of the rank whose peak after the first step is the largest, with the
    largest peak before it (bytes)."""
    with tempfile.TemporaryDirectory() as out:
        port = str(_free_port())
        procs = [subprocess.Popen(
            [sys.executable, __file__, "--child", kind, str(folder), json.dumps(strategy), out, str(int(account))],
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                 "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                 "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(nproc)]
        for p in procs:
            output, _ = p.communicate(timeout=1200)
            if p.returncode:
                raise SystemExit(f"a rank failed ({kind}, {strategy}, {nproc} processes):\n{output[-3000:]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]
        largest = max(ranks, key=lambda r: r["after"])
        return {**largest, "before": max(r["before"] for r in ranks)}


def _save(folder: Path, hidden: int, layers: int, vocab: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                                         num_hidden_layers=layers, num_attention_heads=max(4, hidden // 64),
                                         num_key_value_heads=4, tie_word_embeddings=False))
    model.save_pretrained(folder)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _breakdown_row(nproc: int, name: str, loop: str, peak: int, acc: dict[str, Any]) -> str:
    """One row of the second table: ``peak`` (an unprofiled run's, above its tiny run) and
    what it holds, the live tensors from ``acc`` (a profiled run of the same step), in MiB."""
    sums = acc["sums"]
    cells = [f"{round(b / MIB)}" for b in (peak, *(sums[c] for c in CATEGORIES), peak - sum(sums.values()))]
    return (f"| {nproc} | {name} | {loop} | {' | '.join(cells)} | {acc['where']} | "
            f"{acc['largest_gathered'] / MIB:.0f} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, folder, strategy, out, account = sys.argv[2:7]
        (_hand_child if kind == "hand" else _treadle_child)(folder, strategy, out, account == "1")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        size = _save(Path(root, "big"), args.hidden, args.layers, args.vocab)
        _save(Path(root, "tiny"), 64, 1, 256)
        print(f"model: {size / MIB:.0f} MiB (float32), hidden {args.hidden}, {args.layers} layers, "
              f"vocabulary {args.vocab}\n")
        print("| processes | layout | a process's share | whole build: before the first step | after it | "
              "meta build: before the first step | after it | hand-written loop: after the first step | "
              "treadle (meta) - hand |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        breakdown = []
        for nproc in args.nproc:
            layouts = [("FSDP" if nproc > 1 else "one process", dict(type="fsdp", wrap=["LlamaDecoderLayer"]))]
            if nproc == 4:
                layouts.append(("FSDP 2 x tp 2", dict(type="fsdp", wrap=["LlamaDecoderLayer"], dp_shard=2, tp=2,
                                                      tp_plan="auto")))
            for name, strategy in layouts:
                big = Path(root, "big")
                base = _run(Path(root, "tiny"), {**strategy, "empty_init": True}, nproc)
                runs = [_run(big, {**strategy, "empty_init": empty}, nproc) for empty in (False, True)]
                hand_base = _run(Path(root, "tiny"), strategy, nproc, kind="hand")["after"]
                hand = _run(big, strategy, nproc, kind="hand")["after"] - hand_base
                cells = [f"{(r[key] - base[key]) / MIB:.0f} MiB" for r in runs for key in ("before", "after")]
                diff = runs[1]["after"] - base["after"] - hand
                print(f"| {nproc} | {name} | {size / nproc / MIB:.0f} MiB | {' | '.join(cells)} | "
                      f"{hand / MIB:.0f} MiB | {diff / MIB:+.0f} MiB |", flush=True)
                profiled = _run(big, {**strategy, "empty_init": True}, nproc, account=True)
                breakdown.append(_breakdown_row(nproc, name, "treadle", runs[1]["after"] - base["after"],
                                                profiled["account"]))
                profiled = _run(big, strategy, nproc, kind="hand", account=True)
                breakdown.append(_breakdown_row(nproc, name, "hand", hand, profiled["account"]))
        print("\nWhat the peak after the first step holds, per rank (MiB; the meta build and the hand loop: "
              "the peak above, the live tensors from a profiled run of the same step):\n")
        print("| processes | layout | loop | peak | parameters | gradients | optimizer state | gathered parameters "
              "| unsharded gradients | FSDP's reduce-scatter buffer | gloo's copies | other tensors | beyond the "
              "live tensors (malloc) | where | largest unit gathered |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(breakdown))


if __name__ == "__main__":
    main()
