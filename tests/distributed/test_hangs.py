"""The stall watch cannot be blinded: a rank stuck in native code that holds the GIL (rank 0,
which serves the store under SLURM, or rank 1), and every rank stuck at once, end the job
within stall_timeout_s, named with their place, under `treadle train --nproc 2`, torchrun
and a SLURM-style launch; the status is not 0 and no process is left. (Each rank's
sentinel is a process of its own; treadle/distributed/watch.py.)"""

from __future__ import annotations

import re
import sys
import time

import pytest
import torch

from job_support import hang_config, left, ours, run_job, run_slurm_like, torchrun_cmd, treadle_cmd

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")]

STALL = {"type": "ddp", "stall_warn_s": 3, "stall_timeout_s": 8}
MARGIN_S = 15  # past stall_timeout_s: the sentinels' looks, the ends, the launcher; a loaded 2-core machine


def _hang(tmp_path, launcher: str, on: list[int], hang: str) -> tuple[list[int], str, float]:
    """Run the job whose ranks ``on`` hang (``hang``); the statuses (one per task under
    SLURM), the whole output, and the seconds from the first hang to the end."""
    work = tmp_path / "run"
    config = hang_config(tmp_path, hang, STALL, on=on)
    if launcher == "slurm":
        statuses, outs = run_slurm_like(config, work, tmp_path)
        out = "\n".join(outs)
    else:
        proc, _ = run_job((treadle_cmd if launcher == "nproc" else torchrun_cmd)(config, work), tmp_path, merged=True)
        statuses, out = [proc.returncode], proc.stdout
    ended = time.time()
    fault = min(float((tmp_path / f"fault.rank{r}").read_text()) for r in on)
    assert left(str(work)) == [], out[-3000:]
    return statuses, out, ended - fault


@pytest.mark.parametrize("launcher", ["nproc", "torchrun", "slurm"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_holding_the_gil_is_named_at_its_place_and_the_job_ended(tmp_path, launcher, rank):
    statuses, out, took = _hang(tmp_path, launcher, [rank], "gil")
    assert all(s != 0 for s in statuses), (statuses, out[-3000:])
    assert took < STALL["stall_timeout_s"] + MARGIN_S, (took, out[-3000:])
    warning = next(line for line in out.splitlines() if "WARNING stall:" in line)
    # (faulthandler's watchdog wrote the stack: the function without its class)
    assert re.search(rf"stall: rank {rank} has made no progress for \d+ s, in forward at iteration 5 \(forward, "
                     r"fail_fast_faults.py:\d+\)", warning), warning
    assert "its Python does not run: native code holding the GIL?" in warning, warning
    assert f"rank {1 - rank} waits (in backward at iteration 5)" in warning, warning
    stack = out[out.index(f"Python stack of rank {rank}"):]
    assert "ctypes.PyDLL(None).sleep" in stack, stack[:2000]
    verdicts = [line for line in out.splitlines() if f"rank {rank} made no progress for" in line
                and "WARNING" not in line and line.startswith("treadle: ")]
    assert len(verdicts) == 1, out[-3000:]  # said once for the job (torchrun's summary aside)
    assert "(in forward at iteration 5 (forward, fail_fast_faults.py:" in verdicts[0], verdicts
    assert "stopped on rank" not in ours(out) and "Traceback" not in ours(out), out[-3000:]


@pytest.mark.parametrize("launcher, hang", [("nproc", "sleep"), ("nproc", "gil"), ("torchrun", "gil"),
                                            ("slurm", "gil")])
def test_every_rank_stuck_ends_the_job_saying_where_each_is_and_blaming_none(tmp_path, launcher, hang):
    statuses, out, took = _hang(tmp_path, launcher, [0, 1], hang)
    assert all(s != 0 for s in statuses), (statuses, out[-3000:])
    assert took < STALL["stall_timeout_s"] + MARGIN_S, (took, out[-3000:])
    verdicts = [line for line in out.splitlines() if line.startswith("treadle: no rank made progress for")]
    assert len(verdicts) == 1, out[-3000:]
    assert "all 2 ranks in forward at iteration 5 (" in verdicts[0], verdicts
    assert "forward, fail_fast_faults.py:" in verdicts[0], verdicts  # Net.forward when its Python runs
    assert "none is blamed: the job is ended (stall_timeout_s=8)" in verdicts[0], verdicts
    assert "process of rank" not in ours(out) and "Traceback" not in ours(out), out[-3000:]


def test_the_flight_recorder_of_each_rank_is_dumped_and_named_in_the_line(tmp_path, monkeypatch):
    """With torch's flight recorder on (switched on for NCCL; here for gloo, by its variable),
    each rank whose Python runs dumps its last collectives where the line says, in torch's
    format: rank 0 entered one collective more than rank 1, which it waits in."""
    import pickle

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "200")
    statuses, out, took = _hang(tmp_path, "nproc", [1], "sleep")
    flight = tmp_path / "run" / "flight_recorder"
    verdict = next(line for line in out.splitlines() if "rank 1 made no progress for" in line and "WARNING" not in line)
    assert f"torch's flight recorder of each rank's last collectives: {flight} (python -m " \
           f"torch.distributed.flight_recorder.fr_trace {flight})" in verdict, verdict
    assert sorted(p.name for p in flight.iterdir()) == ["rank_0", "rank_1"]
    last = {r: pickle.loads((flight / f"rank_{r}").read_bytes())["entries"][-1] for r in (0, 1)}
    assert last[0]["collective_seq_id"] == last[1]["collective_seq_id"] + 1, last
    assert last[0]["profiling_name"] == "gloo:all_reduce", last  # DDP's, in backward
