"""Real OpenMMLab files, as released, run through ``treadle train``.

``openmmlab/<project>/_base_/`` holds the ``default_runtime.py`` and one ``schedules/``
file of five projects, copied unchanged from their wheels (``openmmlab/README.md``). Each
config there inherits them through ``_base_`` and replaces only the model, the data and
the evaluator with tiny stand-ins. Every run must log, at the project's own logging
interval, the learning rate that MMEngine 0.10.7's schedulers give for the
same file (``data/openmmlab_lrs.json``, written by ``make_openmmlab_reference.py``; its
momentum column is for reading: treadle's log records hold no momentum).
The only command-line change is mmseg's 20k-iteration schedule stopped after 200
iterations (its poly decay still runs to 20000).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treadle.cli import main

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "openmmlab"
REFERENCE = json.loads((HERE / "data" / "openmmlab_lrs.json").read_text())["configs"]
EXTRA = {"mmseg/segmentor_20k": ["train_cfg.max_iters=200"]}
#: (iterations between records, records). The files log every 20 to 100 iterations; an
#: epoch of the stand-in data is shorter, so, as MMEngine's LoggerHook, every epoch's end
#: is logged (4, 10, 2 and 5 iterations); mmseg's loop is iteration-based: every 50.
LOGGED = {"mmpretrain/resnet_imagenet_bs256": (4, 100), "mmdet/detector_1x": (10, 12),
          "mmseg/segmentor_20k": (50, 4), "mmaction2/recognizer_sgd_50e": (2, 50),
          "mmdet3d/detector3d_cyclic_20e": (5, 20)}


def train(name: str, work: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> list[dict]:
    argv = ["train", str(CONFIGS / f"{name}.py"), "--work-dir", str(work), "--seed", "0"]
    sets = [*EXTRA.get(name, []), *overrides]
    assert main(argv + (["--set", *sets] if sets else [])) == 0, capsys.readouterr().err
    return [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_released_runtime_and_schedule_files_run_unchanged_with_mmengines_values(name, tmp_path, capsys):
    records = [r for r in train(name, tmp_path / "run", capsys) if r["mode"] == "train"]
    interval, count = LOGGED[name]
    assert [r["iter"] for r in records] == [interval * (i + 1) for i in range(count)]
    want = REFERENCE[name]
    logged = [r["lr"] for r in records]
    assert logged == pytest.approx([want["lr"][r["iter"] - 1] for r in records], rel=1e-9, abs=1e-15)


def test_reference_covers_every_config():
    found = sorted(str(p.relative_to(CONFIGS).with_suffix("")) for p in CONFIGS.glob("*/*.py"))
    assert found == sorted(REFERENCE) == sorted(LOGGED)
    assert len({name.split("/")[0] for name in found}) >= 5


def test_logger_interval_override_logs_every_iteration(tmp_path, capsys):
    """The released files' log_processor window_size=50 with --set default_hooks.logger.interval=1:
    a record every iteration, smoothed over the last 50 values (MMEngine's LogProcessor)."""
    name = "mmdet/detector_1x"
    records = [r for r in train(name, tmp_path / "run", capsys, "default_hooks.logger.interval=1",
                                "train_cfg.max_epochs=2") if r["mode"] == "train"]
    assert [r["iter"] for r in records] == list(range(1, 21))
    assert [r["lr"] for r in records] == pytest.approx(REFERENCE[name]["lr"][:20], rel=1e-9, abs=1e-15)
