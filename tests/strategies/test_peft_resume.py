"""PEFT models (LoRA, IA3) fine-tuned by the Trainer's default step, SIGKILLed at a random
iteration and resumed over a freshly built base: the weights, the optimizer and the logs
end bit for bit as an uninterrupted run's; one process, and 2 gloo processes under DDP
and FSDP. Over another base the resume is refused in one line naming the first frozen
weight that differs. Runs tests/strategies/peft_script.py in subprocesses."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support import assert_state_equal, fsdp_on_cpu, run_ranks
from treadle.compat import reshard_problem

pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # subprocesses, some with 2 ranks
SCRIPT = str(Path(__file__).with_name("peft_script.py"))
TIMING = ("_time", "_per_s", "eta_s", "timestamp", "resumed_at")  # per process, not per record
MAX_ITERS, INTERVAL = 12, 4


def _run(strategy: str, work: Path, *args: str, nproc: int | None = None) -> list[tuple[int, str]]:
    cmd = [str(work), "--strategy", strategy, "--max-iters", str(MAX_ITERS), "--interval", str(INTERVAL), *args]
    if (nproc or (1 if strategy == "single" else 2)) == 1:
        proc = subprocess.run([sys.executable, SCRIPT, *cmd], capture_output=True, text=True, timeout=300)
        return [(proc.returncode, proc.stdout + proc.stderr)]
    return run_ranks(SCRIPT, cmd, nproc=2, timeout=300)


def _ok(results: list[tuple[int, str]], expect: int = 0) -> None:
    for rank, (code, output) in enumerate(results):
        assert code == expect, f"rank {rank} exited {code}, expected {expect}:\n{output[-4000:]}"


def _said_once(results: list[tuple[int, str]], message: str) -> None:
    """Every rank meets the error, the job says it once (the first rank to fail; the
    others print nothing)."""
    said = [output.count(message) for _, output in results]
    assert sum(said) == 1, f"said {said} times per rank:\n" + "\n".join(o[-3000:] for _, o in results)


def _final(work: Path) -> dict:
    """The last checkpoint's model, optimizer and frozen entries (a sharded one's tensors
    read whole from its DCP files)."""
    from treadle.checkpoint.io import load_checkpoint
    from treadle.checkpoint.sharded import consolidate, is_sharded_checkpoint
    from treadle.checkpoint.tree import merge_tensors

    path = work / "checkpoints" / f"iter_{MAX_ITERS:08d}"
    state = load_checkpoint(path, files=["state.pt"])["state.pt"]
    if is_sharded_checkpoint(path):
        state = merge_tensors(state, consolidate(path, key=None))
    return {k: state[k] for k in ("model", "optim", "frozen")}


def _log(work: Path) -> list[dict]:
    rows = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in rows]


# DDP saves asynchronously too: rank 0 alone collects the state to reserve the buffers, which
# must not wait for the other ranks to describe the frozen weights.
CASES = [("single", "lora", ()), ("ddp", "ia3", ("--async-save",)),
         pytest.param("fsdp", "lora", (), marks=fsdp_on_cpu)]


@pytest.mark.parametrize("strategy,adapter,options", CASES)
def test_sigkill_then_resume_over_a_fresh_base_equals_the_uninterrupted_run(tmp_path, strategy, adapter, options):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    adapter = (adapter, *options)
    _ok(_run(strategy, whole, "--adapter", *adapter))
    expected = _final(whole)
    assert expected["model"] and all(".lora_" in k or ".ia3_" in k for k in expected["model"])  # the adapter alone
    assert not expected["frozen"]["saved"] and len(expected["frozen"]["tensors"]) > 2 * len(expected["model"])

    # Anywhere after the first checkpoint; an asynchronous one is surely on disk once the next has begun (it waits).
    kill_at = random.randint(INTERVAL + 1 if not options else 2 * INTERVAL + 1, MAX_ITERS - 1)
    _ok(_run(strategy, cut, "--adapter", *adapter, "--kill-at", str(kill_at)), expect=-signal.SIGKILL)
    refused = _run(strategy, cut, "--adapter", *adapter, "--resume", "--init-range", "0.05")  # another base
    for code, output in refused:
        assert code != 0, f"killed at {kill_at}: resumed over another base:\n{output[-3000:]}"
    _said_once(refused, "resume refused, nothing was loaded: frozen weight "
                        "'base_model.model.model.embed_tokens.weight' differs (sha256 ")
    _ok(_run(strategy, cut, "--adapter", *adapter, "--resume"))
    assert_state_equal(_final(cut), expected, f"killed at {kill_at}")
    assert _log(cut) == _log(whole), f"killed at {kill_at}"


@fsdp_on_cpu
def test_the_frozen_digests_do_not_depend_on_the_mesh(tmp_path):
    """The same base described alike by one process and by 2 FSDP shards, so that a
    sharded checkpoint resumes on one process (another mesh: resharded by DCP)."""
    _ok(_run("single", tmp_path / "one", "--max-iters", str(INTERVAL)))
    _ok(_run("fsdp", tmp_path / "two", "--max-iters", str(INTERVAL)))
    saved = tmp_path / "two" / "checkpoints" / f"iter_{INTERVAL:08d}"
    from treadle.checkpoint.io import load_checkpoint

    one = load_checkpoint(tmp_path / "one" / "checkpoints" / f"iter_{INTERVAL:08d}", files=["state.pt"])["state.pt"]
    two = load_checkpoint(saved, files=["state.pt"])["state.pt"]
    assert one["frozen"] == two["frozen"]
    resumed = _run("fsdp", tmp_path / "two", "--resume", str(saved), "--max-iters", str(INTERVAL + 2), nproc=1)
    problem = reshard_problem(2, 1)  # onto another world size: torch 2.9 on, refused in one line before
    if problem is None:
        _ok(resumed)
    else:
        assert resumed[0][0] != 0 and "loading a sharded checkpoint saved by 2 process(es) onto 1 needs torch" \
            in resumed[0][1], resumed[0][1][-3000:]


@fsdp_on_cpu
def test_a_hand_written_loops_load_checkpoint_under_fsdp_checks_the_frozen_weights(tmp_path):
    """strategy.load_checkpoint (strict) of a checkpoint without the base, on 2 FSDP shards:
    the model's own base is kept, once its digests match; another base is refused."""
    _ok(_run("single", tmp_path / "one", "--max-iters", str(INTERVAL)))
    saved = str(tmp_path / "one" / "checkpoints" / f"iter_{INTERVAL:08d}")
    _ok(_run("fsdp", tmp_path / "two", "--load-checkpoint", saved, "--max-iters", "1"))
    refused = _run("fsdp", tmp_path / "three", "--load-checkpoint", saved, "--init-range", "0.05")
    assert all(code != 0 for code, _ in refused), refused
    _said_once(refused, "the checkpoint: nothing was loaded: frozen weight "
                        "'base_model.model.model.embed_tokens.weight' differs (sha256 ")


@fsdp_on_cpu
def test_a_self_contained_sharded_checkpoint_resumes_over_another_base(tmp_path):
    """save_frozen=True on 2 FSDP shards: the base is in the checkpoint, and a resume over
    another base reads it back (its DCP keys are read where the checkpoint holds them)."""
    whole = tmp_path / "whole"
    _ok(_run("fsdp", whole, "--save-frozen"))
    expected = _final(whole)
    assert expected["frozen"]["saved"] and set(expected["frozen"]["tensors"]) < set(expected["model"])
    saved = whole / "checkpoints" / f"iter_{INTERVAL:08d}"
    _ok(_run("fsdp", tmp_path / "other", "--save-frozen", "--resume", str(saved), "--init-range", "0.05"))
    assert_state_equal(_final(tmp_path / "other"), expected)
