"""Plots and a markdown summary of one or more runs, from their ``log.jsonl``.

    from treadle.report import make_report
    make_report([Path("work_dirs/a"), Path("work_dirs/b")], Path("report"))

writes ``summary.md`` and the images that have something to show into the output
directory: ``loss.png`` (a panel per logged loss), ``train_metrics.png`` (a panel per
``train/*`` metric), ``lr.png`` (the learning rates that change; one that stays the same
is said in words in the summary), ``metrics.png`` (a panel per val metric) and
``throughput.png``. The summary embeds the images written. Needs matplotlib, imported here only when
a report is made (with the Agg canvas directly: pyplot's global backend is left
alone, so this works headless and inside a notebook alike).

Which value of a val metric is its "best": the rule the run's training used, never a
guess. The run directory's ``config.yaml`` (written by ``treadle train``) is read for
its checkpoint section: a ``best`` metric with an explicit ``rule`` ("max"/"min") is
ranked that way, as the CheckpointHook ranked it. Any other metric goes by its name,
with :func:`treadle.metrics.higher_is_better`, the rule ``best=`` and early stopping
use (losses and errors such as ``val/mae`` lower, scores such as ``val/acc`` higher).
When neither says, the summary gives no best for that metric (its final value still)
and says why under the table: a maximum would be wrong for every error metric whose
name treadle does not know, and a wrong "best" reads like a right one.
"""

from __future__ import annotations

import math
from datetime import datetime
from numbers import Real
from pathlib import Path
from typing import Any

from treadle.hooks.logger import format_value
from treadle.logging import read_jsonl
from treadle.metrics import higher_is_better

# Keys tried, in order, for a throughput already in samples per second.
SAMPLE_RATE_KEYS = ("samples_per_s", "samples/s", "samples_per_sec", "throughput")
# Keys tried for a wall-clock timestamp (unix seconds or ISO 8601 text) per record.
TIMESTAMP_KEYS = ("timestamp", "time", "wall_time")

Records = list[dict[str, Any]]
#: The images a report may hold (``<name>.png``), in the summary's order; each is written
#: only when the runs logged what it shows.
IMAGES = ("loss", "train_metrics", "lr", "metrics", "throughput")
# A learning rate whose values all lie within this fraction of each other is constant.
_CONSTANT = 1e-9


def _num(value: Any) -> float | None:
    """A record value as a float (log.jsonl writes NaN/inf as text), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, Real):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value)
    return None


def _fmt(v: float | None, key: str = "") -> str:
    """As the console prints a value of ``key`` (4 significant digits, lr as 2.00e-03)."""
    return "n/a" if v is None else format_value(key, float(v))


def resumes(records: Records) -> Records:
    """The first record after each resume of the run (it carries ``resumed_at``)."""
    return [r for r in records if _num(r.get("resumed_at")) is not None]


def _seconds(v: float) -> str:
    return f"{v:.1f} s" if v < 120 else f"{v / 60:.1f} min ({v:.0f} s)"


def load_run(run_dir: Path) -> Records:
    """The records of ``run_dir/log.jsonl``; FileNotFoundError naming the path if absent."""
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no log.jsonl in run directory {run_dir}: expected {path}")
    return read_jsonl(path)


def _labels(run_dirs: list[Path]) -> list[str]:
    """Run directory names, with the parent added where two runs share a name."""
    names = [p.resolve().name or str(p) for p in run_dirs]
    return [f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(run_dirs, names)]


def _series(records: Records, mode: str, key: str, x: str = "iter") -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for r in records:
        if r.get("mode") == mode and key in r:
            xv, yv = _num(r.get(x)), _num(r[key])
            if xv is not None and yv is not None:
                xs.append(xv)
                ys.append(yv)
    return xs, ys


def _val_keys(records: Records) -> list[str]:
    keys: dict[str, None] = {}
    for r in records:
        if r.get("mode") == "val":
            keys.update((k, None) for k in r if k.startswith("val/") and _num(r[k]) is not None)
    return list(keys)


def _val_x(runs: list[Records]) -> str:
    """Epoch when every run validated once per distinct epoch (epoch-based), else iter."""
    for records in runs:
        epochs = [r.get("epoch") for r in records if r.get("mode") == "val"]
        if any(not isinstance(e, int) or e < 1 for e in epochs) or len(set(epochs)) != len(epochs):
            return "iter"
    return "epoch"


def _throughput(records: Records) -> tuple[list[float], list[float], str]:
    """Samples/s when the records carry it, else iterations/s from the timers."""
    train = [r for r in records if r.get("mode") == "train"]
    for key in SAMPLE_RATE_KEYS:
        xs, ys = _series(train, "train", key)
        if xs:
            return xs, ys, "samples/s"
    xs, ys = [], []
    for r in train:
        it, dt, st = _num(r.get("iter")), _num(r.get("data_time")), _num(r.get("step_time"))
        if it is not None and dt is not None and st is not None and dt + st > 0:
            xs.append(it)
            ys.append(1.0 / (dt + st))
    return xs, ys, "iterations/s"


# -- timing ---------------------------------------------------------------------------
def _timestamp(record: dict[str, Any]) -> float | None:
    for key in TIMESTAMP_KEYS:
        v = record.get(key)
        if isinstance(v, str):
            try:
                return datetime.fromisoformat(v).timestamp()
            except ValueError:
                continue
        v = _num(v)
        if v is not None and math.isfinite(v):
            return v
    return None


def epoch_times(records: Records) -> tuple[dict[int, float], float, str]:
    """Seconds per epoch, total seconds, and how they were obtained.

    With a timestamp in every record (see ``TIMESTAMP_KEYS``): an epoch lasts from
    the last record of the previous epoch (for the first: the first record) to its
    own last record, validation included; the total is their sum (the work before the
    first record is not seen). A resumed run's first record carries ``resumed_at``,
    when that fit started: the time before it (the pause between the two processes,
    the new one's start) counts for nothing. Otherwise an estimate from the
    timers: each train record stands for ``iter - previous iter`` iterations of
    ``data_time + step_time`` seconds (window means), attributed to that record's
    epoch; validation and checkpointing are not included.
    """
    stamped = [(r, _timestamp(r)) for r in records]
    if records and all(t is not None for _, t in stamped):
        times: dict[int, float] = {}
        prev, pauses = stamped[0][1], 0
        for r, t in stamped:
            start = _num(r.get("resumed_at"))
            if start is not None and start > prev:  # the pause before a resume is no epoch's time
                prev, pauses = min(start, t), pauses + 1  # type: ignore[type-var]  # no None: all() above
            e = r.get("epoch")
            if isinstance(e, int):  # (a record of no epoch: its time goes to the next one's)
                times[e] = times.get(e, 0.0) + t - prev  # type: ignore[operator]  # no None: all() above
                prev = t
        how = "timestamps" + (f"; {pauses} pause(s) before a resume left out" if pauses else "")
        return times, sum(times.values()), how
    times = {}
    prev_iter = 0.0
    for r in records:
        if r.get("mode") != "train":
            continue
        it, dt, st, e = _num(r.get("iter")), _num(r.get("data_time")), _num(r.get("step_time")), r.get("epoch")
        if it is None:
            continue
        if dt is not None and st is not None and isinstance(e, int):
            times[e] = times.get(e, 0.0) + (dt + st) * (it - prev_iter)
        prev_iter = it
    return times, sum(times.values()), "estimated from data_time + step_time, training only"


def best_and_final(records: Records, key: str,
                   higher: bool | None = None) -> tuple[float | None, float | None, dict[str, Any] | None]:
    """Best (NaN ignored) and final value of a val metric, and the record holding the best.

    ``higher``: whether a larger value is better; None: from the name
    (:func:`treadle.metrics.higher_is_better`), and no best (None, None) when the name
    does not say."""
    vals = [(v, r) for r in records if r.get("mode") == "val" and (v := _num(r.get(key))) is not None]
    if not vals:
        return None, None, None
    if higher is None:
        higher = higher_is_better(key)
    finite = [(v, r) for v, r in vals if math.isfinite(v)]
    if higher is None or not finite:
        return None, vals[-1][0], None
    best = (max if higher else min)(finite, key=lambda vr: vr[0])
    return best[0], vals[-1][0], best[1]


def _checkpoint_rules(run_dir: Path) -> dict[str, bool]:
    """``{metric: higher is better}`` from the run's ``config.yaml``: its checkpoint
    ``best`` with an explicit ``rule``; empty when there is none or it cannot be read."""
    import yaml  # here, as matplotlib: only when a report is made

    try:
        cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    ck = cfg.get("checkpoint") if isinstance(cfg, dict) else None
    if isinstance(ck, dict) and isinstance(ck.get("best"), str) and ck.get("rule") in ("max", "min"):
        return {ck["best"]: ck["rule"] == "max"}
    return {}


def _direction(key: str, rules: dict[str, bool]) -> tuple[bool | None, str | None]:
    """Whether a larger ``key`` is better (None: unknown), and a note for the summary
    when that is not what the name says."""
    by_name = higher_is_better(key)
    if key in rules:
        higher = rules[key]
        if higher == by_name:
            return higher, None
        name = "does not say" if by_name is None else f"says {'higher' if by_name else 'lower'} is better"
        return higher, (f"{key}: best is the {'maximum' if higher else 'minimum'}, as the checkpoint rule in "
                        f"config.yaml says (the name {name})")
    if by_name is None:
        return None, (f"{key}: no best, its name does not say whether higher or lower is better and config.yaml "
                      "gives no checkpoint rule for it")
    return by_name, None


# -- plots ------------------------------------------------------------------------------
def _figure(n: int = 1) -> tuple[Any, list[Any]]:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("make_report needs the 'matplotlib' package, which is not installed: "
                          "pip install matplotlib") from e
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(5.5 * cols, 3.8 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _finish(fig: Any, ax: Any, path: Path) -> None:
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)


def run_color(i: int) -> str:
    """The colour of the ``i``-th run in every plot of a report (matplotlib's cycle)."""
    return f"C{i % 10}"


def is_loss_key(key: str) -> bool:
    """A logged loss: ``loss``, ``loss_*``, ``*_loss``, any name holding "loss" (the rule
    the step sums losses by), but not the fp16 scaler's ``loss_scale``."""
    return "loss" in key and not key.startswith("loss_scale")


def _train_keys(runs: list[Records], wanted: Any) -> list[str]:
    """The numeric train-record keys ``wanted(key)`` accepts, in first-logged order."""
    keys: dict[str, None] = {}
    for records in runs:
        for r in records:
            if r.get("mode") == "train":
                keys.update((k, None) for k, v in r.items() if wanted(k) and _num(v) is not None)
    return list(keys)


def _plot_train_panels(runs: list[Records], labels: list[str], keys: list[str], path: Path) -> bool:
    """One panel per train-record key, every run overlaid in its colour; nothing is
    written without a key. Returns whether the image was written."""
    if not keys:
        return False
    fig, axes = _figure(len(keys))
    for ax, key in zip(axes, keys):
        for i, (records, label) in enumerate(zip(runs, labels)):
            xs, ys = _series(records, "train", key)
            if xs:
                ax.plot(xs, ys, label=label, color=run_color(i))
            for n, r in enumerate(resumes(records)):  # where the run went on after a stop
                ax.axvline(r.get("iter", 0), color=run_color(i), linestyle="--", linewidth=0.8,
                           label="resumed" if n == 0 and len(runs) == 1 else None)
        ax.set(title=f"train {key}" if "/" not in key else key, xlabel="iteration", ylabel=key.rsplit("/", 1)[-1])
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
    return True


def _plot_loss(runs: list[Records], labels: list[str], path: Path) -> bool:
    """Every logged loss (``loss`` first), one panel each."""
    keys = _train_keys(runs, is_loss_key)
    keys.sort(key=lambda k: k != "loss")  # the total first; the rest as logged
    return _plot_train_panels(runs, labels, keys, path)


def _plot_train_metrics(runs: list[Records], labels: list[str], path: Path) -> bool:
    """Every ``train/*`` metric (``Trainer(train_metrics=...)``), one panel each."""
    return _plot_train_panels(runs, labels, _train_keys(runs, lambda k: k.startswith("train/")), path)


def _lr_keys(records: Records) -> list[str]:
    return list(dict.fromkeys(k for r in records if r.get("mode") == "train" for k in r
                              if k == "lr" or k.startswith("lr/")))


def constant_lrs(records: Records) -> dict[str, float]:
    """``{key: value}`` of the logged learning rates that never changed (``lr``,
    ``lr/<optimizer>``, ...): the summary says them in words instead of a flat line."""
    out = {}
    for key in _lr_keys(records):
        ys = _series(records, "train", key)[1]
        if ys and max(ys) - min(ys) <= _CONSTANT * max(abs(y) for y in ys):
            out[key] = ys[0]
    return out


def _plot_lr(runs: list[Records], labels: list[str], path: Path) -> bool:
    """The learning rates that change; False (nothing written) when every one is constant."""
    fig, (ax,) = _figure()
    drawn = False
    styles = ("-", "--", ":", "-.")
    for i, (records, label) in enumerate(zip(runs, labels)):
        constant = constant_lrs(records)
        for j, key in enumerate(_lr_keys(records)):
            xs, ys = _series(records, "train", key)
            if xs and key not in constant:
                ax.plot(xs, ys, label=label if key == "lr" else f"{label} {key}", color=run_color(i),
                        linestyle=styles[j % len(styles)])
                drawn = True
    if not drawn:
        return False
    ax.set(title="learning rate", xlabel="iteration", ylabel="lr")
    _finish(fig, ax, path)
    return True


def _plot_metrics(runs: list[Records], labels: list[str], rules: list[dict[str, bool]], path: Path) -> Any:
    """One panel per val metric; a run keeps its colour in every panel, and its best
    point (by the rule the summary uses) is marked with a star. Returns the figure, or
    None (nothing written) when no run validated."""
    names = list(dict.fromkeys(k for records in runs for k in _val_keys(records)))
    if not names:
        return None
    x = _val_x(runs)
    fig, axes = _figure(len(names))
    for ax, name in zip(axes, names):
        starred = False
        for i, (records, label, run_rules) in enumerate(zip(runs, labels, rules)):
            xs, ys = _series(records, "val", name, x=x)
            if not xs:
                continue
            ax.plot(xs, ys, marker="o", markersize=3, label=label, color=run_color(i))
            best, _, record = best_and_final(records, name, higher=_direction(name, run_rules)[0])
            bx = _num(record.get(x)) if record is not None else None
            if best is not None and bx is not None:
                ax.plot([bx], [best], marker="*", markersize=13, linestyle="none", color=run_color(i),
                        markeredgecolor="black", markeredgewidth=0.6, label="_best")
                starred = True
        ax.set(title=f"{name} (\u2605 best)" if starred else name, xlabel="epoch" if x == "epoch" else "iteration")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
    return fig


def _plot_throughput(runs: list[Records], labels: list[str], path: Path) -> bool:
    fig, (ax,) = _figure()
    drawn, units = False, set()
    for i, (records, label) in enumerate(zip(runs, labels)):
        xs, ys, unit = _throughput(records)
        if xs:
            ax.plot(xs, ys, label=f"{label} ({unit})", color=run_color(i))
            units.add(unit)
            drawn = True
    if not drawn:
        return False
    ax.set(title="throughput", xlabel="iteration", ylabel=" / ".join(sorted(units)))
    _finish(fig, ax, path)
    return True


# -- summary ----------------------------------------------------------------------------
def _run_summary(records: Records, label: str, run_dir: Path) -> list[str]:
    lines = [f"## {label}", "", f"`{run_dir}`", ""]
    train = [r for r in records if r.get("mode") == "train"]
    if train:
        last = train[-1]
        lines.append(f"- iterations: {last.get('iter')}, epochs: {last.get('epoch')}")
        xs, ys = _series(records, "train", "loss")
        if ys:
            lines.append(f"- final train loss: {_fmt(ys[-1], 'loss')}")
        for key, value in constant_lrs(records).items():
            lines.append(f"- learning rate{'' if key == 'lr' else ' ' + key[3:]}: {_fmt(value, 'lr')} throughout")
    went_on = resumes(records)
    if went_on:
        when = ", ".join(f"{datetime.fromtimestamp(r['resumed_at']).strftime('%Y-%m-%d %H:%M')} (its first record: "
                         f"epoch {r.get('epoch')}, iter {r.get('iter')})" for r in went_on)
        lines.append(f"- resumed {'once' if len(went_on) == 1 else f'{len(went_on)} times'}: {when}; the plots "
                     "mark it with a dashed line")
    times, total, how = epoch_times(records)
    if times:
        per = list(times.values())
        lines.append(f"- total time: {_seconds(total)} ({how})")
        detail = ", ".join(f"epoch {e}: {_seconds(t)}" for e, t in times.items()) if len(times) <= 20 else ""
        lines.append(f"- time per epoch: mean {_seconds(sum(per) / len(per))}" + (f" ({detail})" if detail else ""))
    else:
        lines.append("- time: not recorded")
    lines.append("")
    keys = _val_keys(records)
    if not keys:
        return lines + ["No validation records.", ""]
    lines += ["| metric | best | final | best at |", "|---|---|---|---|"]
    rules = _checkpoint_rules(run_dir)
    notes = []
    for key in keys:
        higher, note = _direction(key, rules)
        best, final, rec = best_and_final(records, key, higher=higher)
        where = f"epoch {rec.get('epoch')}, iter {rec.get('iter')}" if rec is not None else "n/a"
        lines.append(f"| {key} | {_fmt(best, key)} | {_fmt(final, key)} | {where} |")
        if note:
            notes.append(f"- {note}")
    return lines + [""] + (notes + [""] if notes else [])


def make_report(run_dirs: list[Path], out_dir: Path) -> Path:
    """Write ``summary.md`` and the images of :data:`IMAGES` that have data for the
    runs into ``out_dir`` (and embedded in the summary); returns the path of summary.md.

    Each run directory must hold a ``log.jsonl`` (FileNotFoundError otherwise).
    Several runs are overlaid in each plot, labelled by directory name, each run in
    one colour throughout (:func:`run_color`); in ``metrics.png`` a star marks each
    run's best value of each metric, by the same rule as the summary. In the
    summary a val metric's best follows the run's checkpoint rule or the metric's
    name (none when neither says: see the module's docstring); see
    :func:`epoch_times` for how times are obtained.
    """
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("make_report needs at least one run directory")
    runs = [load_run(d) for d in run_dirs]  # every path checked before anything is written
    labels = _labels(run_dirs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {
        "loss": _plot_loss(runs, labels, out_dir / "loss.png"),
        "train_metrics": _plot_train_metrics(runs, labels, out_dir / "train_metrics.png"),
        "lr": _plot_lr(runs, labels, out_dir / "lr.png"),
        "metrics": _plot_metrics(runs, labels, [_checkpoint_rules(d) for d in run_dirs],
                                 out_dir / "metrics.png") is not None,
        "throughput": _plot_throughput(runs, labels, out_dir / "throughput.png"),
    }
    lines = ["# Training report", "", f"Runs: {', '.join(labels)}", ""]
    lines += [f"![{name}]({name}.png)" for name in IMAGES if written[name]] + [""]
    for records, label, run_dir in zip(runs, labels, run_dirs):
        lines += _run_summary(records, label, run_dir)
    summary = out_dir / "summary.md"
    summary.write_text("\n".join(lines), encoding="utf-8")
    return summary


__all__ = ["IMAGES", "best_and_final", "constant_lrs", "epoch_times", "is_loss_key", "load_run", "make_report",
           "resumes", "run_color"]
