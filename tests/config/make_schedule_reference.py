"""Write ``data/mmengine_schedule_lrs.json``: the learning rate of every training iteration
that MMEngine's own parameter schedulers give for each config of ``mmengine_projects/``.

Not a test (MMEngine is not a treadle dependency): run it by hand in a scratch venv with
MMEngine and the same torch, from the repository's root:

    python3 -m venv /tmp/mmvenv && /tmp/mmvenv/bin/pip install torch==<treadle's> mmengine
    PYTHONPATH=tests /tmp/mmvenv/bin/python tests/config/make_schedule_reference.py

Each config is read with MMEngine's ``Config.fromfile``, its optimizer wrapper built with
``build_optim_wrapper`` over the same tiny model, its schedulers built as MMEngine's runner
builds them (``build_iter_from_epoch`` for ``convert_to_iter_based``), and stepped as
MMEngine's ParamSchedulerHook steps them: iteration-based ones after every iteration,
epoch-based ones after every epoch. The lr recorded for an iteration is the one its
optimizer step uses. ``test_mmengine_projects.py`` compares what ``treadle train`` logs.
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
CONFIGS = ("resnet18_step", "resnet50_cosine", "swin_tiny", "detector_1x", "segmentor_20k")
#: The test's only change to a schedule: the 20k-iteration run stops after its first 1000
#: iterations (the poly decay still runs to iteration 20000), to keep the test short.
MAX_ITERS = {"segmentor_20k": 1000}
OUT = HERE / "data" / "mmengine_schedule_lrs.json"


def schedule(path: Path, max_iters: int | None = None) -> dict[str, list[float]]:
    """The lr and momentum of param group 0 at every training iteration of the config at
    ``path`` (``max_iters``: an iteration-based run stopped there)."""
    cfg = Config.fromfile(str(path), import_custom_modules=False)
    wrapper = build_optim_wrapper(TinyNet(), cfg.optim_wrapper)
    loader = cfg.train_dataloader
    epoch_length = math.ceil(loader.dataset.n / loader.batch_size)
    specs = cfg.param_scheduler if isinstance(cfg.param_scheduler, list) else [cfg.param_scheduler]
    by_epoch = cfg.train_cfg.get("by_epoch", cfg.train_cfg.get("type") != "IterBasedTrainLoop")
    max_iters = cfg.train_cfg.get("max_iters") if max_iters is None else max_iters
    epochs, per_epoch = (cfg.train_cfg.max_epochs, epoch_length) if by_epoch else (1, max_iters)
    schedulers = []
    for spec in specs:  # as MMEngine's Runner.build_param_scheduler: a missing end is the run's length
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
            "lrs": {name: schedule(HERE / "mmengine_projects" / f"{name}.py", MAX_ITERS.get(name))["lr"]
                    for name in CONFIGS}}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print({name: len(v) for name, v in data["lrs"].items()})


if __name__ == "__main__":
    main()
