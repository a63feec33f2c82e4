"""Write ``data/openmmlab_lrs.json``: the learning rate (and momentum) of param group 0 at
every training iteration that MMEngine's own schedulers give for each config of
``openmmlab/`` (the released ``default_runtime.py`` and ``schedules/`` files of five
OpenMMLab projects, inherited by configs that replace only model, data and evaluator).

Not a test (MMEngine is not a treadle dependency): run it by hand in a scratch venv with
MMEngine 0.10.7 and treadle's torch, from the repository's root:

    python3 -m venv /tmp/mmenv && /tmp/mmenv/bin/pip install mmengine==0.10.7 torch==<treadle's>
    PYTHONPATH=tests:. /tmp/mmenv/bin/python tests/config/make_openmmlab_reference.py

As ``make_schedule_reference.py``: each config is read with MMEngine's ``Config.fromfile``,
its optimizer wrapper built with ``build_optim_wrapper`` over the same tiny model, its
schedulers built as MMEngine's runner builds them and stepped as its ParamSchedulerHook
steps them. The value recorded for an iteration is the one its optimizer step uses.
``test_openmmlab_configs.py`` compares what ``treadle train`` logs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import PARAM_SCHEDULERS

from support import TinyNet

HERE = Path(__file__).resolve().parent
CONFIGS = {"mmpretrain/resnet_imagenet_bs256": None, "mmdet/detector_1x": None, "mmseg/segmentor_20k": 200,
           "mmaction2/recognizer_sgd_50e": None, "mmdet3d/detector3d_cyclic_20e": None}
OUT = HERE / "data" / "openmmlab_lrs.json"


def values(name: str, max_iters: int | None) -> dict[str, list[float]]:
    cfg = Config.fromfile(str(HERE / "openmmlab" / f"{name}.py"), import_custom_modules=False)
    wrapper = build_optim_wrapper(TinyNet(), cfg.optim_wrapper)
    loader = cfg.train_dataloader
    epoch_length = math.ceil(loader.dataset.n / loader.batch_size)
    specs = cfg.param_scheduler if isinstance(cfg.param_scheduler, list) else [cfg.param_scheduler]
    by_epoch = cfg.train_cfg.get("by_epoch", cfg.train_cfg.get("type") != "IterBasedTrainLoop")
    epochs, per_epoch = (cfg.train_cfg.max_epochs, epoch_length) if by_epoch else (1, max_iters)
    schedulers = []
    for spec in specs:
        spec = dict(spec)
        spec.setdefault("end", epochs if spec.get("by_epoch", True) else epochs * per_epoch)
        schedulers.append(PARAM_SCHEDULERS.build(spec, default_args=dict(optimizer=wrapper,
                                                                          epoch_length=epoch_length)))
    out: dict[str, list[float]] = {"lr": [], "momentum": []}
    for _ in range(epochs):
        for _ in range(per_epoch):
            group = wrapper.optimizer.param_groups[0]
            out["lr"].append(float(f"{group['lr']:.12g}"))
            out["momentum"].append(float(f"{group['betas'][0] if 'betas' in group else group['momentum']:.12g}"))
            for s in schedulers:
                if not s.by_epoch:
                    s.step()
        for s in schedulers:
            if s.by_epoch:
                s.step()
    return out


def main() -> None:
    data = {"mmengine": __import__("mmengine").__version__, "torch": __import__("torch").__version__,
            "configs": {name: values(name, n) for name, n in CONFIGS.items()}}
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print({name: len(v["lr"]) for name, v in data["configs"].items()})


if __name__ == "__main__":
    main()
