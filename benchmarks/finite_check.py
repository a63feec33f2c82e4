"""Cost of the check every checkpoint save makes for NaN/inf in weights and optimizer state.

    python benchmarks/finite_check.py [--layers 24] [--width 1024]

Prints the check's time beside torch.save of the same state to memory (CPU).
"""

from __future__ import annotations

import argparse
import io
import time

import torch

from treadle.checkpoint.finite import first_nonfinite, named_tensors


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    model = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width) for _ in range(a.layers)])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, a.width)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    params = sum(p.numel() for p in model.parameters())

    def timed(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(a.repeat):
            fn()
        return (time.perf_counter() - start) / a.repeat

    check = timed(lambda: first_nonfinite(named_tensors(state)))
    save = timed(lambda: torch.save(state, io.BytesIO()))
    print(f"{params / 1e6:.1f}M parameters + AdamW state, {torch.get_num_threads()} threads: "
          f"check {check * 1e3:.1f} ms, torch.save to memory {save * 1e3:.1f} ms "
          f"({100 * check / save:.0f}% of it)")


if __name__ == "__main__":
    main()
