"""Count how many released OpenMMLab configs run under ``treadle train`` through ``_base_``.

Each sampled config is inherited by a small child file that replaces only the model, the
data and the evaluators (tests/support.py's TinyNet and make_data); everything else (optimizer,
schedulers, hooks, runtime) comes from the released file as it is. Each child runs in its own
process as ``python -m treadle train CHILD --set train_cfg.max_epochs=1`` (retried with
``train_cfg.max_iters=4`` when the config is iteration-based, and with ``max_epochs`` one past
a scheduler's ``begin`` when one epoch ends before a scheduler starts: its missing ``end`` is the
run's length, which MMEngine's runner refuses alike), plus any ``--set`` given here.

The configs are the ``.mim/configs/`` trees of the projects' wheels, unpacked under ROOT
(ROOT/mmpretrain/mmpretrain/.mim/configs/..., see ``PROJECTS``). By default the files are the
42 of tools/mmcfg_sample.txt (6 per project of mmpretrain 1.2.0, mmdet 3.3.0, mmsegmentation
1.2.2, mmaction2 1.2.0, mmpose 1.3.2, mmagic 1.2.0, mmdet3d 1.4.0): the sample issue #36 was
counted on. It was drawn with ``random.seed(0)`` and ``random.sample`` per project by a harness
that trained in its own process, so treadle's seeding moved ``random`` between projects and a
fresh ``--draw N`` (no training between draws) picks other files after the first project.

    PYTHONPATH=$PWD .venv/bin/python tools/mmcfg_count.py /tmp/mmcfgs --json /tmp/c.json \
        [--set default_hooks.logger.interval=1] [--keep-sampler] [--parts-model]

``--keep-sampler``: the child keeps the released ``train_dataloader``'s ``sampler`` and
``batch_sampler`` (mmdet's ``AspectRatioBatchSampler``, ``InfiniteSampler``...) and replaces
only its dataset (tests/support.py's ``make_sized_data``, whose items have a size, as
MMEngine's ``get_data_info`` gives it), ``batch_size``, ``num_workers`` (with
``persistent_workers``) and ``collate_fn`` (the dataset's own, torch's default).
``--parts-model``: a config with several optimizers by name (``MultiOptimWrapperConstructor``,
the GAN configs) gets tests/support.py's ``TinyParts`` for its model, one part per
optimizer, each stepped by its own optimizer (the model is replaced either way).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROJECTS = {"mmpretrain": "mmpretrain/mmpretrain", "mmdet": "mmdet/mmdet", "mmseg": "mmsegmentation/mmseg",
            "mmaction2": "mmaction2/mmaction", "mmpose": "mmpose/mmpose", "mmagic": "mmagic/mmagic",
            "mmdet3d": "mmdet3d/mmdet3d"}
CHILD = """_base_ = [{path!r}]
model = dict(_delete_=True, type='support.TinyNet')
loss_fn = dict(type='CrossEntropyLoss')
train_dataloader = dict(_delete_=True, batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=8),
                        sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(_delete_=True, batch_size=4, num_workers=0, dataset=dict(type='support.make_data', n=8, seed=1),
                      sampler=dict(type='DefaultSampler', shuffle=False))
test_dataloader = val_dataloader
val_evaluator = None
test_evaluator = None
metrics = dict(acc=dict(type='Accuracy'))
progress = False
"""


KEEP_SAMPLER = """train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False, collate_fn=None,
                        dataset=dict(_delete_=True, type='support.make_sized_data', n=8))
"""


def child_text(path: Path, keep_sampler: bool, parts: list[str] | None) -> str:
    """The child config of ``path``: model, data and evaluators replaced."""
    text = CHILD.format(path=str(path))
    if keep_sampler:
        start = text.index("train_dataloader = ")
        text = text[:start] + KEEP_SAMPLER + text[text.index("val_dataloader = "):]
    if parts:
        text = text.replace("model = dict(_delete_=True, type='support.TinyNet')",
                            f"model = dict(_delete_=True, type='support.TinyParts', parts={parts!r})")
    return text


def optimizer_parts(path: Path) -> list[str] | None:
    """The optimizer names of a config with several (MultiOptimWrapperConstructor), or None."""
    from treadle.config.loader import load_file

    try:
        ow = load_file(path).get("optim_wrapper")
    except Exception:  # the run itself reports it
        return None
    if not isinstance(ow, dict) or "optimizer" in ow or not str(ow.get("constructor", "")).endswith(
            "MultiOptimWrapperConstructor"):
        return None
    return [k for k, v in ow.items() if k != "constructor" and isinstance(v, dict)] or None


def listed(root: Path) -> list[tuple[str, Path]]:
    """The files of tools/mmcfg_sample.txt: (project, config file) pairs."""
    names = {sub.split("/")[0]: proj for proj, sub in PROJECTS.items()}
    rels = Path(__file__).with_name("mmcfg_sample.txt").read_text().split()
    return [(names[r.split("/")[0]], root / r) for r in rels]


def draw(root: Path, n: int) -> list[tuple[str, Path]]:
    """A fresh seed-0 sample: (project, config file) pairs, n per project."""
    random.seed(0)
    picked = []
    for proj, sub in PROJECTS.items():
        files = sorted(str(p) for p in (root / sub / ".mim/configs").rglob("*.py") if "_base_" not in p.parts)
        picked += [(proj, Path(f)) for f in random.sample(files, min(n, len(files)))]
    return picked


def train(child: Path, work: Path, sets: list[str]) -> tuple[int, str]:
    """Run ``treadle train`` on child; (exit status, last line of its output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    cmd = [sys.executable, "-m", "treadle", "train", str(child), "--work-dir", str(work)]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = (p.stdout + p.stderr).strip().splitlines()
    return p.returncode, (lines[-1] if lines else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="folder with the unpacked wheels (ROOT/mmdet/mmdet/.mim/configs ...)")
    ap.add_argument("--draw", type=int, metavar="N", help="draw N configs per project instead of the listed 42")
    ap.add_argument("--set", action="append", default=[], help="extra --set for every run")
    ap.add_argument("--json", type=Path, help="write {config: error or ''} here")
    ap.add_argument("--keep-sampler", action="store_true",
                    help="keep the released train_dataloader's sampler and batch_sampler (replace its dataset only)")
    ap.add_argument("--parts-model", action="store_true",
                    help="configs with several optimizers by name get a model with one part per optimizer")
    args = ap.parse_args()
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mmcfg-") as tmp:
        for proj, f in (draw(args.root, args.draw) if args.draw else listed(args.root)):
            child = Path(tmp) / f"{proj}_{f.stem}.py"
            child.write_text(child_text(f, args.keep_sampler, optimizer_parts(f) if args.parts_model else None))
            how = "train_cfg.max_epochs=1"
            rc, last = train(child, Path(tmp) / "runs" / child.stem, [how, *args.set])
            if rc and "max_epochs" in last and any(w in last for w in ("iteration", "max_iters", "by_epoch")):
                how = "train_cfg.max_iters=4"
                rc, last = train(child, Path(tmp) / "runs" / (child.stem + "-i"), [how, *args.set])
            late = re.search(r"`begin` must be smaller than `end`, got begin=(\d+), end=1$", last)
            if rc and late and how == "train_cfg.max_epochs=1":
                how = f"train_cfg.max_epochs={int(late.group(1)) + 1}"
                rc, last = train(child, Path(tmp) / "runs" / (child.stem + "-e"), [how, *args.set])
            err = "" if rc == 0 else last.replace(str(child), "CHILD")
            out[str(f)] = {"project": proj, "run_with": how, "error": err}
            print(proj, f.relative_to(args.root), how, "OK" if not err else err, flush=True)
    per: dict[str, list[int]] = {}
    for r in out.values():
        c = per.setdefault(r["project"], [0, 0])
        c[0] += not r["error"]
        c[1] += 1
    print(" ".join(f"{p} {a}/{b}" for p, (a, b) in per.items()),
          f"total {sum(a for a, _ in per.values())}/{sum(b for _, b in per.values())}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
