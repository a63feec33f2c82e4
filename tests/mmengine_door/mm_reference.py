"""MMEngine's own Runner on an OpenMMLab config, run as mmpretrain's ``tools/train.py`` runs it:
the reference numbers that tests of ``treadle.mmengine`` compare with.

The installed ``mmpretrain/.mim/tools/train.py`` is loaded and its own ``parse_args`` and
``merge_args`` build the config (``Config.fromfile``, its loader defaults, ``--cfg-options``
merged last, ``--work-dir``); then ``Runner.from_cfg(cfg).train()``, as its ``main`` does. Run in
a work folder where the config's relative paths resolve (``configs`` and ``data/``, see
``conftest.py``'s ``mm_work``)::

    python mm_reference.py configs/lenet/lenet5_mnist.py OUT --cfg-options train_cfg.max_epochs=2
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        mm_reference.py configs/lenet/lenet5_mnist.py OUT --launcher pytorch --cfg-options ...

Under a launcher on a machine without CUDA, MMEngine 0.10.7's Runner needs three changes to
start at all (this reference side only, never treadle's): the ``gloo`` backend (nccl needs
GPUs), ``torch.cuda.set_device`` made a no-op (``mmengine/dist/utils.py`` calls it
unconditionally, and a CPU torch build has no ``_cuda_setDevice``), and
``model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None,
broadcast_buffers=False)`` (otherwise the Runner passes ``device_ids=[LOCAL_RANK]`` to DDP, which
a CPU module refuses). This script is what each torchrun child runs, so it applies them itself.

Rank 0 writes into OUT: ``final.pt`` (the model's state_dict after training, CPU tensors, the
names of MMEngine's checkpoints), ``log.json`` (every train iteration's record and every
validation's, from MMEngine's own ``vis_data/scalars.json``, and the last validation's
metrics as ``final``) and ``console.log`` (written by :func:`run_mmengine`). MMEngine's work_dir
is ``OUT/work_dir`` (its checkpoints ``epoch_N.pth``; its logs in ``OUT/work_dir/<timestamp>/``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Given before the caller's options, so that scalars.json holds every iteration's own values.
DEFAULT_OPTIONS = ("default_hooks.logger.interval=1", "log_processor.window_size=1", "randomness.seed=0")
#: The keys of a validation record in scalars.json that are not metrics.
NOT_METRICS = ("data_time", "time", "step")


def _train_tool() -> Any:
    """mmpretrain's ``tools/train.py`` (shipped in the package as ``.mim/tools/train.py``), as a module."""
    spec = importlib.util.find_spec("mmpretrain")
    path = Path(spec.origin).parent / ".mim" / "tools" / "train.py"
    module_spec = importlib.util.spec_from_file_location("mmpretrain_tools_train", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _cpu_distributed(cfg: Any) -> list[str]:
    """The three changes MMEngine's Runner needs to start under a launcher without CUDA."""
    import torch

    torch.cuda.set_device = lambda *args, **kwargs: None
    cfg.env_cfg.setdefault("dist_cfg", {})["backend"] = "gloo"
    cfg.model_wrapper_cfg = dict(type="MMDistributedDataParallel", device_ids=None, broadcast_buffers=False)
    return ["env_cfg.dist_cfg.backend=gloo", "torch.cuda.set_device stubbed",
            "model_wrapper_cfg=MMDistributedDataParallel(device_ids=None, broadcast_buffers=False)"]


def _read_scalars(path: Path) -> tuple[list[dict], list[dict]]:
    """(train records, validation records) of MMEngine's ``scalars.json`` (one JSON object a line;
    a train record has ``loss`` and ``lr``)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if "loss" in r], [r for r in records if "loss" not in r]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--launcher", choices=["none", "pytorch"], default="none")
    parser.add_argument("--cfg-options", nargs="*", default=[])
    a = parser.parse_args(argv)
    out = Path(a.out).resolve()

    import torch
    from mmengine.config import Config
    from mmengine.model import is_model_wrapper
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    train = _train_tool()
    sys.argv = [train.__file__, a.config, "--work-dir", str(out / "work_dir"), "--launcher", a.launcher]
    if a.cfg_options:
        sys.argv += ["--cfg-options", *a.cfg_options]
    args = train.parse_args()
    cfg = train.merge_args(Config.fromfile(args.config), args)
    workarounds = _cpu_distributed(cfg) if a.launcher != "none" and not torch.cuda.is_available() else []
    runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
    start = time.perf_counter()
    runner.train()
    train_s = time.perf_counter() - start
    if runner.rank != 0:
        return

    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out / "final.pt")
    scalars = Path(runner.log_dir) / "vis_data" / "scalars.json"
    train_records, val_records = _read_scalars(scalars)
    last_checkpoint = out / "work_dir" / "last_checkpoint"
    log = {
        "config": a.config,
        "cfg_options": a.cfg_options,
        "world_size": runner.world_size,
        "workarounds": workarounds,
        "work_dir": runner.work_dir,
        "scalars": str(scalars),
        "last_checkpoint": last_checkpoint.read_text().strip() if last_checkpoint.exists() else None,
        "train_s": train_s,
        "train": train_records,
        "val": val_records,
        "final": {k: v for k, v in val_records[-1].items() if k not in NOT_METRICS} if val_records else {},
    }
    (out / "log.json").write_text(json.dumps(log, indent=1))


def run_mmengine(config: str | Path, work: str | Path, out: str | Path, cfg_options: list[str],
                 nproc: int = 1, timeout: float = 600) -> dict:
    """Run ``config`` with MMEngine's Runner in a subprocess (under torchrun when ``nproc`` > 1),
    from the folder ``work``, writing into ``out``. ``cfg_options`` (``key=value`` strings, as
    ``tools/train.py --cfg-options`` takes them) come after :data:`DEFAULT_OPTIONS`.

    Returns ``log.json`` as a dict, with ``state_dict`` (``final.pt``), ``out`` and ``wall_s`` (the
    subprocess, imports included) added. Raises RuntimeError with the console's tail when the run fails.
    """
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    script = [str(Path(__file__).resolve()), str(config), str(out)]
    if nproc > 1:
        script += ["--launcher", "pytorch"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *script]
    else:
        cmd = [sys.executable, *script]
    cmd += ["--cfg-options", *DEFAULT_OPTIONS, *cfg_options]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    with open(out / "console.log", "w") as console:
        proc = subprocess.run(cmd, cwd=work, env=env, stdout=console, stderr=subprocess.STDOUT, timeout=timeout)
    wall_s = time.perf_counter() - start
    if proc.returncode != 0 or not (out / "log.json").exists():
        tail = (out / "console.log").read_text()[-4000:]
        raise RuntimeError(f"MMEngine's run failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    import torch

    result = json.loads((out / "log.json").read_text())
    result.update(state_dict=torch.load(out / "final.pt"), out=out, wall_s=wall_s)
    return result


if __name__ == "__main__":
    main()
