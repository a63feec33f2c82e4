"""Which launcher started this process, and the rank/world it implies.

Looked up in this order (the first that matches wins):

* **torchrun / TorchElastic**: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and
  ``MASTER_ADDR``/``MASTER_PORT``) are set by the launcher.
* **SLURM** (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``; the
  master is the first host of ``SLURM_JOB_NODELIST`` (expanded by ``scontrol``),
  port ``MASTER_PORT`` or 29500.
* **OpenMPI** (``OMPI_COMM_WORLD_*``) or **MPICH/Intel MPI** (``PMI_RANK``,
  ``PMI_SIZE``, ``MPI_LOCALRANKID``); ``MASTER_ADDR`` must be exported by the user.
* **none**: one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    launcher: str  # "torchrun" | "slurm" | "mpi" | "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    value = env.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {key}={value!r} must be an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list such as ``gpu[01-04,07]``."""
    import subprocess  # here: the command line imports this module to say an error, and wants no more

    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True,
                             text=True, timeout=30).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    # Without scontrol: expand the first entry by hand ("gpu[01-04]" -> "gpu01").
    head = nodelist.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        return prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def detect_launcher(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Infer the launcher and this process's rank from the environment."""
    env = os.environ if environ is None else environ
    port = _int(env, "MASTER_PORT", 29500)
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun (and anything exporting the same)
        world = _int(env, "WORLD_SIZE")
        return DistEnv("torchrun", _int(env, "RANK"), world, _int(env, "LOCAL_RANK", 0),
                       _int(env, "LOCAL_WORLD_SIZE", world), addr, port)
    if "SLURM_PROCID" in env and _int(env, "SLURM_NTASKS", 1) > 1:
        world = _int(env, "SLURM_NTASKS")
        nodes = _int(env, "SLURM_NNODES", 1)
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        master = env.get("MASTER_ADDR") or first_slurm_host(nodelist)
        return DistEnv("slurm", _int(env, "SLURM_PROCID"), world, _int(env, "SLURM_LOCALID", 0),
                       max(world // max(nodes, 1), 1), master, port)
    if "OMPI_COMM_WORLD_RANK" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE")
        return DistEnv("mpi", _int(env, "OMPI_COMM_WORLD_RANK"), world, _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
                       _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", world), addr, port)
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        world = _int(env, "PMI_SIZE")
        return DistEnv("mpi", _int(env, "PMI_RANK"), world, _int(env, "MPI_LOCALRANKID", 0),
                       _int(env, "MPI_LOCALNRANKS", world), addr, port)
    return DistEnv("none")


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """Which restart of an elastic job this process belongs to: TorchElastic's
    ``TORCHELASTIC_RESTART_COUNT`` (0 in the first attempt, and without torchrun's agent)."""
    env = os.environ if environ is None else environ
    try:
        return max(int(env.get("TORCHELASTIC_RESTART_COUNT", "0")), 0)
    except ValueError:
        return 0


def restart_store_hazard(environ: Mapping[str, str] | None = None) -> str | None:
    """Why a torchrun restart of this job may fail to connect, or None.

    Since torch 2.5 the c10d rendezvous shares its agent's TCPStore with the workers
    (``TORCHELASTIC_USE_AGENT_STORE=True``). The store outlives a failed attempt and keeps
    its process-group keys, so a restarted rank can read a dead rank's address and fail
    to connect (pytorch/pytorch#135712, #167288). Only matters with ``--max-restarts`` > 0.
    """
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or _int(env, "TORCHELASTIC_MAX_RESTARTS", 0) < 1:
        return None
    return ("torchrun --max-restarts with the rendezvous store shared with the workers: a restart may fail "
            "to connect to a dead process's stale address (pytorch/pytorch#135712); export "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun")

