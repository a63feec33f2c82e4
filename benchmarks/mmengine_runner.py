"""Host time per training iteration of a released OpenMMLab config under MMEngine's own Runner
and under treadle, side by side, in one run.

The same file of mmpretrain 1.2.0, ``configs/lenet/lenet5_mnist.py`` and
``configs/resnet/resnet18_8xb16_cifar10.py`` (``--configs``), read unchanged from a work folder
with ``data/`` (``tests/mmengine_door/mm_data.py``'s generated MNIST and CIFAR-10, sized to
``--iters`` iterations an epoch) and a ``configs`` link, is trained by each runner in a fresh
process of its own:

* ``mmengine``: MMEngine 0.10.7's Runner, the config built as mmpretrain's ``tools/train.py``
  builds it (``tests/mmengine_door/mm_reference.py``'s way: that script's ``parse_args`` and
  ``merge_args``, the options below as ``--cfg-options``), then ``Runner.from_cfg(cfg).train()``;
* ``treadle``: what ``treadle train CONFIG --seed 0 --set ...`` runs (``load_config``,
  ``build_trainer``, ``fit()``), with the loader defaults that ``tools/train.py`` adds to the
  file for MMEngine (``collate_fn=default_collate``, ``pin_memory=True``) given as options,
  so that both engines load the same batches the same way;
* ``bare``: the model's step without an engine around it: MMEngine's Runner sets up the same
  run, but each iteration is only ``data_preprocessor`` -> ``forward(mode="loss")`` -> the
  loss summed as ``BaseModel.parse_losses`` sums it -> ``backward`` -> ``step`` ->
  ``zero_grad`` of the torch optimizer, no iteration hook (a train loop of its own, given as
  ``train_cfg.type``; the epoch's hooks still run at each epoch's end and start);
* ``treadle-file`` (not run unless named in ``--runners``): ``treadle train`` with the
  file's loaders as they are (no ``collate_fn``: MMEngine's ``pseudo_collate``, each image
  normalized apart in the data preprocessor), as the command line runs the file.

The same options everywhere: ``train_cfg.max_epochs=E``, ``train_cfg.val_interval`` past it
(both engines still validate once after the last epoch, outside the timed span),
``{train,val}_dataloader.num_workers=0`` and ``persistent_workers=False`` (``tools/train.py``
sets it True, which torch refuses without workers): the data is loaded in the training
thread and counted alike (``--workers N``: in N worker processes, which the training thread's
clock leaves out), ``default_hooks.checkpoint.interval=-1`` (no checkpoint but the last one,
after the timed span, which both engines save), seed 0 (MMEngine ``randomness.seed=0``,
treadle ``--seed 0``); logging as the config has it (LeNet every 150 iterations, ResNet
every 100, and at each epoch's end as MMEngine does when an epoch is shorter; both engines
alike). ``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)``. The children's output goes
to a file, not a terminal (treadle draws no progress bar). glibc's malloc with fixed
thresholds in every child (``--malloc steady``, see ``STEADY_MALLOC``): with its moving
default (``--malloc default``) each process falls at random, in any runner, into a state
where the step's activations are mapped afresh every iteration, ~3000 page faults and 5-8 ms
of system time per LeNet-5 iteration, which buries the engines' difference.

Two hooks mark each iteration, registered after the engine's own (MMEngine
``runner.register_hook``, treadle ``trainer.register_hook``; the ``bare`` loop calls them
itself): one at the lowest priority in ``before_train_iter`` (the last of that point), one at
the highest in ``after_train_iter`` (the first), each reading ``time.thread_time`` (the
training thread's CPU time), ``time.perf_counter`` (wall) and ``time.process_time`` (every
thread of the process). And in every runner alike, the work that is the same in all of
them is timed in the training thread's CPU time: each sample's data pipeline
(``mmengine.dataset.BaseDataset.__getitem__``, wrapped in the child) and the model's step
(from its data preprocessor's call, a forward pre-hook, to the end of the optimizer's step,
torch's global step post-hook). Columns, per iteration:

* iteration: from one ``after_train_iter`` mark to the next: everything (data, every hook,
  the epoch's end and start, the log line);
* model step: preprocessing, forward, loss, backward and the optimizer's step;
* data pipeline: the dataset's ``__getitem__`` of each sample of the batch;
* the rest: iteration less those two: the engine's own work (its loop, sampler and collate,
  hooks, logging, the train step's glue, the optimizer wrapper, ``zero_grad``); for ``bare``
  the floor of it (loop, sampler, collate, ``zero_grad``, the marks);
* step span: from the ``before_train_iter`` mark to the ``after_train_iter`` mark: the step
  as the engine runs it, data loading and the other hooks left out;
* iteration in wall time;
* system CPU and page faults: of the iteration's CPU time, the kernel's share, and the minor
  page faults (the training thread's ``getrusage``): memory mapped fresh each iteration.
The process's CPU time (all its threads, ``time.process_time``) is in the JSON; a line under
the tables says how far it strays from the training thread's (no other thread works here).

The marks and timers cost the same few microseconds per iteration in every runner (two
clock reads per sample for the pipeline, a ``getrusage`` per iteration); each child adds one
``before_train_iter`` hook, a point treadle otherwise does not dispatch.

Steady state: the first ``--warm`` epochs are left out (imports, the first iterator, the
allocator's growth, treadle's watch of whether the dataset draws); of the timed epochs,
each run's figures are those of the epoch with the least CPU time per iteration
(``--stat min``, the default: on a shared machine other processes only ever add time; one
epoch for every column, so the parts add up) or the mean over them (``--stat mean``).
Every iteration's loss is kept: each runner's must be MMEngine's (LeNet-5: bit for bit; a
config whose pipeline draws is another matter, see the note printed under its table).

Repetitions: the runners take turns, each first in turn (mmengine, treadle, bare; treadle,
bare, mmengine; ...), one process at a time, so the machine's load falls on all of them
alike. Each cell is the median over the repetitions with the range (min-max); a ratio or
difference is the median of the per-repetition ones (runs seconds apart) with their range.

    make .venv/openmmlab/.stamp          # mmengine, mmpretrain, mmcv-lite, torchvision
    .venv/bin/python benchmarks/mmengine_runner.py --quick       # LeNet-5 only: about 2 minutes on 2 cores
    .venv/bin/python benchmarks/mmengine_runner.py               # LeNet-5 and ResNet-18: about 9 minutes
    .venv/bin/python benchmarks/mmengine_runner.py --configs lenet --reps 8 --json out.json
    .venv/bin/python benchmarks/mmengine_runner.py --quick --profile   # where the host time goes

``--profile [N]``: instead, one run of each runner with cProfile on over its timed epochs:
the time of its own per iteration summed by where the code lives (``mmengine/runner``,
``treadle/engine``, torch's operators, ...), and the N functions with the most of it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOOR = ROOT / "tests" / "mmengine_door"
RUNNERS = ("mmengine", "treadle", "bare", "treadle-file")
DEFAULT_RUNNERS = RUNNERS[:3]
NAMES = {"mmengine": "MMEngine Runner", "treadle": "treadle", "bare": "bare step (no engine)",
         "treadle-file": "treadle, the file's loaders (pseudo_collate)"}
# name: (config file, its batch size, a description); the data is written so that an epoch
# has --iters iterations (the generated sets of mm_data.py, which the configs read unchanged).
CONFIGS = {
    "lenet": ("configs/lenet/lenet5_mnist.py", 128, "LeNet-5 on MNIST (lenet5_mnist.py), batch 128", ""),
    "resnet18": ("configs/resnet/resnet18_8xb16_cifar10.py", 16,
                 "ResNet-18 on CIFAR-10 (resnet18_8xb16_cifar10.py), batch 16",
                 "its pipeline's RandomCrop and RandomFlip draw, and treadle seeds each sample's draws "
                 "(docs/mmengine.md): other crops than MMEngine's, so other losses; the same work"),
}
# (iterations per epoch, epochs, warm epochs, repetitions): full and --quick.
PLAN = {"lenet": ((25, 5, 1, 8), (25, 3, 1, 3)), "resnet18": ((10, 2, 1, 2), (10, 2, 1, 1))}
CLOCKS = ("thread", "wall", "process")
STATS = ("min", "mean")
# glibc's malloc with fixed thresholds (``--malloc steady``): blocks up to 32 MiB from the heap,
# which is never given back to the system while under 1 GiB free at its top. With its default
# (a threshold that moves with the sizes freed so far), a process falls, by the accidents of its
# start, either into a state where a step's activations are reused or into one where they are
# mapped fresh every iteration: ~3000 page faults and 5-8 ms of system time per LeNet-5
# iteration, in any of the runners.
STEADY_MALLOC = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
# What mmpretrain's tools/train.py adds to every loader of the config (its merge_args), as
# options: given to treadle too (``treadle-file``: not), so both load the same batches the same way.
TRAIN_PY_LOADER = ("collate_fn.type=default_collate", "pin_memory=True")


# -- the child: one run of one runner ------------------------------------------------------
class Marks:
    """The clocks at each iteration's two marks, and its loss (a detached tensor, read at the end)."""

    def __init__(self, profile: tuple[int, int] | None = None) -> None:
        self.begin: list[tuple[float, float, float]] = []
        self.end: list[tuple[float, float, float]] = []
        self.losses: list[Any] = []
        # The same work in every runner, in the training thread's CPU seconds since the start
        # (read at each end mark): the data pipeline, and the model's step.
        self.data = self.model = 0.0
        self.model_from = 0.0
        # with them, the thread's minor page faults and system CPU time (getrusage)
        self.parts: list[tuple[float, float, int, float]] = []
        self.profile = profile  # --profile: cProfile from the end mark of iteration a to that of b
        self.profiler: Any = None

    def mark_begin(self) -> None:
        self.begin.append((time.thread_time(), time.perf_counter(), time.process_time()))

    def mark_end(self, outputs: Any) -> None:
        self.end.append((time.thread_time(), time.perf_counter(), time.process_time()))
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        self.parts.append((self.data, self.model, usage.ru_minflt, usage.ru_stime))
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.losses.append(loss.detach() if hasattr(loss, "detach") else loss)
        if self.profile is not None and len(self.end) in self.profile:
            if self.profiler is None:
                import cProfile

                self.profiler = cProfile.Profile()
                self.profiler.enable()
            else:
                self.profiler.disable()

    def save_profile(self, path: str) -> None:
        if self.profiler is not None:
            self.profiler.dump_stats(path)

    def instrument(self, model: Any) -> None:
        """Time, in every runner alike, what is the same work in all of them: each sample's
        pipeline (``BaseDataset.__getitem__``, patched for this process) and the model's step,
        from its data preprocessor's call (a forward pre-hook) to the end of the optimizer's
        step (torch's global step post-hook): preprocessing, forward, loss, backward, update."""
        from mmengine.dataset import BaseDataset
        from mmengine.model import BaseDataPreprocessor
        from torch.optim.optimizer import register_optimizer_step_post_hook

        getitem = BaseDataset.__getitem__

        def timed_getitem(dataset: Any, idx: int) -> Any:
            start = time.thread_time()
            try:
                return getitem(dataset, idx)
            finally:
                self.data += time.thread_time() - start

        BaseDataset.__getitem__ = timed_getitem  # type: ignore[method-assign]
        preprocessor = next(m for m in model.modules() if isinstance(m, BaseDataPreprocessor))

        def step_begins(module: Any, args: Any) -> None:
            self.model_from = time.thread_time()

        def step_ends(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.model += time.thread_time() - self.model_from

        preprocessor.register_forward_pre_hook(step_begins)
        register_optimizer_step_post_hook(step_ends)

    def result(self) -> dict[str, Any]:
        return {"begin": self.begin, "end": self.end, "parts": self.parts, "losses": [float(v) for v in self.losses]}


def options(args: argparse.Namespace, runner: str) -> list[str]:
    """The same ``key=value`` options for every runner (MMEngine's ``--cfg-options``, treadle's
    ``--set``); for ``treadle``, also the loader defaults that ``tools/train.py`` gives MMEngine."""
    out = [f"train_cfg.max_epochs={args.epochs}", f"train_cfg.val_interval={args.epochs + 1000}",
           "default_hooks.checkpoint.interval=-1"]
    for loader in ("train_dataloader", "val_dataloader"):
        out.append(f"{loader}.num_workers={args.workers}")
        if args.workers == 0:  # tools/train.py's True, which torch refuses without workers
            out.append(f"{loader}.persistent_workers=False")
        elif runner == "treadle":
            out.append(f"{loader}.persistent_workers=True")
        if runner == "treadle":
            out += [f"{loader}.{key}" for key in TRAIN_PY_LOADER]
    return out


def run_mmengine(args: argparse.Namespace, marks: Marks, bare: bool) -> list[str]:
    import mm_reference
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.registry import LOOPS
    from mmengine.runner import EpochBasedTrainLoop, Runner

    class BeginMark(Hook):
        def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
            marks.mark_begin()

    class EndMark(Hook):
        def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            marks.mark_end(outputs)

    class BareLoop(EpochBasedTrainLoop):
        """MMEngine's epoch loop whose iteration is the model's step alone, between the two marks."""

        def run_iter(self, idx: int, data_batch: Any) -> None:
            marks.mark_begin()
            model = self.runner.model
            optimizer = self.runner.optim_wrapper.optimizer
            data = model.data_preprocessor(data_batch, True)
            losses = model(**data, mode="loss")
            loss = sum(v.mean() for k, v in losses.items() if "loss" in k)  # as BaseModel.parse_losses
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            marks.mark_end(loss)
            self._iter += 1

    train = mm_reference._train_tool()
    sys.argv = [train.__file__, args.config, "--work-dir", args.work_dir,
                "--cfg-options", "randomness.seed=0", *options(args, "mmengine")]
    cfg = train.merge_args(Config.fromfile(args.config), train.parse_args())
    if bare:
        LOOPS.register_module(module=BareLoop, force=True)
        cfg.train_cfg.pop("by_epoch", None)  # MMEngine takes a loop's type or by_epoch, not both
        cfg.train_cfg.type = "BareLoop"
    runner = Runner.from_cfg(cfg)
    marks.instrument(runner.model)
    runner.register_hook(BeginMark(), priority="LOWEST")
    runner.register_hook(EndMark(), priority="HIGHEST")
    runner.train()
    return [type(h).__name__ for h in runner.hooks]


def run_treadle(args: argparse.Namespace, marks: Marks) -> list[str]:
    import treadle
    from treadle.config import build_trainer, load_config

    class BeginMark(treadle.Hook):
        priority = 100

        def before_train_iter(self, trainer: Any, batch: Any) -> None:
            marks.mark_begin()

    class EndMark(treadle.Hook):
        priority = 0

        def after_train_iter(self, trainer: Any, batch: Any, outputs: Any) -> None:
            marks.mark_end(outputs)

    cfg = load_config(args.config, options(args, args.child), mode="train", work_dir=args.work_dir, seed=0)
    trainer = build_trainer(cfg, "train")
    marks.instrument(trainer.model)
    trainer.register_hook(BeginMark())
    trainer.register_hook(EndMark())
    trainer.fit()
    return [type(h).__name__ for h in trainer.hooks]


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    marks = Marks(profile=(args.warm * args.iters, args.epochs * args.iters) if args.profile_out else None)
    if args.child.startswith("treadle"):
        hooks = run_treadle(args, marks)
    else:
        hooks = run_mmengine(args, marks, bare=args.child == "bare")
    if args.profile_out:
        marks.save_profile(args.profile_out)
    import mmengine

    import treadle

    result = {**marks.result(), "hooks": hooks, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "versions": {"mmengine": mmengine.__version__, "treadle": treadle.__version__}}
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent ----------------------------------------------------------------------------
def openmmlab_dir(args: argparse.Namespace) -> Path:
    mm = Path(args.openmmlab).resolve()
    if not (mm / "mmpretrain" / ".mim" / "configs").is_dir() or not (mm / "mmengine").is_dir():
        sys.exit(f"mmengine and mmpretrain are not installed in {mm}: run `make .venv/openmmlab/.stamp` "
                 "(or give --openmmlab DIR)")
    return mm


def make_work(root: Path, mm: Path, plan: dict[str, tuple[int, int, int, int]]) -> None:
    """``root/data`` (mm_data.py's generated sets, sized to the plan's epochs) and ``root/configs``."""
    import numpy as np

    sys.path.insert(0, str(DOOR))
    import mm_data

    mnist_iters = plan.get("lenet", (4,))[0]
    cifar_iters = plan.get("resnet18", (10,))[0]
    mm_data.write_mnist(root / "data" / "mnist", np.random.default_rng(0), n_train=CONFIGS["lenet"][1] * mnist_iters,
                        n_test=128)
    if cifar_iters % 5:
        sys.exit(f"--iters {cifar_iters}: for resnet18, a multiple of 5 (CIFAR-10's 5 training files)")
    per_file = CONFIGS["resnet18"][1] * cifar_iters // 5
    mm_data.write_cifar10(root / "data" / "cifar10", np.random.default_rng(1), per_batch=per_file, n_test=64)
    (root / "configs").symlink_to(mm / "mmpretrain" / ".mim" / "configs", target_is_directory=True)


def run_child(runner: str, name: str, plan: tuple[int, int, int, int], root: Path, mm: Path,
              args: argparse.Namespace, tag: str, profile_out: str | None = None) -> dict[str, Any]:
    iters, epochs, warm, _ = plan
    work_dir = root / "runs" / f"{name}-{runner}-{tag}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", runner, "--config", CONFIGS[name][0],
           "--work-dir", str(work_dir), "--epochs", str(epochs), "--warm", str(warm), "--iters", str(iters),
           "--workers", str(args.workers)]
    if profile_out:
        cmd += ["--profile-out", profile_out]
    path = os.pathsep.join(filter(None, [str(mm), str(DOOR / "env"), str(DOOR), str(ROOT),
                                         os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if args.malloc == "steady":
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), STEADY_MALLOC]))
    log = root / "runs" / f"{name}-{runner}-{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        p = subprocess.run(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout)
    whole = time.perf_counter() - started
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.exit(f"{name}/{runner} failed (exit {p.returncode}): {' '.join(cmd)}\n{text[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["whole_s"] = whole
    return {**result, **figures(result, iters, epochs, warm, args.stat, f"{name}/{runner}")}


def figures(r: dict[str, Any], iters: int, epochs: int, warm: int, stat: str, what: str) -> dict[str, Any]:
    """A run's figures (seconds per iteration) from its timed epochs: each epoch's mean per
    iteration (an iteration's span runs from the previous end mark, so an epoch holds one epoch
    end and start), then the epoch with the least CPU time per iteration (``stat="min"``: on a
    shared machine other processes only ever add time; every figure of the run is that epoch's,
    so the parts add up) or the mean over the epochs (``"mean"``: the whole span)."""
    begin, end, parts = r["begin"], r["end"], r["parts"]
    if len(end) != iters * epochs or len(begin) != len(end):
        sys.exit(f"{what}: {len(begin)}/{len(end)} marks, expected {iters * epochs} iterations "
                 f"({epochs} epochs of {iters}): is the data sized as planned?")
    per_epoch: dict[str, list[float]] = {}
    for e in range(warm, epochs):
        first, last = e * iters, (e + 1) * iters - 1
        fig = {}
        for c, clock in enumerate(CLOCKS):
            fig[f"step_{clock}"] = sum(end[i][c] - begin[i][c] for i in range(first, last + 1)) / iters
            fig[f"iter_{clock}"] = (end[last][c] - end[first - 1][c]) / iters
        fig["data_thread"] = (parts[last][0] - parts[first - 1][0]) / iters
        fig["model_thread"] = (parts[last][1] - parts[first - 1][1]) / iters
        fig["faults"] = (parts[last][2] - parts[first - 1][2]) / iters
        fig["sys_thread"] = (parts[last][3] - parts[first - 1][3]) / iters
        fig["rest_thread"] = fig["iter_thread"] - fig["data_thread"] - fig["model_thread"]
        for k, v in fig.items():
            per_epoch.setdefault(k, []).append(v)
    if stat == "min":
        e = per_epoch["iter_thread"].index(min(per_epoch["iter_thread"]))
        out = {k: v[e] for k, v in per_epoch.items()}
    else:
        out = {k: statistics.fmean(v) for k, v in per_epoch.items()}
    return {**out, "timed_iters": (epochs - warm) * iters, "epochs": per_epoch}


def spread(values: list[float], fmt: str) -> str:
    """Median, and the range when there is more than one value."""
    med = format(statistics.median(values), fmt)
    return med if len(values) < 2 else f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


# (figure, heading, scale to the unit shown): per iteration
COLUMNS = (("iter_thread", "iteration, CPU ms", 1e3), ("model_thread", "model step, CPU ms", 1e3),
           ("data_thread", "data pipeline, CPU ms", 1e3), ("rest_thread", "the rest (engine), CPU ms", 1e3),
           ("step_thread", "step span, CPU ms", 1e3), ("iter_wall", "iteration, wall ms", 1e3),
           ("sys_thread", "system CPU ms", 1e3), ("faults", "page faults", 1.0))


def losses_note(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Whether each runner's runs gave MMEngine's loss at every iteration."""
    ref = runs["mmengine"][0]["losses"]
    out = []
    for runner, rs in runs.items():
        differ = [r for r in rs if r["losses"] != ref]
        if not differ:
            out.append(f"{runner}: MMEngine's loss at every iteration of every run")
            continue
        r = differ[0]
        k = next(i for i, (a, b) in enumerate(zip(r["losses"], ref)) if a != b)
        out.append(f"{runner}: {len(differ)} of {len(rs)} runs differ from MMEngine's first run, from iteration "
                   f"{k + 1} ({r['losses'][k]:.6f} against {ref[k]:.6f})")
    return "losses: " + "; ".join(out)


def table(name: str, plan: tuple[int, int, int, int], runs: dict[str, list[dict[str, Any]]], stat: str) -> list[str]:
    iters, epochs, warm, reps = plan
    of = "the fastest timed epoch's mean" if stat == "min" else "the timed epochs' mean"
    rows = [f"**{CONFIGS[name][2]}**: {iters} iterations an epoch, {epochs} epochs, the last {epochs - warm} "
            f"timed; per iteration ({of} in each run), median (min-max) of {reps} repetitions", "",
            "| runner | " + " | ".join(head for _, head, _ in COLUMNS) + " |",
            "| --- |" + " --- |" * len(COLUMNS)]
    for runner, rs in runs.items():
        version = rs[0]["versions"].get(runner, "")
        label = NAMES[runner] + (f" {version}" if version else "")
        rows.append(f"| {label} | " + " | ".join(
            spread([r[k] * scale for r in rs], ".2f" if scale != 1 else ".0f") for k, _, scale in COLUMNS) + " |")

    def paired(a: str, b: str, how: str) -> str:
        """A row of per-repetition ratios (``/``) or differences (``-``, in each column's unit) of runner a to b."""
        cells = []
        for k, _, scale in COLUMNS:
            pairs = list(zip(runs[a], runs[b]))
            if how == "/":  # not of the kernel's share or the faults: near zero, their ratios say nothing
                cells.append("" if k in ("sys_thread", "faults") else spread([x[k] / y[k] for x, y in pairs], ".3f"))
            else:
                cells.append(spread([(x[k] - y[k]) * scale for x, y in pairs], "+.2f" if scale != 1 else "+.0f"))
        return f"| {NAMES[a]} {how} {NAMES[b]} | " + " | ".join(cells) + " |"

    treadles = [r for r in runs if r.startswith("treadle")]
    rows += [paired(t, "mmengine", "/") for t in treadles] + [paired(t, "mmengine", "-") for t in treadles]
    if "bare" in runs:
        rows += [paired(r, "bare", "-") for r in runs if r != "bare"]
    return rows


def machine(torch_version: str) -> str:
    cpu = Path("/proc/cpuinfo")
    lines = cpu.read_text().splitlines() if cpu.exists() else []
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())
    return (f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; Python "
            f"{platform.python_version()}, torch {torch_version}, 1 torch thread")


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else ""


PACKAGES = ("mmengine", "mmpretrain", "mmcv", "treadle", "torch", "numpy", "cv2")


def package_of(file: str) -> str:
    """``mmengine/runner``, ``treadle/engine``, ... for a profiled function's file; the
    benchmark's own code; ``built-in`` for C functions (torch's operators among them)."""
    if file == "~" or file.startswith("<"):
        return "built-in (C functions, torch's operators)"
    if Path(file).resolve() == Path(__file__).resolve():
        return "this benchmark (marks, timers)"
    parts = Path(file).parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in PACKAGES and "site-packages" not in parts[i + 1:]:
            sub = parts[i + 1] if i + 2 < len(parts) else ""
            return f"{parts[i]}/{sub}" if sub else parts[i]
    return "Python's standard library and others"


def profile(args: argparse.Namespace, names: list[str], plans: dict[str, Any], root: Path, mm: Path) -> None:
    import pstats

    for name in names:
        for runner in args.runners:
            out = str(root / f"{name}-{runner}.prof")
            r = run_child(runner, name, plans[name], root, mm, args, "profile", profile_out=out)
            n = r["timed_iters"]
            stats = pstats.Stats(out)
            raw = stats.stats  # type: ignore[attr-defined]
            total = sum(v[2] for v in raw.values())
            print(f"\n{name} / {NAMES[runner]}: {n} timed iterations under cProfile, {total / n * 1e3:.2f} ms per "
                  "iteration (profiled: slower than unprofiled); time of its own by where the code lives, ms/iter:")
            groups: dict[str, float] = {}
            for (file, _, _), (_, _, tottime, _, _) in raw.items():
                groups[package_of(file)] = groups.get(package_of(file), 0.0) + tottime
            for group, t in sorted(groups.items(), key=lambda kv: -kv[1]):
                if t / n >= 5e-5:
                    print(f"  {t / n * 1e3:7.3f}  {group}")
            print(f"the {args.profile} functions with the most time of their own, ms/iter:")
            for (file, line, func), (_, calls, tottime, cumtime, _) in sorted(raw.items(), key=lambda kv: -kv[1][2])[
                    :args.profile]:
                where = "/".join(Path(file).parts[-2:]) if file != "~" else ""
                print(f"  {tottime / n * 1e3:7.3f} own {cumtime / n * 1e3:7.3f} cum {calls / n:6.1f} calls  "
                      f"{func} {where}:{line}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="LeNet-5 only, 3 epochs, 3 repetitions: about 2 minutes")
    p.add_argument("--configs", default=None, help="comma-separated, of: " + ", ".join(CONFIGS)
                   + " (default: all; --quick: lenet)")
    p.add_argument("--runners", default=",".join(DEFAULT_RUNNERS), help="comma-separated, of: " + ", ".join(RUNNERS))
    p.add_argument("--reps", type=int, default=None, help="repetitions (default by config)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (default by config)")
    p.add_argument("--warm", type=int, default=None, help="first epochs left out of the figures (default 1)")
    p.add_argument("--iters", type=int, default=None, help="iterations per epoch: the data's size (default by config)")
    p.add_argument("--workers", type=int, default=0, help="loader workers on every side (default 0: data loading in "
                   "the training thread, counted)")
    p.add_argument("--stat", choices=STATS, default="min",
                   help="a run's figure from its timed epochs' means per iteration: min, the fastest epoch "
                        "(default: other processes only ever add time), or mean, the whole span")
    p.add_argument("--malloc", choices=("steady", "default"), default="steady",
                   help="steady: every child with glibc's malloc thresholds fixed (GLIBC_TUNABLES; the default): "
                        "default: glibc's moving threshold, with which a process may spend 5-8 ms per LeNet "
                        "iteration in page faults, at random")
    p.add_argument("--openmmlab", default=str(ROOT / ".venv" / "openmmlab"),
                   help="the folder mmengine and mmpretrain are installed in (make .venv/openmmlab/.stamp)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--profile", type=int, nargs="?", const=25, default=None,
                   help="instead: one cProfile'd run of each runner, its N busiest functions (default 25)")
    p.add_argument("--keep", default=None, help="keep the work folder (data, runs and their logs) here")
    p.add_argument("--json", default=None, help="write every run's figures to this file")
    p.add_argument("--child", choices=RUNNERS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--profile-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    names = (args.configs or ("lenet" if args.quick else ",".join(CONFIGS))).split(",")
    args.runners = args.runners.split(",")
    for value, known, what in ((names, CONFIGS, "--configs"), (args.runners, RUNNERS, "--runners")):
        bad = [v for v in value if v not in known]
        if bad:
            p.error(f"{what} {','.join(bad)}: unknown; expected a comma-separated list of {', '.join(known)}")
    if not {"mmengine", "treadle"} <= set(args.runners):
        p.error("--runners must hold mmengine and treadle (the table's ratio)")
    plans = {}
    for n in names:
        iters, epochs, warm, reps = PLAN[n][1 if args.quick else 0]
        warm = warm if args.warm is None else args.warm
        epochs = epochs if args.epochs is None else args.epochs
        if not 1 <= warm < epochs:
            p.error(f"{n}: --warm {warm} must be at least 1 and less than --epochs {epochs}")
        plans[n] = (iters if args.iters is None else args.iters, epochs, warm, reps if args.reps is None else args.reps)
    mm = openmmlab_dir(args)

    import torch

    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mmengine_runner_") as tmp:
        root = Path(args.keep).resolve() if args.keep else Path(tmp)
        if root.exists() and any(root.iterdir()):
            sys.exit(f"--keep {root}: not empty (give a new folder)")
        root.mkdir(parents=True, exist_ok=True)
        make_work(root, mm, plans)
        if args.profile is not None:
            profile(args, names, plans, root, mm)
            return
        print(f"{machine(torch.__version__)}; before: {load()}", flush=True)
        results: dict[str, dict[str, list[dict[str, Any]]]] = {n: {r: [] for r in args.runners} for n in names}
        for name in names:
            plan = plans[name]
            for rep in range(plan[3]):
                k = rep % len(args.runners)
                for runner in args.runners[k:] + args.runners[:k]:  # each runner first in turn
                    r = run_child(runner, name, plan, root, mm, args, str(rep))
                    results[name][runner].append(r)
                    print(f"  {name} {runner} rep {rep + 1}: iteration {r['iter_thread'] * 1e3:.2f} CPU ms (model "
                          f"{r['model_thread'] * 1e3:.2f}, data {r['data_thread'] * 1e3:.2f}, rest "
                          f"{r['rest_thread'] * 1e3:.2f}), {r['iter_wall'] * 1e3:.2f} wall ms; the run "
                          f"{r['whole_s']:.1f} s", flush=True)
        elapsed = time.perf_counter() - begun
    first = next(iter(next(iter(results.values())).values()))[0]
    print(f"\n{machine(first['torch'])}; after: {load()}; {elapsed:.0f} s for "
          f"{sum(len(rs) for by in results.values() for rs in by.values())} runs")
    print(f"data loaded in {'the training thread' if args.workers == 0 else f'{args.workers} worker processes'}; "
          "CPU = the training thread's (time.thread_time), process CPU = all its threads, wall = perf_counter; "
          "model step = data preprocessor to the end of optimizer.step; data pipeline = the dataset's __getitem__; "
          "the rest (engine) = iteration - model step - data pipeline; step span = before_train_iter to "
          "after_train_iter; system CPU and page faults: the training thread's (getrusage); glibc malloc: "
          + (f"GLIBC_TUNABLES={STEADY_MALLOC}" if args.malloc == "steady" else "its defaults"))
    runs = [r for by in results.values() for rs in by.values() for r in rs]
    gap = max(abs(r["iter_process"] / r["iter_thread"] - 1) for r in runs)
    print(f"the process's CPU time (all its threads) per iteration is within {gap:.1%} of the training thread's "
          "in every run\n")
    for name in names:
        print("\n".join(table(name, plans[name], results[name], args.stat)))
        note = f" ({CONFIGS[name][3]})" if CONFIGS[name][3] else ""
        print(f"\n{losses_note(results[name])}{note}\n")
    if args.json:
        slim = {n: {r: [{k: v for k, v in run.items() if k not in ("begin", "end", "parts", "losses")} for run in rs]
                    for r, rs in by.items()} for n, by in results.items()}
        Path(args.json).write_text(json.dumps({"machine": machine(first["torch"]), "plans": plans,
                                               "workers": args.workers, "stat": args.stat, "malloc": args.malloc,
                                               "results": slim,
                                               "elapsed_s": elapsed}, indent=1))


if __name__ == "__main__":
    main()
