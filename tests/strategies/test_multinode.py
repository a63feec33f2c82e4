"""Two nodes on one machine: two torchrun agents (``--nnodes 2 --nproc-per-node 1``) meet
through a c10d rendezvous on localhost, which assigns the node ranks. Checks where
treadle.distributed.detect_launcher places each process, that training equals one process
with the doubled batch, and that a checkpoint the two nodes saved is resumed on a single
node (2 processes) to the same weights, bit for bit.
Runs tests/strategies/ddp_script.py (DDP on gloo, shuffled data)."""

from __future__ import annotations

import shutil
import uuid

import pytest
import torch

from support import free_port, wait_all
from trainer_ranks import SCRIPT, _final, _reference, _run, start_torchrun

pytestmark = pytest.mark.slow  # two torchrun agents, then 2 more processes


def test_two_agents_train_like_one_process_and_their_checkpoint_resumes_on_one_node(tmp_path):
    out, work = tmp_path / "out", tmp_path / "run"
    common = ["--interval", "3", "--shuffle", "--resume"]  # 12 iterations, a checkpoint every 3
    rdzv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"treadle-{uuid.uuid4().hex[:8]}",
            "--monitor-interval", "0.2"]  # no --node-rank: the rendezvous numbers the nodes
    agents = [start_torchrun(*rdzv, SCRIPT, str(out), "--work-dir", str(work), *common) for _ in range(2)]
    for node, (code, log) in enumerate(wait_all(agents)):
        assert code == 0, f"agent {node} exited {code}:\n{log[-6000:]}"

    # Each node runs one process: global ranks 0 and 1, local rank 0 of a local world of 1.
    results = [torch.load(out / f"result_rank{r}.pt", weights_only=True) for r in range(2)]
    for rank, result in enumerate(results):
        env = result["dist_env"]
        assert (env["launcher"], env["rank"], env["world_size"]) == ("torchrun", rank, 2), env
        assert (env["local_rank"], env["local_world_size"]) == (0, 1), env
        assert result["node"] == str(rank)  # one process per node: node rank = global rank
        assert result["world_size"] == 2 and result["iter"] == 12

    # Training: the replicas agree, and equal one process that sees both ranks' batches
    # at once (tolerance as in test_ddp: the all-reduce sums in another order).
    w0, w1, ref = _final(out, 0), _final(out, 1), _reference(shuffle=True, accumulate=1)
    for k in ref:
        assert torch.equal(w0[k], w1[k]), k
        torch.testing.assert_close(w0[k], ref[k], rtol=1e-5, atol=1e-6)

    # Resume on one node (2 processes, local ranks 0 and 1) from the two nodes' checkpoint
    # of iteration 6, in the middle of the run: it ends where the two nodes ended.
    ckpts = work / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [f"iter_{i:08d}" for i in (3, 6, 9, 12)]
    for later in ("iter_00000009", "iter_00000012"):
        shutil.rmtree(ckpts / later)
    _run(tmp_path / "one_node", "--work-dir", str(work), *common)
    for rank in range(2):
        result = torch.load(tmp_path / "one_node" / f"result_rank{rank}.pt", weights_only=True)
        assert result["resumed_at"] == 6 and result["iter"] == 12, result
        assert (result["dist_env"]["local_rank"], result["dist_env"]["local_world_size"]) == (rank, 2)
    resumed = _final(tmp_path / "one_node")
    for k in w0:
        assert torch.equal(resumed[k], w0[k]), k
