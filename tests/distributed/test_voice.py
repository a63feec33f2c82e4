"""One voice for a failing job (treadle/distributed/voice.py): what `treadle train --nproc N`
can check before it starts processes is refused there, in one line; an error found after
the processes started is printed once, with no follow-on lines, and the job's status is
the same on every run (2 for a configuration error), under --nproc, torchrun, a SLURM-style
launch and a script of one's own (the Trainer, or a loop through the Strategy API)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from cli_support import TINY, run
from job_support import job_env, left, ours, run_job, run_slurm_like, torchrun_cmd, treadle_cmd
from support import fsdp_on_cpu

MESH = "strategy: {type: fsdp, dp_shard: 3, tp: 2, tp_plan: {fc1: colwise, fc2: rowwise}}\n"
MESH_LINE = ("config error: {config}: ValueError: dp_replicate=1 x dp_shard=3 x tp=2 = 6 process(es), but this job "
             "has 2; expected dp_replicate x dp_shard x tp = the number of processes")


def _config(tmp_path, extra: str):
    path = tmp_path / "job.yaml"
    path.write_text(TINY + extra)
    return path


def _launch_refused(monkeypatch):
    from treadle.distributed import launch

    def refused(*args, **kwargs):
        raise AssertionError("no process may start")
    monkeypatch.setattr(launch, "launch_local", refused)


def test_nproc_checks_the_mesh_against_the_processes_before_starting_any(tmp_path, monkeypatch, capsys):
    _launch_refused(monkeypatch)
    config = _config(tmp_path, MESH)
    rc, out, err = run(capsys, "train", config, "--nproc", "4", "--work-dir", tmp_path / "run")
    assert rc == 2 and out == "", (out, err)
    assert err.splitlines() == [f"treadle train: config error: {config}: strategy: dp_replicate=1 x dp_shard=3 x tp=2 "
                                "= 6 process(es), but this job has 4; expected dp_replicate x dp_shard x tp = the "
                                "number of processes (dp_shard=-1 takes what is left) (--nproc 4)"], err
    assert not (tmp_path / "run").exists()


def test_nproc_checks_that_tp_divides_the_heads_the_models_config_names(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    _launch_refused(monkeypatch)
    config = _config(tmp_path, "strategy: {type: fsdp, tp: 3, tp_plan: auto}\n")
    text = config.read_text().replace("model: {type: support.TinyNet}", (
        "model: {type: transformers.LlamaForCausalLM, config: {vocab_size: 64, hidden_size: 48, intermediate_size: 96,"
        " num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 4}}"))
    config.write_text(text)
    rc, _, err = run(capsys, "train", config, "--nproc", "3", "--work-dir", tmp_path / "run")
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "model.config.num_attention_heads: strategy tp=3 does not divide it; each tensor-parallel rank computes " \
           "whole heads (got 4)" in err, err


def test_nproc_refuses_tp_under_ddp_before_starting_any_naming_what_it_needs(tmp_path, monkeypatch, capsys):
    _launch_refused(monkeypatch)
    config = _config(tmp_path, "strategy: {type: ddp, backend: gloo, tp: 2}\n")
    rc, _, err = run(capsys, "train", config, "--nproc", "2", "--work-dir", tmp_path / "run")
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "strategy: strategy 'ddp': bad options ['tp']; tp: tensor parallelism and the device mesh need type: fsdp" \
           in err, err


# -- errors found after the processes started ----------------------------------------------------
def _once(out: str, line: str) -> None:
    said = ours(out)
    assert said.count(line) == 1, out[-4000:]
    assert "SIGTERM" not in said and "exit code -15" not in said and "stopped on rank" not in said, out[-4000:]


@pytest.mark.slow
def test_a_mesh_error_found_after_start_is_said_once_with_the_same_status_every_run(tmp_path):
    """torchrun starts the processes; each finds the mesh does not fit (6 ranks asked, 2
    started): the line once, torchrun's status 1 on every run; a SLURM-style launch, each
    task's status 2."""
    config = _config(tmp_path, MESH)
    for attempt in range(2):
        proc, _ = run_job(torchrun_cmd(config, tmp_path / f"run{attempt}"), tmp_path, merged=True)
        assert proc.returncode == 1, proc.stdout[-3000:]
        _once(proc.stdout, MESH_LINE.format(config=config))
    statuses, outs = run_slurm_like(config, tmp_path / "slurm", tmp_path)
    assert statuses == [2, 2], outs
    _once("".join(outs), MESH_LINE.format(config=config))
    assert left(str(tmp_path / "run1")) == []


@pytest.mark.slow
@fsdp_on_cpu
def test_a_plan_error_found_after_start_is_said_once_by_the_launcher_with_status_2_every_run(tmp_path):
    """The tp plan matches no module: only the processes, with the model built, can tell.
    Under --nproc the launcher says it once, status 2, whichever process the agent saw end
    first; the agent's own lines about the others are not shown."""
    config = _config(tmp_path, "strategy: {type: fsdp, tp: 2, tp_plan: {fc9: colwise}}\n")
    for attempt in range(2):
        proc, _ = run_job(treadle_cmd(config, tmp_path / f"run{attempt}"), tmp_path, merged=True)
        assert proc.returncode == 2, proc.stdout[-3000:]
        lines = [line for line in proc.stdout.splitlines() if "tp_plan: 'fc9' matches no module of TinyNet" in line]
        assert len(lines) == 1 and lines[0].startswith(f"treadle train: config error: {config}: "), proc.stdout[-3000:]
        _once(proc.stdout, lines[0])
        assert "process of rank" not in proc.stdout and "Traceback" not in proc.stdout, proc.stdout[-3000:]


SCRIPT = """
import sys
import torch
from torch import nn
import treadle

from support import TinyNet, make_data

kind, ranks = sys.argv[1], [int(r) for r in sys.argv[2].split(",")]
if kind == "trainer":
    trainer = treadle.Trainer(TinyNet(), train_dataloader=torch.utils.data.DataLoader(make_data(16), batch_size=4),
                              loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=2,
                              progress=False, log_writers=[], strategy={"type": "ddp"})
    trainer.fit()
    rank = trainer.strategy.rank
else:  # a loop of one's own through the Strategy API
    strategy = treadle.build_strategy("ddp")
    model, optim_wrapper = strategy.prepare(TinyNet(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    rank = strategy.rank
if rank in ranks:
    raise ValueError(f"the same mistake on every rank of {ranks} (simulated)")
torch.distributed.barrier()
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind, ranks", [("loop", "0,1"), ("loop", "1"), ("trainer", "0,1")])
def test_a_script_of_ones_own_says_its_error_once_for_the_job(tmp_path, kind, ranks):
    """A script through the Strategy API (or with the Trainer) under torchrun: the error is
    printed once (the first rank to fail), whether every rank or one raises; a rank that
    only stops because of it prints nothing."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), kind,
           ranks]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                          cwd=tmp_path, env=job_env(), start_new_session=True)
    assert proc.returncode != 0
    said = ours(proc.stdout)
    assert said.count("ValueError: the same mistake on every rank of") == 1, proc.stdout[-4000:]
    assert said.count("Traceback (most recent call last)") == 1, proc.stdout[-4000:]
    assert "stopped on rank" not in said and "Connection closed" not in said, proc.stdout[-4000:]


@pytest.mark.parametrize("rank, said", [("0", 1), ("1", 0)])
def test_a_job_warning_is_said_by_rank_0_only(monkeypatch, caplog, rank, said):
    """A warning every rank meets alike (treadle.distributed.voice.job_warning): before the
    process group is up, the launcher's environment names rank 0."""
    import logging

    from treadle.distributed.voice import job_rank, job_size, job_warning

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (job_rank(), job_size()) == (int(rank), 2)
    with caplog.at_level(logging.WARNING, logger="treadle"):
        job_warning("2 tensor(s) not in the folder")
    assert caplog.text.count("2 tensor(s) not in the folder") == said


MISTAKES = """
import sys
import torch
from torch import nn
import treadle

from support import TinyNet, make_data

mistake = sys.argv[1]
kwargs = dict(train_dataloader=torch.utils.data.DataLoader(make_data(16), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
              optimizer=dict(type="SGD", lr=0.1), max_iters=2, progress=False, log_writers=[], strategy={"type": "ddp"})
if mistake == "optimizer":  # found by the strategy's prepare, the process group up
    kwargs["optimizer"] = dict(type="NoSuchOptimizer", lr=0.1)
else:  # a misspelt argument: found before the process group is set up
    kwargs["max_epoch"] = 2
treadle.Trainer(TinyNet(), **kwargs).fit()
"""


@pytest.mark.slow
@pytest.mark.parametrize("mistake, names", [
    ("optimizer", "config error in Trainer(...): ValueError: optimizer: unknown optimizer type "
                  "'NoSuchOptimizer'"),
    ("argument", "config error in Trainer(...): TypeError: Trainer.__init__() got an unexpected keyword argument "
                 "'max_epoch'. Did you mean 'max_epochs'?"),
])
def test_a_scripts_configuration_error_under_torchrun_is_one_line_for_the_job(tmp_path, mistake, names):
    """A script's Trainer with a mistake in its arguments, under torchrun: every rank meets
    it; the job prints one line that names it, as `treadle train` does (no traceback per
    rank; torchrun's own block of about 40 lines follows, printed by its parent process)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(MISTAKES))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), mistake]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                          cwd=tmp_path, env=job_env(), start_new_session=True)
    assert proc.returncode == 1, proc.stdout[-4000:]
    said = [line for line in ours(proc.stdout).splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith(f"treadle: {names}"), proc.stdout[-4000:]
    assert said[0].endswith("(TREADLE_FULL_TRACEBACK=1 prints its traceback)"), said[0]
    assert proc.stdout.count("Traceback (most recent call last)") == 1, proc.stdout[-4000:]  # torchrun's own
    assert len(proc.stdout.splitlines()) < 50, proc.stdout  # one line and torchrun's block (about 41): 68 before
