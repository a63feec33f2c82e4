"""treadle, Lightning, Accelerate, MMEngine and Ignite through the same tests, side by side:
one table (markdown) and every result behind it (JSON).

Every engine trains the same model on the same data with the same seed
(``benchmarks/peers_engines/peers_common.py``), each through a script of its own set up as
its documentation recommends (``benchmarks/peers_engines/run_<engine>.py``, whose
docstrings name the pages), on the CPU, 2 processes on gloo where there are two
(``benchmarks/peers_faults.py`` runs them and reads the outcome):

* ``resume``: killed with SIGKILL inside an epoch (before a step drawn at random, the same
  steps for every engine), resumed the engine's documented way; the final weights against
  an uninterrupted run's: bit-equal, or the largest difference. Two uninterrupted runs
  are compared too: an engine that does not repeat itself cannot resume exactly.
* ``fail``: rank 1 of 2 raises in its 3rd step, under the engine's launcher: seconds from
  the raise until the launcher has exited, its status, processes left 3 s after.
* ``hang``: rank 1 of 2 sleeps forever in its 3rd step: with the engine's defaults and with
  its process-group timeout (treadle: its stall timeout) set to ``--short-timeout``
  seconds: seconds until the job has ended (or "not within" the cap), status, processes
  left, whether (and when) the output names rank 1 as the stuck one.
* ``pickle``: a checkpoint each of whose pickled files in turn gets a pickled call that
  writes a marker file; does the engine's resume run it?
* ``speed``: ``benchmarks/peers.py --workloads mlp --clock process``, steady-state CPU
  time per step over a hand-written loop's (median and range of the repetitions).

    make peers-venv
    .venv-peers/bin/python benchmarks/peers_compare.py --quick                # a few minutes
    .venv-peers/bin/python benchmarks/peers_compare.py --json docs/comparison.json   # the full run

``--quick``: one uninterrupted run and 2 kill trials per engine, 1 failing job, the hang
with defaults watched for 120 s, 3 speed repetitions of ``peers.py --quick``'s 60 steps
(the engines' order, with higher ratios for those that log: not the full run's figures). The full run: two uninterrupted runs
(compared with each other), 5 kill trials, 3 failing jobs, 600 s, 10 repetitions.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "peers_engines")]
import peers_common as pc  # noqa: E402
import peers_faults as pf  # noqa: E402

NAMES = {"treadle": "treadle", "lightning": "Lightning", "accelerate": "Accelerate", "mmengine": "MMEngine",
         "ignite": "Ignite"}
PACKAGES = {"treadle": "treadle", "lightning": "lightning", "accelerate": "accelerate", "mmengine": "mmengine",
            "ignite": "ignite"}
ROWS = ("resume", "fail", "hang", "pickle", "speed")


def kill_points() -> list[int]:
    """Steps to be killed before, in a random order (seeded, the same for every engine):
    inside an epoch, after a checkpoint that is itself inside an epoch, with steps lost."""
    every, per_epoch = pc.CKPT_EVERY, pc.ITERS_PER_EPOCH
    points = [k for k in range(1, pc.TOTAL_ITERS) if k % per_epoch and (k // every * every) % per_epoch
              and k > k // every * every]
    random.Random(0).shuffle(points)
    return points


def versions(engines: list[str]) -> dict[str, str]:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for e in engines:
        out[e] = importlib.import_module(PACKAGES[e]).__version__
    return out


def machine() -> str:
    cpu = Path("/proc/cpuinfo")
    lines = cpu.read_text().splitlines() if cpu.exists() else []
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


# -- the runs -----------------------------------------------------------------------------
def resume_row(engine: str, root: Path, trials: int, repeat: bool) -> dict[str, Any]:
    ref = pf.reference(engine, root / "ref", runs=2 if repeat else 1)
    if "error" in ref:
        return ref
    out, trusted = [], False
    for k in kill_points()[:trials]:
        out.append(pf.resume_trial(engine, root, k, Path(ref["weights"]), trusted))
        trusted = trusted or "env" in out[-1]  # said once; the next trials load as that one did
    return {"repeats": ref["repeats"], "trials": out}


def speed_row(engines: list[str], quick: bool, reps: int, root: Path) -> dict[str, Any]:
    out = root / "speed.json"
    cmd = [sys.executable, str(HERE / "peers.py"), "--workloads", "mlp", "--clock", "process", "--device", "cpu",
           "--runners", ",".join(["hand", *engines]), "--reps", str(reps), "--json", str(out)]
    if quick:
        cmd.append("--quick")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not out.is_file():
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    runs = json.loads(out.read_text())["results"]["mlp"]
    hand = runs["hand"]
    result: dict[str, Any] = {"command": " ".join(cmd[1:]), "table": p.stdout}
    for e in engines:
        ratios = [r["steady_s"] / h["steady_s"] for r, h in zip(runs[e], hand)
                  if "steady_s" in r and "steady_s" in h]
        result[e] = {"ratios": ratios, "median": statistics.median(ratios) if ratios else None}
    return result


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    engines, rows = args.engines, args.rows
    results: dict[str, Any] = {e: {} for e in engines}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2 * len(engines))
    say = (lambda *a: print(*a, flush=True)) if not args.silent else (lambda *a: None)
    if "hang" in rows:  # asleep most of the time: watched while the other rows run
        defaults = {e: pool.submit(pf.job, e, root / e, "hang", None, args.cap) for e in engines}
    for e in engines:
        if "resume" in rows:
            say(f"{e}: SIGKILL then resume, {args.trials} trials")
            results[e]["resume"] = resume_row(e, root / e / "resume", args.trials, repeat=not args.quick)
        if "pickle" in rows:
            say(f"{e}: a checkpoint that would run code")
            results[e]["pickle"] = pf.pickle_trials(e, root / e / "pickle")
    if "fail" in rows:
        for e in engines:
            say(f"{e}: a failing process, {args.fail_trials} jobs")
            results[e]["fail"] = [pf.job(e, root / e / f"fail{i}", "raise", None, args.cap) for i in range(args.fail_trials)]
    if "hang" in rows:
        say(f"hung process, process-group timeout {args.short_timeout:g} s (all engines at once)")
        short = {e: pool.submit(pf.job, e, root / e, "hang", args.short_timeout, args.cap) for e in engines}
        say(f"hung process, defaults: waiting up to {args.cap:g} s after the hang")
        for e in engines:
            results[e]["hang"] = {"default": defaults[e].result(), "short": short[e].result()}
    pool.shutdown()
    if "speed" in rows:
        say("time per step (benchmarks/peers.py)")
        results["speed"] = speed_row(engines, args.quick, args.reps, root)
    return results


# -- the verdicts -------------------------------------------------------------------------
def plural(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def g(x: float) -> str:
    return f"{x:.2g}" if x < 0.01 else f"{x:.3g}"


def resume_cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"failed: {r['error']}"
    trials = r["trials"]
    n, ok = len(trials), [t for t in trials if "error" not in t]
    equal = sum(t["equal"] for t in ok)
    if not ok:
        return f"no resume: {trials[0]['error']}"
    text = f"bit-equal in {equal} of {n} trials" if equal == len(ok) else \
        f"not bit-equal in {len(ok) - equal} of {n} trials, largest difference {g(max(t['max_diff'] for t in ok))}"
    if len(ok) < n:
        text += f"; {n - len(ok)} failed: {next(t['error'] for t in trials if 'error' in t)}"
    if any("default_load" in t for t in trials):
        text += "; loads its own checkpoint only with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1"
    if r["repeats"] is not None and not r["repeats"]["equal"]:
        text += f"; two uninterrupted runs differ by {g(r['repeats']['max_diff'])}"
    return text


def job_cell(jobs: list[dict[str, Any]], hang: bool = False, short: bool = False) -> str:
    """The verdict of a failing or hung job (``hang``: whether the stuck rank was named);
    ``short``: in the README's few words."""
    ended = [j for j in jobs if j["ended"]]
    if not ended:
        text = f"not{'' if short else ' ended'} within {jobs[0]['cap_s']:g} s"
    else:
        secs = sorted(j["seconds"] for j in ended)
        statuses = "/".join(str(x) for x in sorted({j["status"] for j in ended}))
        left = max(j["left"] for j in ended)
        if short:
            text = f"ends in {statistics.median(secs):.0f} s, status {statuses}, " + (
                "none left" if not left else f"{left} left running")
        else:
            when = f"{secs[0]:g} s" if len(secs) == 1 else \
                f"{statistics.median(secs):g} s ({secs[0]:g}-{secs[-1]:g})"
            text = f"ended in {when}, status {statuses}, {left} process{'es' if left != 1 else ''} left"
            if len(ended) < len(jobs):
                text += f"; {len(jobs) - len(ended)} of {len(jobs)} not within {jobs[0]['cap_s']:g} s"
    if hang:
        named = [j for j in jobs if j.get("named")]
        if short:
            text += f"; rank 1 named at {named[0]['named_after_s']:.0f} s" if named else "; not named"
        else:
            text += f"; rank 1 named after {named[0]['named_after_s']:g} s" if named else "; the stuck rank not named"
    return text


def pickle_cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"failed: {r['error']}"
    trials = r["trials"]
    ran = sorted({Path(t["file"]).name for t in trials if t["ran_code"]})
    plain = [t for t in trials if not t["env"]]
    refused = sorted({Path(t["file"]).name for t in plain if not t["resumed"]})
    if any(t["ran_code"] for t in plain):
        return f"runs it (from {', '.join(ran)})"
    files = f"{len(plain)} file{'s' if len(plain) != 1 else ''} tried"
    text = f"nothing run ({files}; the resume refused {', '.join(refused)})" if refused else \
        f"nothing run ({files}, each resumed)"
    if ran:
        text += "; runs it once TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 lets it load its own checkpoints"
    return text


def speed_cell(r: dict[str, Any]) -> str:
    ratios = r["ratios"]
    if not ratios:
        return "failed"
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def short_cells(results: dict[str, Any], engines: list[str]) -> dict[str, dict[str, str]]:
    """The README's cells: the same verdicts in a few words (the page has them in full)."""
    out: dict[str, dict[str, str]] = {}

    def put(row: str, cell: Any) -> None:
        if all(row in results[e] for e in engines):
            out[row] = {e: cell(results[e][row]) for e in engines}

    def resume(r: dict[str, Any]) -> str:
        ok = [t for t in r.get("trials", []) if "error" not in t]
        if not ok:
            return "no resume"
        n, equal = len(r["trials"]), sum(t["equal"] for t in ok)
        text = f"bit-equal ({equal}/{n})" if equal == n else f"differs by up to {g(max(t['max_diff'] for t in ok))} " \
                                                                 f"({n - equal}/{n})"
        return text + (" *" if any("default_load" in t for t in r["trials"]) else "")

    def pickle_(r: dict[str, Any]) -> str:
        plain = [t for t in r.get("trials", []) if not t["env"]]
        if any(t["ran_code"] for t in plain):
            return "runs it"
        return "refused" + (" * (runs it with the switch)" if any(t["ran_code"] for t in r.get("trials", [])) else "")

    put("resume", resume)
    put("fail", lambda jobs: job_cell(jobs, short=True))
    if all("hang" in results[e] for e in engines):
        out["hang"] = {e: job_cell([results[e]["hang"]["default"]], hang=True, short=True) for e in engines}
        out["hang_short"] = {e: job_cell([results[e]["hang"]["short"]], hang=True, short=True) for e in engines}
    put("pickle", pickle_)
    if "speed" in results and "error" not in results["speed"]:
        out["speed"] = {e: speed_cell(results["speed"][e]) for e in engines}
    return out


def short_table(cells: dict[str, dict[str, str]], engines: list[str], args: argparse.Namespace) -> list[str]:
    """The README's rows (its header is the page's)."""
    titles = {
        "resume": f"killed with SIGKILL inside an epoch, then resumed ({plural(args.trials, 'kill point')}): final weights "
                  "against an uninterrupted run's",
        "fail": f"one process of two raises ({plural(args.fail_trials, 'job')}): the job",
        "hang": f"one process of two hangs in its step, defaults (watched {args.cap:g} s)",
        "hang_short": f"the same, the timeout for a stuck process at {args.short_timeout:g} s",
        "pickle": "a checkpoint with a pickled call, resumed from",
        "speed": f"CPU time per step over a hand-written loop's, launch-bound MLP ({args.reps} repetitions)",
    }
    return [f"| {titles[row]} | " + " | ".join(cells[row][e] for e in engines) + " |" for row in titles if row in cells]


def table(results: dict[str, Any], engines: list[str], args: argparse.Namespace) -> list[str]:
    rows = ["| | " + " | ".join(NAMES[e] for e in engines) + " |", "| --- |" + " --- |" * len(engines)]

    def row(title: str, cell: Any) -> None:
        rows.append(f"| {title} | " + " | ".join(cell(e).replace("|", "/") for e in engines) + " |")

    if "resume" in args.rows:
        row(f"killed with SIGKILL inside an epoch, then resumed ({plural(args.trials, 'kill point')}): final weights "
            "against an "
            "uninterrupted run's",
            lambda e: resume_cell(results[e]["resume"]))
    if "fail" in args.rows:
        row(f"one process of two raises ({plural(args.fail_trials, 'job')}): the job ends",
            lambda e: job_cell(results[e]["fail"]))
    if "hang" in args.rows:
        row(f"one process of two hangs (1 job), defaults, watched {args.cap:g} s",
            lambda e: job_cell([results[e]["hang"]["default"]], hang=True))
        row(f"the same, the timeout for a stuck process at {args.short_timeout:g} s",
            lambda e: job_cell([results[e]["hang"]["short"]], hang=True))
    if "pickle" in args.rows:
        row("a checkpoint with a pickled call (each pickled file in turn), resumed from",
            lambda e: pickle_cell(results[e]["pickle"]))
    if "speed" in args.rows and "error" not in results.get("speed", {"error": 1}):
        row(f"CPU time per step over a hand-written loop's, launch-bound MLP ({args.reps} repetitions)",
            lambda e: speed_cell(results["speed"][e]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer trials and a shorter watch: a few minutes")
    p.add_argument("--engines", default=",".join(NAMES), help="comma-separated, of: " + ", ".join(NAMES))
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of: " + ", ".join(ROWS))
    p.add_argument("--trials", type=int, default=None, help="kill points per engine (5; --quick 2)")
    p.add_argument("--fail-trials", type=int, default=None, help="failing jobs per engine (3; --quick 1)")
    p.add_argument("--cap", type=float, default=None, help="seconds a job is watched after its fault (600; --quick 120)")
    p.add_argument("--short-timeout", type=float, default=30.0, help="the timeout of the hang row's second column")
    p.add_argument("--reps", type=int, default=None, help="speed repetitions (10; --quick 3)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--keep", help="keep the runs' directories and logs here (default: a temporary directory)")
    p.add_argument("--silent", action="store_true", help="print only the table")
    p.add_argument("--render", metavar="JSON", help="no runs: the tables again from a results file, which is updated")
    args = p.parse_args()
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        for key, value in saved["settings"].items():
            setattr(args, key, value)
        args.engines, args.rows = saved.get("engines", list(NAMES)), saved.get("rows", list(ROWS))
        saved.update(engines=args.engines, rows=args.rows)
        cells = short_cells(saved["results"], args.engines)
        saved.update(table=table(saved["results"], args.engines, args), readme=cells,
                     readme_table=short_table(cells, args.engines, args))
        Path(args.render).write_text(json.dumps(saved, indent=1) + "\n")
        print("\n".join(saved["table"]))
        return
    args.engines, args.rows = args.engines.split(","), args.rows.split(",")
    for value, known, what in ((args.engines, NAMES, "--engines"), (args.rows, ROWS, "--rows")):
        bad = [v for v in value if v not in known]
        if bad:
            p.error(f"{what} {','.join(bad)}: unknown; expected a comma-separated list of {', '.join(known)}")
    q = args.quick
    args.trials = args.trials or (2 if q else 5)
    args.fail_trials = args.fail_trials or (1 if q else 3)
    args.cap = args.cap or (120.0 if q else 600.0)
    args.reps = args.reps or (3 if q else 10)
    begun = time.time()
    with tempfile.TemporaryDirectory(prefix="peers-compare-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        results = run(args, root)
    seconds = time.time() - begun
    settings = {k: getattr(args, k) for k in ("quick", "trials", "fail_trials", "cap", "short_timeout", "reps")}
    info = {"machine": machine(), "versions": versions(args.engines), "seconds": round(seconds),
            "command": " ".join(["benchmarks/peers_compare.py", *sys.argv[1:]]), "settings": settings,
            "engines": args.engines, "rows": args.rows}
    lines = table(results, args.engines, args)
    print("\n" + "\n".join(lines))
    print(f"\n{info['command']}: {seconds / 60:.1f} min on {info['machine']}; " +
          ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    if args.json:
        cells = short_cells(results, args.engines)
        Path(args.json).write_text(json.dumps({**info, "table": lines, "readme": cells,
                                               "readme_table": short_table(cells, args.engines, args),
                                               "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
