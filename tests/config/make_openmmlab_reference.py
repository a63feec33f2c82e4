"""Write ``data/openmmlab_lrs.json``: the learning rate (and momentum) of param group 0 at
every training iteration that MMEngine's own schedulers give for each config of
``openmmlab/`` (the released ``default_runtime.py`` and ``schedules/`` files of five
OpenMMLab projects, inherited by configs that replace only model, data and evaluator).

Not a test (MMEngine is not a treadle dependency): run it by hand in a scratch venv with
MMEngine 0.10.7 and treadle's torch, from the repository's root:

    python3 -m venv /tmp/mmenv && /tmp/mmenv/bin/pip install mmengine==0.10.7 torch==<treadle's>
    PYTHONPATH=tests:. /tmp/mmenv/bin/python tests/config/make_openmmlab_reference.py

Each config is read and its schedulers stepped as ``make_schedule_reference.py`` does
(:func:`schedule`, which this script imports). The value recorded for an iteration is the
one its optimizer step uses.
``test_openmmlab_configs.py`` compares what ``treadle train`` logs.
"""

from __future__ import annotations

import json
from pathlib import Path

from make_schedule_reference import schedule

HERE = Path(__file__).resolve().parent
CONFIGS = {"mmpretrain/resnet_imagenet_bs256": None, "mmdet/detector_1x": None, "mmseg/segmentor_20k": 200,
           "mmaction2/recognizer_sgd_50e": None, "mmdet3d/detector3d_cyclic_20e": None}
OUT = HERE / "data" / "openmmlab_lrs.json"


def main() -> None:
    data = {"mmengine": __import__("mmengine").__version__, "torch": __import__("torch").__version__,
            "configs": {name: schedule(HERE / "openmmlab" / f"{name}.py", n) for name, n in CONFIGS.items()}}
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print({name: len(v["lr"]) for name, v in data["configs"].items()})


if __name__ == "__main__":
    main()
