"""The ``treadle`` command: train, validate, test, report, export, env.

Every command checks its inputs completely before it runs or writes anything; a bad
config, a missing file or a bad option prints one message (no traceback unless
``--debug``) and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from treadle.distributed.voice import FULL_TRACEBACK_ENV, full_traceback

T = TypeVar("T")

EPILOG = """examples (on the run the README makes after `make demo`: runs/first, beside the demo's runs/digits):
  treadle train examples/digits/digits.yaml --work-dir runs/first --set max_epochs=3 optimizer.lr=1e-3
  treadle train runs/first/config.yaml --resume --set max_epochs=14   # on from its latest checkpoint
  treadle validate runs/first/config.yaml --checkpoint runs/first     # the run's latest checkpoint
  treadle report runs/digits runs/first --out runs/compare
  treadle export runs/first --out model.safetensors
  treadle env

--set takes KEY=VALUE pairs (values read as YAML: 3, 1e-3, true, null, [1, 2]); nested
keys with dots (optimizer.lr), list items by index (schedulers.0.end). --set may come
anywhere and be repeated. Config keys: docs/config.md."""


class UsageError(Exception):
    """A command-line problem found before anything runs: message, exit status 2."""


class RunFailure(Exception):
    """An exception from the user's model, loss or metric during a run, which treadle
    added a hint to (treadle/hints.py): printed in a short form, exit status 1."""

    def __init__(self, error: BaseException, where: str, text_log: Path | None) -> None:
        super().__init__(str(error))
        self.error, self.where, self.text_log = error, where, text_log


class RunStopped(Exception):
    """The run met a failure outside the user's code whose whole story is one line: a
    DataLoader worker that died, a full disk met by a log writer. ``line``: the cause,
    where the run was, and what was and was not saved; printed as it is, exit status 1."""

    def __init__(self, error: BaseException, line: str) -> None:
        super().__init__(line)
        self.error, self.line = error, line


#: OS errors of a disk that takes no more writes: the run cannot go on, whichever writer met it first.
_DISK_ERRNOS = {"ENOSPC", "EDQUOT", "EROFS", "EIO"}


def _stopped_line(trainer: Any, error: BaseException) -> str | None:
    """The one line for ``error`` when it is a failure outside the user's code that
    treadle can say in full (see :class:`RunStopped`), else None."""
    import errno

    from treadle.distributed import voice

    if voice.peer_lost(error):  # another process of the job failed: the path of _peer_lost
        return None
    where = trainer.state.position()
    if dead_loader_worker(error):
        first = str(error).strip().splitlines()[0].rstrip(". ")
        cause = (f"a DataLoader worker died {where} ({first}): killed from outside or by the out-of-memory killer? "
                 "fewer num_workers, or less memory per worker")
    elif isinstance(error, OSError) and errno.errorcode.get(error.errno or -1) in _DISK_ERRNOS:
        name = f" writing {error.filename}" if error.filename else ""
        cause = f"{error.strerror or error}{name} {where}"
    else:
        return None
    return f"{cause}; {trainer.saved_note()}"


def dead_loader_worker(error: BaseException) -> bool:
    """Whether ``error`` is torch's report of a DataLoader worker process that died (from
    the loader's next batch, or from its SIGCHLD handler wherever the main thread was)."""
    text = str(error)
    return isinstance(error, RuntimeError) and text.startswith("DataLoader worker (pid") and (
        "exited unexpectedly" in text or "killed by signal" in text)


def _explained(trainer: Any, run: Callable[[], Any]) -> Any:
    """``run()`` (fit, validate or test); an exception with a treadle hint becomes a
    :class:`RunFailure` that knows where the run was and where its full traceback is;
    one that :func:`_stopped_line` can say in one line, a :class:`RunStopped`."""
    from treadle.hints import hint_of
    from treadle.logging.writers import TEXT_LOG_NAME

    try:
        return run()
    except Exception as e:
        if hint_of(e) is None:
            line = _stopped_line(trainer, e)
            if line is not None:
                raise RunStopped(e, line) from e
            raise
        log = Path(trainer.work_dir) / TEXT_LOG_NAME if trainer.work_dir is not None else None
        raise RunFailure(e, trainer.state.position(), log if log is not None and log.is_file() else None) from e


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="treadle", description="A small, exact and fast training engine for PyTorch.",
                                     epilog=EPILOG, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help: str, example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}", formatter_class=fmt)
        p.add_argument("--debug", action="store_true",
                       help=f"show the full traceback of errors (as {FULL_TRACEBACK_ENV}=1 does)")
        return p

    def config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", metavar="CONFIG", help="a .yaml/.yml or .py config file")
        p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                       help="override config keys, e.g. --set max_epochs=3 optimizer.lr=1e-3")
        p.add_argument("--safe", action="store_true",
                       help="for configs from less trusted places: run no code they name (refuse .py "
                            "configs and bases, collate_fn paths, dotted types but torch.nn/torch.optim classes)")

    p = add("train", "train a model from a config",
            "treadle train examples/digits/digits.yaml --work-dir runs/first --set max_epochs=3")
    config_args(p)
    p.add_argument("--work-dir", help="run directory (default: the config's work_dir, else runs/<config name>)")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="PATH",
                   help="resume from the latest checkpoint in the work dir, or from PATH")
    p.add_argument("--strict-resume", action="store_true",
                   help="--resume, refusing to start when the work dir holds no checkpoint (a mistyped --work-dir)")
    p.add_argument("--seed", type=int, help="seed (overrides the config's)")
    p.add_argument("--nproc", type=int, default=1,
                   help="processes to start on this machine (through torch.distributed.run's API; "
                        "each gets one GPU, or CPU with gloo)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="with --nproc: when a process fails, start them all again up to K times (torchrun's "
                        "--max-restarts); each restart resumes from the latest verified checkpoint by itself")
    for name in ("validate", "test"):
        p = add(name, f"evaluate a checkpoint on the config's {'val' if name == 'validate' else 'test'}_dataloader",
                f"treadle {name} runs/first/config.yaml --checkpoint runs/first")
        config_args(p)
        p.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint directory or weights file")
        p.add_argument("--work-dir", help="write logs here (default: console only)")
        p.add_argument("--ema", action=argparse.BooleanOptionalAction, default=None,
                       help="evaluate the checkpoint's EMA weights (default: when the config has `ema` with "
                            "use_for_val, as validation during training does)")
    p = add("report", "plots and a summary of one or more runs", "treadle report runs/digits runs/first --out runs/compare")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (with log.jsonl)")
    p.add_argument("--out", help="output directory (default: FIRST_RUN_DIR/report)")
    p = add("export", "export a checkpoint as a Hugging Face folder (a PEFT model: its adapter) or one .safetensors file",
            "treadle export runs/first --out model.safetensors")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint directory or file")
    p.add_argument("--out", required=True,
                   help="a folder to create: config.json and the weights, as from_pretrained loads them (a PEFT model: "
                        "adapter_config.json and adapter_model.safetensors); or FILE.safetensors: the weights alone")
    p.add_argument("--ema", action="store_true", help="export the EMA weights instead of the model's")
    p.add_argument("--merge", action="store_true",
                   help="a PEFT model: the base model with the adapter merged in, as a Hugging Face folder")
    p.add_argument("--base", metavar="DIR",
                   help="the base model's Hugging Face folder, for the frozen weights the checkpoint left out "
                        "(default: the folder the model was loaded from)")
    p.add_argument("--max-shard-size", metavar="SIZE",
                   help="split the weights into files of at most SIZE, e.g. 5GB or 500MB (default: 50GB, as "
                        "save_pretrained)")
    add("env", "print versions and devices (paste it into bug reports)", "treadle env")
    return parser


# -- commands ---------------------------------------------------------------------------
def _train(args: argparse.Namespace) -> int:
    from treadle.config import build_trainer, load_config
    from treadle.config.resolve import config_text
    from treadle.engine.resume_changes import apply_changes

    if args.nproc < 1:
        raise UsageError(f"--nproc {args.nproc}: must be >= 1")
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts {args.max_restarts}: must be >= 0")
    if args.max_restarts and args.nproc == 1:
        raise UsageError(f"--max-restarts {args.max_restarts} needs --nproc N (N >= 2: the processes that "
                         "are restarted); for one process use torchrun --nproc-per-node 1 --max-restarts K")
    if isinstance(args.resume, str):
        _check_resume(Path(args.resume))
    if args.strict_resume and args.resume is None:
        args.resume = True
    cfg = load_config(args.config, args.overrides, mode="train", safe=args.safe, work_dir=args.work_dir,
                      seed=args.seed, resume=args.resume)
    if cfg["work_dir"] is None:
        cfg["work_dir"] = str(Path("runs") / Path(args.config).stem)
    if args.strict_resume and cfg.get("resume") is True:
        _check_something_to_resume(Path(cfg["work_dir"]) / "checkpoints")
    if args.nproc > 1:  # the config is checked above; each process builds its own trainer
        from treadle.config.launch import check_launch
        from treadle.distributed.launch import launch_local

        check_launch(cfg, args.nproc)  # what would fail in every process once started: refused here, once
        print(_nproc_note(cfg, args.nproc))

        argv = _worker_argv(sys.argv[1:] if args.argv is None else args.argv)
        return launch_local(args.nproc, ["-m", "treadle", *argv], max_restarts=args.max_restarts)
    _resume_on_restart(cfg)
    trainer = build_trainer(cfg, "train", safe=args.safe)  # everything is built and checked before the work dir exists
    main_rank = trainer.is_main
    path = Path(cfg["work_dir"]) / "config.yaml"
    # Written by fit() once the work_dir is locked and a resume is known to fit: a refused
    # resume leaves the earlier config.yaml as it was. It records what the run uses: the
    # values a resume kept from the checkpoint (e.g. the optimizer's lr) in place of the config's.
    trainer.run_files["config.yaml"] = lambda: config_text(apply_changes(cfg, trainer.resume_changes), path)
    if main_rank:
        print(f"treadle train: run directory {cfg['work_dir']} (resolved config: {path})")
    metrics = _explained(trainer, trainer.fit)
    if main_rank and metrics:
        _print_metrics(metrics, f"final metrics ({cfg['work_dir']})")
    elif main_rank:  # no table of nothing: say why there is none
        print(f"final metrics ({cfg['work_dir']}): none, no validation ran (a val_dataloader gives one); the "
              "training losses are in the log lines above and in the run directory's log files")
    return 0


def _nproc_note(cfg: dict[str, Any], nproc: int) -> str:
    """The line said once before ``--nproc N`` starts its processes: the global batch a
    step trains on and, on the CPU, how many threads share the cores."""
    import torch

    loader, accumulate = cfg.get("train_dataloader"), cfg.get("accumulate") or 1
    batch = loader.get("batch_size") if isinstance(loader, dict) else None
    line = f"treadle train: --nproc {nproc}"
    if isinstance(batch, int):
        times = f" x accumulate {accumulate}" if accumulate > 1 else ""
        line += (f": each process reads batches of {batch}, so an optimizer step trains on a global batch of "
                 f"{batch * nproc * accumulate} ({batch} x {nproc} processes{times}; the learning rate is as configured)")
    if not torch.cuda.is_available():
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = torch.get_num_threads()
        if nproc * threads > cores:
            line += (f"; on the CPU, {nproc} processes x {threads} torch thread{'s' if threads > 1 else ''} share "
                     f"{cores} core{'s' if cores > 1 else ''}, which slows every step: OMP_NUM_THREADS="
                     f"{max(1, cores // nproc)} gives each process {max(1, cores // nproc)}")
    return line


def _check_something_to_resume(ckpt_dir: Path) -> None:
    """``--strict-resume``: the work dir holds a checkpoint, else one line (a mistyped
    ``--work-dir`` would otherwise start a new run; elastic restarts are not strict)."""
    from treadle.checkpoint.directory import list_checkpoints
    from treadle.distributed.env import restart_count

    if restart_count() == 0 and not list_checkpoints(ckpt_dir):
        from treadle.engine.resume import nothing_to_resume

        raise UsageError(f"--strict-resume: {nothing_to_resume(ckpt_dir).removeprefix('resume=True: ')}; expected "
                         "the work dir of a run that saved a checkpoint (drop --strict-resume to start from scratch)")


def _check_resume(path: Path) -> None:
    """``--resume PATH`` names a checkpoint: an error says so in the option's words."""
    from treadle.checkpoint.directory import check_resume_dir

    if not path.exists():
        raise UsageError(f"--resume {path}: no such checkpoint (no such file or directory); expected a checkpoint "
                         "directory such as runs/d/checkpoints/epoch_0003, or --resume alone for the latest one")
    try:
        check_resume_dir(path, "--resume")
    except FileNotFoundError as e:
        raise UsageError(str(e)) from e


def _set_last(argv: list[str]) -> list[str]:
    """``argv`` with every ``--set`` group moved to the end, so that ``--set`` may come
    anywhere: ``treadle train --set max_epochs=3 CONFIG`` is ``treadle train CONFIG --set
    max_epochs=3``. A group is the KEY=VALUE words after ``--set``; the first word
    without "=" (the config path) or starting with "-" ends it."""
    out: list[str] = []
    pairs: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--set" and i + 1 < len(argv) and "=" in argv[i + 1] and not argv[i + 1].startswith("-"):
            i += 1
            while i < len(argv) and "=" in argv[i] and not argv[i].startswith("-"):
                pairs.append(argv[i])
                i += 1
            continue  # (a --set without a KEY=VALUE after it stays: argparse or the config says what is wrong)
        out.append(argv[i])
        i += 1
    return out + ["--set", *pairs] if pairs else out


def _worker_argv(argv: Sequence[str]) -> list[str]:
    """The command line minus ``--nproc N`` and ``--max-restarts K`` (what every launched
    process runs)."""
    launch = ("--nproc", "--max-restarts")
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in launch:
            skip = True
        elif not a.startswith(tuple(f"{o}=" for o in launch)):
            out.append(a)
    return out


def _resume_on_restart(cfg: dict[str, Any]) -> None:
    """A restart of an elastic job (``TORCHELASTIC_RESTART_COUNT`` > 0: ``--max-restarts``
    of ``treadle train --nproc`` or of torchrun) continues the run: ``resume=True``, the
    latest verified checkpoint saved in the work dir (none yet: from scratch), as
    ``--resume`` does. A checkpoint path given to the first attempt is kept only while the
    work dir holds no checkpoint; after that the run's own saves are newer."""
    from treadle.distributed.env import restart_count

    attempt = restart_count()
    if attempt == 0 or cfg.get("resume") is True:
        return
    if isinstance(cfg.get("resume"), str):
        from treadle.checkpoint.directory import list_checkpoints

        saved = Path(cfg["work_dir"]) / "checkpoints"
        if not (saved.is_dir() and list_checkpoints(saved)):
            return
    cfg["resume"] = True
    if os.environ.get("RANK", "0") == "0":
        print(f"treadle train: restart {attempt} of an elastic job: resuming from the latest verified checkpoint "
              f"in {cfg['work_dir']}")


def _evaluate(args: argparse.Namespace) -> int:
    from treadle.config import load_config

    cfg = load_config(args.config, args.overrides, mode=args.command, safe=args.safe)
    # A run directory's latest checkpoint; one pruned by the live run meanwhile: the next newest.
    return _with_checkpoint(args.checkpoint, "--checkpoint", lambda checkpoint, note: _evaluate_on(args, cfg, checkpoint, note))


def _evaluate_on(args: argparse.Namespace, cfg: dict[str, Any], checkpoint: Path, note: str | None) -> int:
    from treadle.config import build_trainer

    if note and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 says it
        print(f"treadle {args.command}: {note}")
    ema_cfg = cfg.get("ema")
    use_ema = args.ema if args.ema is not None else (
        isinstance(ema_cfg, dict) and ema_cfg.get("use_for_val", True) is not False)
    if not use_ema:
        from treadle.checkpoint.weights import WeightsMismatchError

        try:
            trainer = build_trainer(cfg, args.command, safe=args.safe, load_from=checkpoint, work_dir=args.work_dir)
        except WeightsMismatchError as e:
            details = str(e).split("\n", 1)[-1]  # without the report's "loaded 0 entries" line
            raise UsageError(f"--checkpoint {checkpoint} does not match the model {args.config} builds (saved from "
                             f"another config?); nothing was loaded:\n{details}") from e
    else:  # the averaged weights, as the run's own validations used them
        from treadle.checkpoint.io import CheckpointError
        from treadle.checkpoint.weights import load_weights

        trainer = build_trainer(cfg, args.command, safe=args.safe, work_dir=args.work_dir)
        source = _ema_source(checkpoint, "--checkpoint", "pass --no-ema to evaluate the model's own weights")
        try:
            report = load_weights(trainer.module, source, strict=True, key="ema")
        except (CheckpointError, KeyError, ValueError) as e:
            raise UsageError(f"--checkpoint {checkpoint}: no EMA weights to evaluate ({e}); pass --no-ema "
                             "for the model's own weights") from e
        if trainer.is_main:
            print(f"EMA weights: {report}")
    metrics = _explained(trainer, trainer.validate if args.command == "validate" else trainer.test)
    if trainer.is_main:  # under torchrun every rank evaluates its share; rank 0 reports
        _print_metrics(metrics, f"{args.command}: {checkpoint}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from treadle.report import make_report

    run_dirs = [Path(d) for d in args.run_dirs]
    for d in run_dirs:
        if not (d / "log.jsonl").is_file():
            raise UsageError(f"{d}: not a run directory (no log.jsonl)")
    summary = make_report(run_dirs, Path(args.out) if args.out else run_dirs[0] / "report")
    print(summary)
    return 0


def _export(args: argparse.Namespace) -> int:
    from treadle.checkpoint.hf_export import DEFAULT_MAX_SHARD_SIZE, check_out_dir, export_folder
    from treadle.checkpoint.io import CheckpointError
    from treadle.checkpoint.safetensors_stream import parse_size
    from treadle.checkpoint.weights import export_safetensors

    to_file = str(args.out).endswith(".safetensors")
    try:
        if to_file:
            given = [flag for flag, value in (("--merge", args.merge), ("--base", args.base),
                                              ("--max-shard-size", args.max_shard_size)) if value]
            if given:
                raise UsageError(f"{given[0]} applies to a folder export; --out {args.out} is one .safetensors file")
            _check_out_file(args.out)
        else:
            check_out_dir(Path(args.out))
            if args.max_shard_size is not None:
                parse_size(args.max_shard_size)
    except ValueError as e:
        raise UsageError(f"--max-shard-size {e}") from None
    except CheckpointError as e:
        raise UsageError(str(e)) from None

    def export(checkpoint: Path, note: str | None) -> Path:
        if note:
            print(f"treadle export: {note}")
        if not to_file:
            return export_folder(checkpoint, args.out, ema=args.ema, merge=args.merge, base=args.base,
                                 max_shard_size=args.max_shard_size or DEFAULT_MAX_SHARD_SIZE)
        if args.ema:  # a run trained without EMA: says so (the file is written from the checkpoint itself)
            _ema_source(checkpoint, "", "export without --ema for the model's weights")
        return export_safetensors(checkpoint, args.out, key="ema" if args.ema else "model")

    try:  # a run directory's latest checkpoint; one pruned by the live run meanwhile: the next newest
        out = _with_checkpoint(args.checkpoint, "", export)
    except CheckpointError as e:
        raise UsageError(str(e)) from e
    except OSError as e:  # e.g. no permission to read or write (the file is written whole or not at all)
        raise UsageError(f"export to {args.out} failed: {e}") from e
    print(out)
    return 0


def _with_checkpoint(path: str, what: str, use: Callable[[Path, str | None], T]) -> T:
    """``use(checkpoint, note)`` for the checkpoint argument (treadle/engine/resume.py
    use_latest); a path that does not exist is a usage error."""
    from treadle.engine.resume import use_latest

    try:
        return use_latest(path, what, use)
    except FileNotFoundError as e:
        if Path(path).exists():  # the checkpoint was found, and reading it failed
            raise
        raise UsageError(str(e)) from e


def _check_out_file(out: str) -> None:
    """``--out`` must name a file that can be created: not an existing directory, and
    with no existing non-directory among its parents (missing ones are created)."""
    path = Path(out)
    if path.is_dir():
        raise UsageError(f"--out {out}: is a directory; expected the path of the file to write, "
                         f"e.g. {path / 'model.safetensors'}")
    if path.exists() and not path.is_file():
        raise UsageError(f"--out {out}: exists and is not a regular file; expected the path of the file to write")
    for parent in path.parents:  # the nearest one that exists must be a directory
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise UsageError(f"--out {out}: {parent} is not a directory")
            break


def _ema_source(checkpoint: Path, what: str, instead: str) -> Any:
    """What to read a checkpoint's EMA weights from (``key="ema"``): a full training
    checkpoint keeps them in the EMAHook's state (``{"ema": weights}`` is returned), a
    best-weights checkpoint under a top-level "ema" entry, a file as it may. A
    checkpoint directory of a run trained without EMA is a UsageError that says so."""
    from treadle.checkpoint.io import STATE_FILE, load_checkpoint
    from treadle.checkpoint.tensor_sources import ema_weights

    if not checkpoint.is_dir() or (checkpoint / ".metadata").is_file():  # a file, or sharded: read as it is
        return checkpoint
    state = load_checkpoint(checkpoint, files=[STATE_FILE], mmap=True)[STATE_FILE]  # read as they are used
    weights = ema_weights(state) if isinstance(state, dict) else None
    if weights is not None:
        return checkpoint if weights is state.get("ema") else {"ema": weights}
    named = f"{what} {checkpoint}".strip()
    raise UsageError(f"{named}: the run had no EMA (it was trained without ema=), so there are no EMA weights; "
                     f"{instead}")


def _env(args: argparse.Namespace) -> int:
    from treadle.env import collect_env, format_env

    print(format_env(collect_env()))
    return 0


def _print_metrics(metrics: dict[str, Any], title: str) -> None:
    """The title on a line of its own (a path in it is never wrapped), then the table, its
    values formatted as in the log lines."""
    from rich.console import Console
    from rich.table import Table

    from treadle.hooks.logger import format_value  # the log lines' format, kind by kind

    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in metrics.items():
        table.add_row(str(k), format_value(str(k), v))
    console = Console()
    console.print(title, soft_wrap=True, markup=False, highlight=False)
    console.print(table)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": _train, "validate": _evaluate, "test": _evaluate, "report": _report, "export": _export, "env": _env,
}


def _full_traceback(args: argparse.Namespace) -> bool:
    """``--debug``, or the environment variable ``TREADLE_FULL_TRACEBACK`` set (not 0)."""
    return bool(getattr(args, "debug", False)) or full_traceback()


def _fail(args: argparse.Namespace, err: Exception, status: int = 2) -> int:
    from treadle.config import ConfigError
    from treadle.distributed import voice

    if _full_traceback(args):
        traceback.print_exception(err)
    source = None
    if isinstance(err, ConfigError):
        from treadle.config.loader import blamed_on

        config = getattr(args, "config", None)
        source = err.source or (blamed_on(err.path, config, getattr(args, "overrides", None) or ())
                                if config else None)
    where = f"{source}: " if source else ""
    kind = "config error" if isinstance(err, ConfigError) else "error"
    # Said once for the job (treadle/distributed/voice.py); status 2 is bad input, whichever rank met it first.
    return voice.fail(f"treadle {args.command}: {kind}: {where}{err}", "config" if status == 2 else "error")


def _user_frame(error: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``error``'s traceback in the user's code: not in torch,
    treadle or the standard library (None when there is none)."""
    import sysconfig

    import torch

    skip = [str(Path(p).resolve()) for p in (Path(torch.__file__).parent, Path(__file__).parent,
                                             sysconfig.get_paths()["stdlib"])]
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        path = str(Path(frame.filename).resolve())
        if not any(path.startswith(s) for s in skip) and not frame.filename.startswith("<"):
            return frame
    return None


def _fail_run(args: argparse.Namespace, failure: RunFailure) -> int:
    """The short form of an error in the user's code: what, where, treadle's hint, the
    user's line, and where the full traceback is."""
    from treadle.hints import hint_of

    err = failure.error
    if _full_traceback(args):
        traceback.print_exception(err)
    message = str(err).strip().splitlines() or [""]
    lines = [f"treadle {args.command}: error {failure.where}: {type(err).__name__}: {message[0]}"
             + (" ..." if len(message) > 1 else "")]
    lines.append(f"  treadle: {hint_of(err)}")
    frame = _user_frame(err)
    if frame is not None:
        lines.append(f"  at {frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}")
    where = f"in {failure.text_log}; " if failure.text_log is not None else ""
    lines.append(f"  full traceback: {where}--debug or {FULL_TRACEBACK_ENV}=1 prints it here")
    from treadle.distributed import voice

    return voice.fail("\n".join(lines))


def _settle_heap() -> None:
    """The ``treadle`` process's last exit handler (registered by :func:`main`, before any
    of treadle's own, so it runs after them): one collection, which finalizes the cycles
    the run left (a file's last buffer written), then every object that is left frozen
    (``gc.freeze``). The interpreter's teardown then frees the process by reference
    counts, without going over all its objects several times: that took seconds per
    process on a busy machine, between a run's last step and its launcher's exit.
    Collects little in a rank, whose process group's shutdown has collected and frozen
    (treadle/distributed/comm.py)."""
    import gc

    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: bad config or arguments; 1: a
    checkpoint could not be written, e.g. disk full)."""
    import atexit

    atexit.unregister(_settle_heap)  # once per process, however often main() runs in it
    atexit.register(_settle_heap)
    parser = _parser()
    try:
        args = parser.parse_args(_set_last(list(sys.argv[1:] if argv is None else argv)))
        args.argv = list(argv) if argv is not None else None
    except SystemExit as e:  # --help (0) or an argparse error (2, message already printed)
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    return _early_config_error(args) or _run_command(args)


def _early_config_error(args: argparse.Namespace) -> int:
    """The config's errors that show without torch (treadle/config/early.py), said as
    fast as --help answers: their status, else 0. Every process of a job finds the same."""
    if args.command not in ("train", "validate", "test"):
        return 0
    from treadle.config.early import check_early
    from treadle.components.errors import ConfigError

    try:
        check_early(args.config, args.overrides, safe=args.safe)
    except ConfigError as e:
        return _fail(args, e)
    return 0


def _run_command(args: argparse.Namespace) -> int:
    """The command's status; a failure's one line printed. A non-zero status marks this
    process failed, so that it leaves without waiting for its peers (comm.mark_failed)."""
    from treadle.distributed import comm

    try:
        status = _guarded(args)
    except Exception as e:  # uncaught: its traceback, said once for the job (one process: Python prints it)
        from treadle.distributed import voice

        comm.mark_failed()
        if not (comm.is_distributed() or voice.agent_speaks()):
            raise
        return voice.fail("".join(traceback.format_exception(e)).rstrip("\n"))
    if status != 0:
        comm.mark_failed()
    return status


def _guarded(args: argparse.Namespace) -> int:
    from treadle.checkpoint.io import CheckpointError, CheckpointWriteError
    from treadle.distributed import voice
    from treadle.config import ConfigError
    from treadle.engine.run_dir import WorkDirError

    try:
        return COMMANDS[args.command](args)
    except RunFailure as e:  # the user's model, loss or metric raised: the short form, status 1
        if voice.peer_lost(e.error):
            return _peer_lost(args, e.error)
        if voice.collective_timed_out(e.error):  # in backward: DDP's all-reduce waited timeout_s for a peer
            return _timed_out(args, e.error)  # type: ignore[arg-type]  # collective_timed_out: a RuntimeError
        return _fail_run(args, e)
    except RunStopped as e:  # a dead loader worker, a full disk met by a log writer: one line, status 1
        if _full_traceback(args):
            traceback.print_exception(e.error)
        return voice.fail(f"treadle {args.command}: error: {e.line}")
    except CheckpointWriteError as e:  # disk full or another OS error at a save (sync or async): a run-time failure
        return _fail(args, e, status=1)
    except (ConfigError, UsageError, CheckpointError, WorkDirError) as e:  # e.g. a resume that does not fit
        return _fail(args, e)
    except FloatingPointError as e:  # training diverged (NaN guard, or non-finite weights at a save)
        return _fail(args, e, status=1)
    except OSError as e:  # a full disk while logging, a file that went away: one line (log.txt has the traceback)
        if voice.peer_lost(e):
            return _peer_lost(args, e)
        return _fail(args, e, status=1)
    except KeyboardInterrupt as e:  # a second Ctrl-C during fit, or one outside it
        if getattr(args, "debug", False):
            traceback.print_exception(e)
        print(f"treadle {args.command}: interrupted ({e or 'Ctrl-C'}); the last complete checkpoint is intact",
              file=sys.stderr)
        return 130
    except RuntimeError as e:
        if voice.peer_lost(e):  # a collective found another process gone: its error is the job's
            return _peer_lost(args, e)
        if voice.collective_timed_out(e):  # waited timeout_s for a peer: name it, if the stall watch saw it
            return _timed_out(args, e)
        raise


def _peer_lost(args: argparse.Namespace, err: BaseException) -> int:
    """Status 1: this process stopped because another one of the job failed, which the
    job said (treadle/distributed/voice.py: nothing more is printed); the line is
    printed only when no process said anything (one killed without a Python error)."""
    from treadle.distributed import comm, voice

    if _full_traceback(args):
        traceback.print_exception(err)
    why = comm.failure_elsewhere() or ("another process of the job ended without a Python error (killed, os._exit, "
                                       "out of memory?); the launcher's last line names it")
    return voice.follow_on(f"treadle {args.command}: stopped on rank {comm.get_rank()}: {why}")


def _timed_out(args: argparse.Namespace, err: RuntimeError) -> int:
    """Status 1: this process's collective timed out waiting for another process; as
    :func:`_peer_lost` when the job said why (the stall watch ends a stuck rank before the
    timeout), else one line with the timeout."""
    from treadle.distributed import comm, voice

    if _full_traceback(args):
        traceback.print_exception(err)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    why = comm.failure_elsewhere() or (f"a collective timed out waiting for another process ({first}); raise the "
                                       "strategy's timeout_s if a phase of one rank takes that long")
    return voice.follow_on(f"treadle {args.command}: stopped on rank {comm.get_rank()}: {why}")


__all__ = ["COMMANDS", "EPILOG", "FULL_TRACEBACK_ENV", "RunFailure", "RunStopped", "UsageError", "dead_loader_worker", "main"]
