"""Launcher inference from the environment: torchrun, SLURM, MPI, none."""

from __future__ import annotations

import os

import pytest

from treadle.distributed.env import DistEnv, detect_launcher, first_slurm_host


def test_no_launcher_is_one_process():
    assert detect_launcher({}) == DistEnv("none")
    assert not detect_launcher({}).distributed
    # A one-task SLURM allocation (e.g. salloc + python) is not a distributed run.
    assert detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).launcher == "none"


def test_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "node0", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"}
    assert detect_launcher(env) == DistEnv("torchrun", 3, 8, 1, 4, "node0", 1234)


def test_torchrun_wins_over_slurm_when_run_inside_an_allocation():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    assert detect_launcher(env).launcher == "torchrun"


def test_slurm():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "MASTER_PORT": "29600"}
    got = detect_launcher(env)
    assert (got.launcher, got.rank, got.world_size, got.local_rank, got.local_world_size, got.master_port) == \
        ("slurm", 5, 8, 1, 4, 29600)
    assert got.master_addr == "gpu07"  # no scontrol here: the first host expanded by hand


def test_first_slurm_host_without_scontrol():
    assert first_slurm_host("node[001-004,010]") == "node001"
    assert first_slurm_host("a1,a2") == "a1"


def test_openmpi_and_mpich():
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h0"}
    assert detect_launcher(ompi) == DistEnv("mpi", 2, 4, 0, 2, "h0", 29500)
    mpich = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}
    assert detect_launcher(mpich) == DistEnv("mpi", 1, 2, 1, 2, "127.0.0.1", 29500)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="WORLD_SIZE='two' must be an integer"):
        detect_launcher({"RANK": "0", "WORLD_SIZE": "two"})


def test_a_restartable_torchrun_job_sharing_the_agent_store_is_warned_about():
    from treadle.distributed.env import restart_store_hazard

    job = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1"}
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in restart_store_hazard(job)
    assert restart_store_hazard({**job, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None  # no restart, no hazard
    assert restart_store_hazard({**job, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None  # switched off
    assert restart_store_hazard({"RANK": "0", "WORLD_SIZE": "2"}) is None  # not torchrun's agent


def test_a_lost_peer_is_only_recognised_in_a_job_of_several_processes():
    """In one process a RuntimeError that reads like a lost peer (a broken pipe in a
    data pipeline) is the run's own error, shown as such."""
    from treadle.distributed import voice

    assert not voice.peer_lost(RuntimeError("[gloo] Connection closed by peer"))
    assert not voice.peer_lost(RuntimeError("DataLoader worker (pid 22765) is killed by signal: Terminated. "))


def test_in_a_job_a_loader_worker_terminated_by_the_launcher_reads_as_a_lost_peer(monkeypatch):
    """When another rank fails, the launcher terminates this rank's processes; its loader
    workers can go first, and torch's DataLoader then raises here: one line, not a traceback
    (test_fail_fast.py's SIGKILL of rank 1 met it under load)."""
    from treadle.distributed import voice

    class Job:  # torch.distributed as a process group of 2 shows it
        @staticmethod
        def get_world_size() -> int:
            return 2
    monkeypatch.setattr(voice, "_process_group", lambda: Job)
    assert voice.peer_lost(RuntimeError("DataLoader worker (pid 22765) is killed by signal: Terminated. "))
    assert voice.peer_lost(RuntimeError("[gloo] Connection closed by peer"))
    assert not voice.peer_lost(RuntimeError("DataLoader worker (pid 1) is killed by signal: Segmentation fault. "))


def test_a_torchrun_restart_that_cannot_connect_is_named_with_its_workaround_not_as_a_config_error(
        monkeypatch, tmp_path, capsys):
    """A restart under torchrun --max-restarts, whose rendezvous store is shared with the
    workers, fails to connect the process group (the failed attempt's stale address): the
    command line says so with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, status 1; no "config
    error" (what torch raises is a RuntimeError, which a config's build took for one)."""
    import torch.distributed as dist

    from cli_support import TINY, run

    def refused(*args, **kwargs):
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: "
                           "Connection refused, remote=[127.0.0.1]:24478")
    monkeypatch.setattr(dist, "init_process_group", refused)
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29555", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "1",
                       "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    rc, _, err = run(capsys, "train", config, "--work-dir", tmp_path / "run", "--set", "strategy.type=ddp")
    lines = [line for line in err.splitlines() if line.startswith("treadle train:")]
    assert rc == 1 and len(lines) == 1, err
    assert lines[0].startswith("treadle train: error: rank 0 could not connect the process group of 2 processes "
                               "(Gloo connectFullMesh failed"), lines
    assert "this is restart 1 of an elastic job" in lines[0] and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in lines[0]
    assert "config error" not in err


@pytest.mark.parametrize("given, expected", [({}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
                                             ({"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_FR_BUFFER_SIZE": "0"})])
def test_under_nccl_the_flight_recorder_is_switched_on_unless_set(monkeypatch, given, expected):
    """The process group's set-up under NCCL switches torch's flight recorder on (the stall
    watch dumps it, treadle/distributed/sentinel.py), unless its variables are set; what the
    set-up sees is checked here with CUDA and the group faked (a GPU run does it for real)."""
    import torch
    import torch.distributed as dist

    from treadle.distributed import comm
    from treadle.distributed.env import DistEnv

    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500", "TORCH_NCCL_TRACE_BUFFER_SIZE": "x"}.items():
        monkeypatch.setenv(key, value)  # the set-up writes these: put back as they were after the test
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE")
    for key, value in given.items():
        monkeypatch.setenv(key, value)
    seen: dict[str, str | None] = {}

    def init(backend, **kwargs):
        seen.update({k: os.environ.get(k) for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")},
                    backend=backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(comm, "_control_group", None)
    comm.init_distributed(DistEnv("torchrun", 0, 2, 0, 2, "127.0.0.1", 29500))
    assert seen.pop("backend") == "nccl"
    assert {k: v for k, v in seen.items() if v is not None} == expected
