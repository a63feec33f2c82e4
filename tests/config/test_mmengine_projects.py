"""Config files in the style of MMEngine-based projects (``mmengine_projects/``: over the
released runtime and schedule files of ``openmmlab/``, and ``schedules/`` files with the
schedule values two more projects ship) run unchanged through ``treadle train``, with
only the model and data replaced by tiny ones, and log at every iteration the learning
rate that MMEngine's own schedulers give for the same file
(``data/mmengine_schedule_lrs.json``, written by ``make_schedule_reference.py``).

The command line changes only logging (a record every iteration) and, for the
20k-iteration segmentation schedule, stops the run after 1000 iterations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treadle.cli import main

HERE = Path(__file__).resolve().parent
PROJECTS = HERE / "mmengine_projects"
REFERENCE = json.loads((HERE / "data" / "mmengine_schedule_lrs.json").read_text())["lrs"]
EXTRA = {"segmentor_20k": ["train_cfg.max_iters=1000", "log_processor.window_size=1"]}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_project_config_logs_mmengines_learning_rate_at_every_iteration(name, tmp_path, capsys):
    work = tmp_path / "run"
    argv = ["train", str(PROJECTS / f"{name}.py"), "--work-dir", str(work),
            "--set", "default_hooks.logger.interval=1", *EXTRA.get(name, [])]
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    logged = [(r["iter"], r["lr"]) for r in records if r["mode"] == "train"]
    want = REFERENCE[name]
    assert [i for i, _ in logged] == list(range(1, len(want) + 1))
    assert [lr for _, lr in logged] == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_reference_covers_every_project_config():
    assert sorted(REFERENCE) == sorted(p.stem for p in PROJECTS.glob("*.py")
                                       if p.stem != "model_data")
    assert {len(v) for v in REFERENCE.values()} >= {200, 528, 600, 1000}
