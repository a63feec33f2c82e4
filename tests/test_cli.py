"""The treadle command: train/validate/test/report/export/env, errors and round trips."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from treadle.checkpoint.io import find_latest_checkpoint, load_checkpoint
from treadle.checkpoint.weights import read_safetensors
from treadle.cli import main
from treadle.config import load_config

from cli_support import TINY, run

ROOT = Path(__file__).resolve().parents[1]

def saved(work):
    return yaml.safe_load((work / "config.yaml").read_text())


# -- env and help ------------------------------------------------------------------------
def test_env_command(capsys):
    rc, out, _ = run(capsys, "env")
    assert rc == 0
    assert any(line.split()[:2] == ["torch", torch.__version__] for line in out.splitlines())
    assert "treadle" in out


@pytest.mark.slow
def test_python_dash_m_treadle():
    proc = subprocess.run([sys.executable, "-m", "treadle", "env"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "python" in proc.stdout


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "usage: treadle" in capsys.readouterr().out


def test_help_shows_examples(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "examples (on the run the README makes" in out and "treadle train examples/digits/digits.yaml" in out
    for command in ("train", "validate", "test", "report", "export", "env"):
        rc, out, _ = run(capsys, command, "--help")
        assert rc == 0 and "example:" in out and f"treadle {command}" in out


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], []])
def test_help_is_printed_without_importing_torch(argv):
    """The help answers at once: torch is imported only when a command runs (its time is
    benchmarks/help_time.py's)."""
    probe = f"import sys; from treadle.cli import main; main({argv!r}); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "usage: treadle" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "False"


# -- train --------------------------------------------------------------------------------
def test_train_writes_the_run_directory(tiny, tmp_path, capsys):
    work = tmp_path / "run"
    rc, out, _ = run(capsys, "train", tiny, "--work-dir", work)
    assert rc == 0
    assert (work / "log.jsonl").is_file() and find_latest_checkpoint(work / "checkpoints") is not None
    assert "val/acc" in out and "final metrics" in out
    cfg = saved(work)
    assert cfg["work_dir"] == str(work) and cfg["max_epochs"] == 2 and cfg["optimizer"]["momentum"] == 0.9


def test_round_trip_of_the_resolved_config(tiny, tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    assert run(capsys, "train", tiny, "--work-dir", first, "--set", "optimizer.lr=0.05", "max_epochs=1")[0] == 0
    cfg = saved(first)
    assert load_config(first / "config.yaml", mode="train") == cfg  # it resolves to itself
    assert run(capsys, "train", first / "config.yaml", "--work-dir", second)[0] == 0
    again = saved(second)
    assert again.pop("work_dir") == str(second) and cfg.pop("work_dir") == str(first)
    assert again == cfg


def test_default_work_dir_is_runs_slash_config_name(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "train", tiny, "--set", "max_epochs=1")[0] == 0
    assert saved(tmp_path / "runs" / "tiny")["work_dir"] == os.path.join("runs", "tiny")


def test_set_overrides_reach_the_run(tiny, tmp_path, capsys):
    work = tmp_path / "run"
    rc, _, _ = run(capsys, "train", tiny, "--work-dir", work, "--seed", "5", "--set", "max_epochs=1",
                   "optimizer.lr=1e-2", "clip_grad={max_norm: 1.0}", "--set",
                   "hooks=[{type: EarlyStoppingHook, monitor: val/acc, patience: 2}]", "train_dataloader.batch_size=16")
    assert rc == 0
    cfg = saved(work)
    assert cfg["optimizer"] == {"type": "SGD", "lr": 0.01, "momentum": 0.9} and isinstance(cfg["optimizer"]["lr"], float)
    assert cfg["clip_grad"] == {"max_norm": 1.0} and cfg["seed"] == 5 and cfg["max_epochs"] == 1
    assert cfg["hooks"] == [{"type": "EarlyStoppingHook", "monitor": "val/acc", "patience": 2}]
    records = [yaml.safe_load(line) for line in (work / "log.jsonl").read_text().splitlines()]
    assert max(r["iter"] for r in records) == 2  # 32 samples / batch 16, one epoch


def test_resume(tiny, tmp_path, capsys):
    work = tmp_path / "run"
    assert run(capsys, "train", tiny, "--work-dir", work, "--set", "max_epochs=1")[0] == 0
    rc, out, _ = run(capsys, "train", work / "config.yaml", "--resume", "--set", "max_epochs=2")
    assert rc == 0 and saved(work)["resume"] is True
    assert (work / "checkpoints" / "epoch_0002").is_dir()
    rc, _, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "other", "--resume", tmp_path / "missing")
    assert rc == 2 and not (tmp_path / "other").exists()
    # The option is named, not the config file: the config is not what was wrong.
    assert err.startswith(f"treadle train: error: --resume {tmp_path / 'missing'}: no such checkpoint"), err
    rc, _, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "other", "--resume", work)
    assert rc == 2 and not (tmp_path / "other").exists() and len(err.strip().splitlines()) == 1
    assert err.startswith(f"treadle train: error: --resume {work} is a directory but not a checkpoint"), err
    assert f"the last saved is {work / 'checkpoints' / 'epoch_0002'}" in err and str(tiny) not in err
    rc, _, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "wider", "--resume", work / "checkpoints" / "epoch_0002",
                     "--set", "model.classes=5")  # a checkpoint that does not fit: one line, status 2
    assert rc == 2 and err.startswith("treadle train: error: resume needs the model the checkpoint was saved from")
    assert "Traceback" not in err


def test_resume_into_a_mistyped_work_dir_warns_and_strict_resume_refuses(tiny, tmp_path, capsys, caplog):
    first, typo = tmp_path / "runs" / "first", tmp_path / "runs" / "frist"
    assert run(capsys, "train", tiny, "--work-dir", first, "--set", "max_epochs=1")[0] == 0
    rc, _, err = run(capsys, "train", tiny, "--work-dir", typo, "--strict-resume", "--set", "max_epochs=1")
    assert rc == 2 and not typo.exists() and len(err.strip().splitlines()) == 1
    assert err.startswith(f"treadle train: error: --strict-resume: no checkpoint in {typo / 'checkpoints'} (did you "
                          f"mean {first}? it holds checkpoints)"), err
    caplog.clear()
    rc, _, _ = run(capsys, "train", tiny, "--work-dir", typo, "--resume", "--set", "max_epochs=1")
    said = [r for r in caplog.records if "no checkpoint in" in r.getMessage()]
    assert rc == 0 and len(said) == 1 and said[0].levelname == "WARNING"  # trains, and says so above the INFO lines
    assert said[0].getMessage() == (f"resume=True: no checkpoint in {typo / 'checkpoints'} (did you mean {first}? it "
                                    "holds checkpoints); starting from scratch")
    rc, _, _ = run(capsys, "train", tiny, "--work-dir", first, "--strict-resume", "--set", "max_epochs=2")
    assert rc == 0 and (first / "checkpoints" / "epoch_0002").is_dir()


def test_a_work_dir_that_cannot_be_created_is_a_usage_error(tiny, tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    where = tmp_path / "file" / "run"
    rc, _, err = run(capsys, "train", tiny, "--work-dir", where, "--set", "max_epochs=1")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"treadle train: error: work_dir {where}: cannot create it (Not a directory); expected a "
                          "directory this process may write (--work-dir DIR"), err


def test_a_run_without_validation_says_so_instead_of_an_empty_table(tiny, tmp_path, capsys):
    rc, out, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "run", "--set", "val_dataloader=null",
                       "metrics=null", "max_epochs=1")
    assert rc == 0, err
    assert f"final metrics ({tmp_path / 'run'}): none, no validation ran (a val_dataloader gives one)" in out
    assert "┏" not in out  # no table


# -- errors: one message, status 2, nothing written ------------------------------------------
ERRORS = [
    (["--set", "max_epoch=3"], "max_epoch: unknown key (got 3); expected a treadle.Trainer argument. "
                               "Did you mean 'max_epochs'?"),
    (["--set", "log_interval=often"], "log_interval: wrong type str (got 'often'); expected an int >= 1"),
    (["--set", "max_epochs=0"], "max_epochs: out of range (got 0); expected an int >= 1"),
    (["--set", "optimizer.lr=-0.1"], "optimizer.lr: out of range (got -0.1); expected a number >= 0"),
    (["--set", "optimizer=null"], "optimizer: missing required key for `treadle train`"),
    (["--set", "max_iters=10"], "max_epochs, max_iters: mutually exclusive"),
    (["--set", "model.type=TinyNt"], "model.type: unknown model type (got 'TinyNt')"),
    (["--set", "loss_fn.type=CrossEntropy"], "loss_fn.type: unknown loss type (got 'CrossEntropy')"),
    (["--set", "hooks=[{type: EarlyStopingHook}]"], "hooks[0].type: unknown hook type (got 'EarlyStopingHook'); "),
    (["--set", "optimizer.type=AdamX"], "optimizer.type: unknown optimizer type (got 'AdamX'); "),
    (["--set", "model.dimm=4"], "model.dimm: unknown argument for TinyNet (got 4)"),
    (["--set", "val_dataloader.dataset.n=-3"], "val_dataloader.dataset: make_data(n=-3, seed=1) failed"),
    (["--set", "strategy={type: ddp, bucket: 3}"], "strategy: strategy 'ddp': bad options ['bucket']"),
    # the mesh keys reach the strategy from --set (tp_plan's keys too): one process has no room for tp=2
    (["--set", "strategy.type=fsdp", "strategy.tp=2", "strategy.tp_plan.fc1=colwise", "strategy.tp_plan.fc2=rowwise"],
     "dp_replicate=1 x tp=2 = 2 does not divide the 1 process(es) of this job"),
    (["--set", "strategy.type=fsdp", "strategy.tp=2", "strategy.tp_plan.fc1=colwize"],
     "strategy: strategy 'fsdp': tp_plan['fc1']='colwize' is not a style treadle knows (did you mean 'colwise'?)"),
    (["--set", "nope"], "--set nope: an override must look like KEY=VALUE"),
    (["--nproc", "0"], "--nproc 0: must be >= 1"),
    (["--nproc", "2", "--max-restarts", "-1"], "--max-restarts -1: must be >= 0"),
    (["--max-restarts", "1"], "--max-restarts 1 needs --nproc N"),
]


def test_an_error_in_what_set_wrote_is_blamed_on_set_not_the_file(tiny, tmp_path, capsys):
    for args, key in ((["--set", "max_epoch=3"], "max_epoch"), (["--set", "optimizer.lrr=3"], "optimizer.lrr"),
                      (["--set", "log_interval=often"], "log_interval")):
        rc, _, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "run", *args)
        assert rc == 2 and err.startswith(f"treadle train: config error: --set: {key}: "), err
    rc, _, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "run", "--set", "model.type=TinyNt",
                     "optimizer.lr=0.5")  # the error is in the first override, not in the file
    assert rc == 2 and err.startswith("treadle train: config error: --set: model.type: "), err


@pytest.mark.parametrize("args, message", ERRORS, ids=[m.split(":")[0] for _, m in ERRORS])
def test_config_errors_exit_2_and_write_nothing(tiny, tmp_path, capsys, args, message):
    work = tmp_path / "run"
    rc, out, err = run(capsys, "train", tiny, "--work-dir", work, *args)
    assert rc == 2
    assert message in err, err
    assert err.startswith("treadle train: ") and len(err.strip().splitlines()) == 1  # one message
    assert "Traceback" not in err + out
    assert not work.exists()


def test_malformed_and_missing_config_files(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {type: support.TinyNet}\noptimizer: [a\n  b: 1\n")
    rc, _, err = run(capsys, "train", bad, "--work-dir", tmp_path / "w")
    assert rc == 2 and f"{bad}: malformed YAML at line 3, column 4" in err
    rc, _, err = run(capsys, "train", tmp_path / "nope.yaml", "--work-dir", tmp_path / "w")
    assert rc == 2 and "nope.yaml: no such config file" in err
    assert not (tmp_path / "w").exists()


def test_an_existing_work_dir_is_left_untouched(tiny, tmp_path, capsys):
    work = tmp_path / "run"
    work.mkdir()
    (work / "notes.txt").write_text("keep")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in work.iterdir())
    assert run(capsys, "train", tiny, "--work-dir", work, "--set", "optimizer.type=Adamw")[0] == 2
    assert sorted((p.name, p.stat().st_mtime_ns) for p in work.iterdir()) == before


def test_debug_shows_the_traceback(tiny, tmp_path, capsys):
    rc, _, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "w", "--debug", "--set", "model.dimm=4")
    assert rc == 2 and "Traceback" in err and "model.dimm: unknown argument" in err


@pytest.mark.slow
def test_error_from_a_real_process_has_no_traceback(tiny, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run([sys.executable, "-m", "treadle", "train", str(tiny), "--work-dir", str(tmp_path / "w"),
                           "--set", "max_epochs=zero"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("treadle train: config error: --set: max_epochs: wrong type str (got 'zero'); "
                                   "expected an int >= 1, or null")
    assert not (tmp_path / "w").exists()


# -- --safe: configs from less trusted places run no code ---------------------------------
SAFE_REFUSAL = "safe mode allows only registered names and torch.nn / torch.optim classes, not this dotted import path"


def os_system_config(marker):
    """TINY with ``os.system("touch MARKER")`` as its model."""
    return TINY.replace("model: {type: support.TinyNet}", f'model: {{type: os.system, command: "touch {marker}"}}')


def _marker_module(tmp_path, monkeypatch, marker, name):
    """A module on sys.path that writes ``marker`` when imported (it must never be)."""
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef collate(b):\n    return b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize("attack", ["os.system", "--set Popen", "collate_fn"])
def test_safe_refuses_code_a_config_names(tiny, tmp_path, capsys, monkeypatch, attack):
    marker, work = tmp_path / "MARKER", tmp_path / "run"
    config, args = tiny, []
    if attack == "os.system":
        config = tmp_path / "evil.yaml"
        config.write_text(os_system_config(marker))
        key = "model.type"
    elif attack == "--set Popen":
        args, key = ["--set", "model.type=subprocess.Popen", f"model.args=[touch, {marker}]"], "model.type"
    else:
        _marker_module(tmp_path, monkeypatch, marker, "cli_collate_marker")
        config = ROOT / "examples/digits/digits.yaml"  # every other name in it is allowed
        args, key = ["--set", "train_dataloader.collate_fn=cli_collate_marker.collate"], "train_dataloader.collate_fn"
    rc, out, err = run(capsys, "train", config, "--safe", "--work-dir", work, *args)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err + out
    source = "--set" if args else config  # the line names what wrote the name: --set, or the file
    assert err.startswith(f"treadle train: config error: {source}: {key}: {SAFE_REFUSAL} (got "), err
    assert not marker.exists() and not work.exists()


def test_without_safe_a_config_is_code(tmp_path, capsys):
    """What docs/config.md says ("Configs are code"): a dotted type is imported and called."""
    marker = tmp_path / "MARKER"
    config = tmp_path / "evil.yaml"
    config.write_text(os_system_config(marker))
    rc, _, err = run(capsys, "train", config, "--work-dir", tmp_path / "run")
    assert rc == 2 and "model: built a int, not a torch.nn.Module" in err
    assert marker.exists()


@pytest.mark.parametrize("command", ["train", "validate", "test"])
def test_safe_refuses_python_configs_and_bases(tmp_path, capsys, command):
    marker = tmp_path / "MARKER"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    top = tmp_path / "top.yaml"
    top.write_text("_base_: evil.py\nmodel: {type: DigitsCNN}\n")
    extra = [] if command == "train" else ["--checkpoint", tmp_path]
    rc, _, err = run(capsys, command, top, "--safe", *extra)
    assert rc == 2 and err.strip() == (f"treadle {command}: config error: {top}: _base_: safe mode refuses the Python "
                                       "base 'evil.py': loading it would run its code; expected YAML bases "
                                       "(.yaml, .yml)")
    rc, _, err = run(capsys, command, tmp_path / "evil.py", "--safe", *extra)
    assert rc == 2 and err.strip() == (f"treadle {command}: config error: {tmp_path / 'evil.py'}: safe mode refuses "
                                       "Python config files: loading one runs its code; expected a YAML config "
                                       "(.yaml, .yml)")
    assert not marker.exists()


def test_safe_trains_and_validates_with_registered_names_and_torch_classes(tmp_path, capsys):
    work = tmp_path / "run"
    rc, _, err = run(capsys, "train", ROOT / "examples/digits/digits.yaml", "--safe", "--work-dir", work, "--set",
                     "max_epochs=null", "max_iters=2", "val_interval=2", "loss_fn.type=torch.nn.CrossEntropyLoss",
                     "log_writers=[jsonl]", "progress=false", "val_dataloader.dataset.type=digits")
    assert rc == 0, err
    assert saved(work)["loss_fn"] == {"type": "torch.nn.CrossEntropyLoss"}
    rc, out, err = run(capsys, "validate", work / "config.yaml", "--safe", "--checkpoint",
                       find_latest_checkpoint(work / "checkpoints"))
    assert rc == 0 and "val/acc" in out, err


# -- validate, test, export, report --------------------------------------------------------
@pytest.fixture
def trained(tiny, tmp_path, capsys):
    work = tmp_path / "trained"
    assert run(capsys, "train", tiny, "--work-dir", work, "--set", "ema={momentum: 0.5}",
               "test_dataloader={dataset: {type: support.make_data, n: 8, seed: 2}, batch_size: 8}")[0] == 0
    return work, find_latest_checkpoint(work / "checkpoints")


def test_validate_and_test_a_checkpoint(trained, capsys):
    work, ckpt = trained
    rc, out, _ = run(capsys, "validate", work / "config.yaml", "--checkpoint", ckpt)
    assert rc == 0 and "val/acc" in out and "val/loss" in out
    rc, out, _ = run(capsys, "test", work / "config.yaml", "--checkpoint", ckpt)
    assert rc == 0 and "test/acc" in out
    rc, _, err = run(capsys, "validate", work / "config.yaml", "--checkpoint", work / "nope")
    assert rc == 2 and "--checkpoint" in err and "no such file" in err


def test_validate_of_an_ema_run_uses_the_averaged_weights_as_training_did(trained, capsys):
    from treadle.logging import read_jsonl

    work, ckpt = trained
    last = [r for r in read_jsonl(work / "log.jsonl") if r.get("mode") == "val"][-1]
    results = {}
    for flag in ([], ["--ema"], ["--no-ema"]):
        rc, _, _ = run(capsys, "validate", work / "config.yaml", "--checkpoint", ckpt, "--work-dir", work / "v", *flag)
        assert rc == 0
        results[tuple(flag)] = [r for r in read_jsonl(work / "v" / "log.jsonl") if r.get("mode") == "val"][-1]
    assert results[()]["val/loss"] == results[("--ema",)]["val/loss"] == pytest.approx(last["val/loss"], rel=1e-6)
    assert results[("--no-ema",)]["val/loss"] != results[()]["val/loss"]


def test_validate_uses_the_checkpoint_weights(trained, tmp_path, capsys):
    work, ckpt = trained
    # Random weights and the trained ones give different losses: the weights were loaded.
    rc, out_trained, _ = run(capsys, "validate", work / "config.yaml", "--checkpoint", ckpt)
    other = tmp_path / "fresh"
    assert run(capsys, "train", work / "config.yaml", "--work-dir", other, "--set", "max_epochs=1", "seed=9")[0] == 0
    rc, out_other, _ = run(capsys, "validate", work / "config.yaml", "--checkpoint",
                           find_latest_checkpoint(other / "checkpoints"))
    loss = lambda out: next(line for line in out.splitlines() if "val/loss" in line)  # noqa: E731
    assert loss(out_trained) != loss(out_other)


@pytest.mark.parametrize("ema", [False, True])
def test_export_matches_the_checkpoint_weights(trained, tmp_path, capsys, ema):
    work, ckpt = trained
    out_file = tmp_path / "model.safetensors"
    rc, out, _ = run(capsys, "export", ckpt, "--out", out_file, *(["--ema"] if ema else []))
    assert rc == 0 and str(out_file) in out
    exported = read_safetensors(out_file)
    state = load_checkpoint(ckpt)["state.pt"]
    # The EMA's weights are in the EMAHook's state of a full checkpoint.
    weights = state["hooks"]["EMAHook"]["ema"]["module"] if ema else state["model"]
    assert set(exported) == set(weights)
    for k, v in weights.items():
        assert torch.equal(exported[k], v.cpu()), k
    if ema:  # momentum 0.5 after 8 steps: the average differs from the weights
        assert any(not torch.equal(weights[k], state["model"][k]) for k in weights)


def test_export_errors(tiny, trained, tmp_path, capsys):
    rc, _, err = run(capsys, "export", tmp_path / "nope", "--out", tmp_path / "x.safetensors")
    assert rc == 2 and "no such checkpoint" in err and not (tmp_path / "x.safetensors").exists()
    work = tmp_path / "no_ema"
    assert run(capsys, "train", tiny, "--work-dir", work, "--set", "max_epochs=1")[0] == 0
    rc, _, err = run(capsys, "export", find_latest_checkpoint(work / "checkpoints"), "--ema", "--out",
                     tmp_path / "x.safetensors")
    assert rc == 2 and "the run had no EMA" in err and not (tmp_path / "x.safetensors").exists()


def test_export_out_must_be_a_file_or_folder_it_can_create(trained, tmp_path, capsys):
    _, ckpt = trained
    out_dir = tmp_path / "exports"
    out_dir.mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("k")
    (tmp_path / "afile").write_text("x")
    for out, error in [(out_dir, f"{ckpt}: records no Hugging Face config (the model is a support.TinyNet), which a "
                                 "folder export needs; export the weights alone with --out FILE.safetensors"),
                       (full, f"--out {full}: the folder exists and is not empty; export into a new or empty folder"),
                       (tmp_path / "afile", f"--out {tmp_path / 'afile'}: exists and is not a folder"),
                       (tmp_path / "afile" / "m.safetensors", f"{tmp_path / 'afile'} is not a directory"),
                       (tmp_path / "afile" / "sub" / "m.safetensors", f"{tmp_path / 'afile'} is not a directory"),
                       (tmp_path / "m.safetensors", "--merge applies to a folder export")]:
        before = sorted(p.name for p in tmp_path.iterdir())
        flags = ["--merge"] if str(out).endswith("m.safetensors") and out.parent == tmp_path else []
        rc, out_text, err = run(capsys, "export", ckpt, "--out", out, *flags)
        assert rc == 2, err
        assert err.startswith("treadle export: error: ") and error in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and out_text == ""
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no scratch file
        assert list(out_dir.iterdir()) == [] and (tmp_path / "afile").read_text() == "x"
        assert [p.name for p in full.iterdir()] == ["keep.txt"]
    # A missing parent directory is created, as by export_safetensors.
    rc, out_text, _ = run(capsys, "export", ckpt, "--out", tmp_path / "new" / "m.safetensors")
    assert rc == 0 and read_safetensors(tmp_path / "new" / "m.safetensors")


def test_export_write_failure_is_one_line(trained, tmp_path, capsys, monkeypatch):
    from treadle.checkpoint import weights

    _, ckpt = trained

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "m.safetensors"))

    monkeypatch.setattr(weights, "export_safetensors", denied)
    rc, _, err = run(capsys, "export", ckpt, "--out", tmp_path / "m.safetensors")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"export to {tmp_path / 'm.safetensors'} failed: [Errno 13] Permission denied" in err


def test_report(trained, tmp_path, capsys):
    work, _ = trained
    rc, out, _ = run(capsys, "report", work)
    summary = work / "report" / "summary.md"
    assert rc == 0 and out.strip() == str(summary) and summary.is_file()
    assert (work / "report" / "loss.png").is_file()
    rc, out, _ = run(capsys, "report", work, work, "--out", tmp_path / "cmp")
    assert rc == 0 and (tmp_path / "cmp" / "summary.md").is_file()
    rc, _, err = run(capsys, "report", tmp_path / "empty")
    assert rc == 2 and "not a run directory (no log.jsonl)" in err


# -- several processes -------------------------------------------------------------------
@pytest.mark.slow
def test_train_nproc_2_launches_two_ddp_processes(tiny, tmp_path):
    """`treadle train CONFIG --nproc 2` goes through torch.distributed.run's API: two
    ranks on gloo, one set of files written by rank 0."""
    work = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # gloo: a GPU machine's one GPU is not two
    proc = subprocess.run([sys.executable, "-m", "treadle", "train", str(tiny), "--nproc", "2", "--work-dir", str(work)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # aligned to the longest key, which a CUDA build adds
    assert re.search(r"^world size +2$", (work / "env.txt").read_text(), re.M)
    records = [r for r in map(yaml.safe_load, (work / "log.jsonl").read_text().splitlines()) if r["mode"] == "train"]
    assert [r["iter"] for r in records] == [2, 4]  # 32 samples / (8 x 2 ranks) = 2 iterations per epoch
    latest = find_latest_checkpoint(work / "checkpoints")
    assert {"rng_rank0.pt", "rng_rank1.pt"} <= {p.name for p in latest.iterdir()}
    assert saved(work)["max_epochs"] == 2
    assert proc.stdout.count("final metrics") == 1  # printed by rank 0 only
    assert proc.stdout.count("treadle train: --nproc 2: each process reads batches of 8, so an optimizer step "
                             "trains on a global batch of 16") == 1  # said once, by the launcher


def test_nproc_note_says_the_global_batch_and_the_shared_cores(monkeypatch):
    import torch

    from treadle.cli import _nproc_note

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    line = _nproc_note({"train_dataloader": {"batch_size": 32}, "accumulate": 2}, 2)
    assert "a global batch of 128 (32 x 2 processes x accumulate 2; the learning rate is as configured)" in line
    assert "2 processes x 2 torch threads share 2 cores" in line and "OMP_NUM_THREADS=1 gives each process 1" in line
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert "share" not in _nproc_note({"train_dataloader": {"batch_size": 32}}, 2)


def test_worker_argv_drops_the_launch_options():
    from treadle.cli import _worker_argv

    assert _worker_argv(["train", "c.yaml", "--nproc", "4", "--seed", "1"]) == ["train", "c.yaml", "--seed", "1"]
    assert _worker_argv(["train", "--nproc=2", "c.yaml"]) == ["train", "c.yaml"]
    assert _worker_argv(["train", "c.yaml", "--nproc", "2", "--max-restarts", "1", "--seed", "1"]) == \
        ["train", "c.yaml", "--seed", "1"]
    assert _worker_argv(["train", "--max-restarts=3", "c.yaml", "--nproc=2"]) == ["train", "c.yaml"]


def test_an_elastic_restart_resumes_as_resume_does_and_the_first_attempt_does_not(tmp_path, monkeypatch, capsys):
    """TORCHELASTIC_RESTART_COUNT > 0 (a restart under --max-restarts, of `treadle train
    --nproc` or torchrun): resume=True, unless a given checkpoint path is still the newest
    (nothing saved in the work dir yet). The real restart: tests/strategies/test_elastic.py."""
    from treadle.checkpoint.io import save_checkpoint
    from treadle.cli import _resume_on_restart

    work = tmp_path / "run"

    def after(attempt, resume):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
        cfg = {"work_dir": str(work), "resume": resume}
        _resume_on_restart(cfg)
        return cfg["resume"]

    assert [after(0, r) for r in (False, True, "a/ckpt")] == [False, True, "a/ckpt"]
    assert [after(1, r) for r in (False, None, True, "a/ckpt")] == [True, True, True, "a/ckpt"]
    assert "restart 1 of an elastic job: resuming from the latest verified checkpoint in " + str(work) in \
        capsys.readouterr().out
    save_checkpoint(work / "checkpoints" / "iter_00000003", {"state.pt": {"x": 1}})
    assert after(2, "a/ckpt") is True  # the run has saved since: its own latest checkpoint
