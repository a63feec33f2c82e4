"""Writes tests/checkpoint/data/format1/: a Trainer checkpoint of format 1 (treadle before
the one-owner layout), saved mid-epoch inside an accumulation window with clipping on.

It was made with the code of commit 415a029 (the last of format 1)::

    git worktree add /tmp/old 415a029
    PYTHONPATH=/tmp/old .venv/bin/python tests/checkpoint/make_format1_fixture.py

``test_migrate.py`` resumes it with today's code and compares with an uninterrupted run.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from format1_run import SAVE_AT, make_trainer  # noqa: E402


def main() -> None:
    import treadle.checkpoint.manifest as manifest

    assert manifest.FORMAT_VERSION == 1, "run this with the code of a format-1 treadle (see the docstring)"
    with tempfile.TemporaryDirectory() as tmp:
        make_trainer(Path(tmp) / "run").fit()  # saves at SAVE_AT, 2 * SAVE_AT and the end
        src = Path(tmp) / "run" / "checkpoints" / f"iter_{SAVE_AT:08d}"
        out = HERE / "data" / "format1"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(src, out)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
