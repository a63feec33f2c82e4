"""A LoRA fine-tune's checkpoints: their size and save time, the default (the adapter, the
buffers and the digests of the frozen base) against ``save_frozen=True`` (the base too).

A Llama-style causal LM (``--layers`` decoder layers of width ``--hidden``, vocabulary
``--vocab``; 8 x 512 x 8000 is 33 M parameters, 127 MiB in float32) with a LoRA adapter
(r=8 on q_proj and v_proj) is prepared through the public Strategy API (one process, the
CPU), trained one AdamW step, then saved ``--reps`` times each way, alternating, with
``strategy.save_checkpoint`` (what the Trainer's checkpoint hook calls). The first save
of each way is shown apart: the default's computes the frozen weights' digests then (once
per run: every later save reuses them). Sizes are every file of the checkpoint
directory; times the median wall time of the saves after the first.

    python benchmarks/lora_checkpoint.py [--layers 8] [--hidden 512] [--vocab 8000] [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def build(layers: int, hidden: int, vocab: int):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256))
    base = LlamaForCausalLM(cfg)
    base_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    return get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")), base_bytes


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = p.parse_args()

    import torch

    import treadle

    torch.set_num_threads(1)
    model, base_bytes = build(args.layers, args.hidden, args.vocab)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="lora_checkpoint_"))
    try:
        strategy = treadle.build_strategy("single", work_dir=root, seed=0)
        model, ow = strategy.prepare(model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-4)))
        ids = torch.randint(0, args.vocab, (2, 64))
        ow.update_params(model(input_ids=ids, labels=ids).loss)
        times: dict[bool, list[float]] = {False: [], True: []}
        sizes: dict[bool, tuple[int, int]] = {}
        for rep in range(args.reps + 1):
            for save_frozen in (False, True):
                path = root / f"{'full' if save_frozen else 'adapter'}_{rep}"
                t0 = time.perf_counter()
                strategy.save_checkpoint(path, save_frozen=save_frozen)
                times[save_frozen].append(time.perf_counter() - t0)
                sizes[save_frozen] = (dir_bytes(path), (path / "state.pt").stat().st_size)
                shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    mib = 2**20
    print(f"model: {total / 1e6:.1f} M parameters, {trainable / 1e6:.3f} M trainable ({100 * trainable / total:.2f} %); "
          f"base {base_bytes / mib:.1f} MiB (float32); {args.reps} saves of each after the first, alternating; "
          f"torch {torch.__version__}, 1 thread")
    print()
    print("| checkpoint | size MiB | state.pt MiB | % of the base | first save s | later saves s (median) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for save_frozen, name in ((False, "default (adapter, buffers, frozen digests)"), (True, "save_frozen=True")):
        size, state = sizes[save_frozen]
        first, later = times[save_frozen][0], statistics.median(times[save_frozen][1:])
        print(f"| {name} | {size / mib:.2f} | {state / mib:.2f} | {100 * size / base_bytes:.1f} | {first:.3f} | "
              f"{later:.3f} |")


if __name__ == "__main__":
    main()
