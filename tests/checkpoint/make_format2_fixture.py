"""Writes tests/checkpoint/data/format2_trainer/ and format2_strategy/: checkpoints of
format 2 (a Trainer's, model/optim/hooks/loop/results/strategy; a hand-written loop's
through Strategy.save_checkpoint, model/optim/param_schedulers/data/extra/strategy), each
saved mid-epoch inside an accumulation window with clipping and a warmup scheduler on.

They were made with the code of commit 22e70e6 (the last of format 2), on the CPU with
torch 2.13::

    git worktree add /tmp/old 22e70e6
    PYTHONPATH=/tmp/old .venv/bin/python tests/checkpoint/make_format2_fixture.py

``test_migrate.py`` resumes them with today's code and compares with uninterrupted runs.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from format1_run import SAVE_AT, make_trainer, strategy_loop  # noqa: E402


def main() -> None:
    import treadle.checkpoint.manifest as manifest

    assert manifest.FORMAT_VERSION == 2, "run this with the code of a format-2 treadle (see the docstring)"
    with tempfile.TemporaryDirectory() as tmp:
        make_trainer(Path(tmp) / "run", strategy="single").fit()  # saves at SAVE_AT, 2 * SAVE_AT and the end
        strategy_loop(Path(tmp) / "loop", save_at=SAVE_AT)
        for src, name in ((Path(tmp) / "run" / "checkpoints" / f"iter_{SAVE_AT:08d}", "format2_trainer"),
                          (Path(tmp) / "loop" / f"iter_{SAVE_AT}", "format2_strategy")):
            out = HERE / "data" / name
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(src, out)
            print(f"wrote {out}")


if __name__ == "__main__":
    main()
