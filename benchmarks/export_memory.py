"""Peak resident memory of ``treadle export CKPT --out DIR`` against the model's bytes.

A Llama-style model (``--hidden`` 768, ``--layers`` 8, vocabulary 32000, untied head,
float32: about 400 MiB) is built with fresh weights in a setup process and saved twice: a
one-process checkpoint (``state.pt``, through the Strategy API) and a sharded one (DCP
files, as FSDP writes them). Each is then exported by the command, in a fresh process,
as a Hugging Face folder, and the one-process checkpoint as one ``.safetensors`` file too
(both written one tensor at a time). A tiny model (hidden 64, 2 layers) exported the same
way gives the baseline: the interpreter, torch and treadle. Each export's peak resident
set size (``ru_maxrss`` of the child) is reported, and its excess over the baseline
against the model's bytes and its largest tensor's.

    python benchmarks/export_memory.py [--hidden 768] [--layers 8] [--dir /tmp] [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SETUP = r"""
import sys, torch, treadle
from transformers import LlamaConfig, LlamaForCausalLM
from treadle.checkpoint.model_info import describe_model
from treadle.checkpoint.sharded import save_sharded
hidden, layers, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
vocab = 32000 if hidden > 64 else 128
config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                     num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 64),
                     tie_word_embeddings=False)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
strategy = treadle.build_strategy("single", work_dir=out, seed=0)
strategy.prepare(model)
strategy.save_checkpoint(f"{out}/plain")
save_sharded(f"{out}/sharded", {"model": model.state_dict()}, {"state.pt": {"iter": 0}}, {"model": describe_model(model)})
sizes = [t.numel() * t.element_size() for t in model.state_dict().values()]
print(sum(sizes), max(sizes))
"""


def _peak_kib(argv: list[str]) -> int:
    """Run ``argv`` in a child process; its peak resident set size in KiB (Linux: ru_maxrss)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{stderr[-2000:]}")
    return usage.ru_maxrss


def _export(ckpt: Path, out: Path, reps: int) -> int:
    """The least peak over ``reps`` exports (the others' differences are page-cache noise)."""
    peaks = []
    for _ in range(reps):
        shutil.rmtree(out, ignore_errors=True)
        if out.suffix == ".safetensors":
            out.unlink(missing_ok=True)
        peaks.append(_peak_kib([sys.executable, "-m", "treadle", "export", str(ckpt), "--out", str(out)]))
    return min(peaks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="export_memory_", dir=args.dir))
    mib = 2**20
    try:
        rows = []
        for name, hidden, layers in (("tiny", 64, 2), ("model", args.hidden, args.layers)):
            where = root / name
            setup = subprocess.run([sys.executable, "-c", SETUP, str(hidden), str(layers), str(where)],
                                   capture_output=True, text=True, check=True)
            total, largest = map(int, setup.stdout.split()[-2:])
            peaks = {f"{kind} -> {form}": _export(where / kind, where / f"out_{kind}{suffix}", args.reps) * 1024
                     for kind in ("plain", "sharded") for form, suffix in (("folder", ""), ("file", ".safetensors"))
                     if not (kind == "sharded" and form == "file")}
            rows.append((name, total, largest, peaks))
        (_, _, _, base), (_, total, largest, peaks) = rows
        print(f"model {total / mib:.1f} MiB (largest tensor {largest / mib:.1f} MiB); peak RSS of `treadle export` "
              f"(least of {args.reps}), and its excess over the same export of a tiny model:")
        print(f"{'export':<26}{'tiny':>10}{'model':>10}{'excess':>10}{'excess/model':>14}{'excess/largest':>16}")
        for key, peak in peaks.items():
            excess = peak - base[key]
            print(f"{key:<26}{base[key] / mib:>9.0f}M{peak / mib:>9.0f}M{excess / mib:>9.0f}M{excess / total:>14.2f}"
                  f"{excess / largest:>16.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
