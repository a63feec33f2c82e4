"""What TensorBoard's default reader shows: its Rust data server ("rustboard", the
``tensorboard-data-server`` package, which ``tensorboard`` uses unless ``--load_fast=false``).

It reads a run's event files in name order and keeps, per tag, the rule of a preempted job:
an event at step ``s`` drops the same tag's events at steps ``>= s`` read before it. It does
not read ``SessionLog.START`` events, which the Python ``EventAccumulator`` purges by.
``rust_scalars`` starts the server on a directory (``--reload once``), asks it for every
scalar over gRPC, as TensorBoard's own front end does, and stops it.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def rust_scalars(logdir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run: {tag: [(step, value), ...]}} as the Rust data server serves ``logdir``."""
    ingester = pytest.importorskip("tensorboard.data.server_ingester")
    grpc = pytest.importorskip("grpc")
    from tensorboard import context
    from tensorboard.data import grpc_provider

    binary = ingester.get_server_binary()
    if binary is None:
        pytest.skip("tensorboard-data-server is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        proc = subprocess.Popen([binary.path, "--logdir", str(logdir), "--port", "0", "--port-file", str(port_file),
                                 "--reload", "once", "--die-after-stdin", "--samples-per-plugin", "scalars=all"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().endswith("\n")):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Rust data server did not start (exit status {proc.poll()})")
                time.sleep(0.05)
            addr = f"localhost:{int(port_file.read_text())}"
            with grpc.insecure_channel(addr) as channel:
                provider = grpc_provider.GrpcDataProvider(addr, grpc_provider.make_stub(channel))
                last = None
                while time.monotonic() < deadline:  # "once": the load runs in the background; wait until it settles
                    data = provider.read_scalars(context.RequestContext(), experiment_id="", plugin_name="scalars",
                                                 downsample=1_000_000)
                    shown = {run: {tag: [(d.step, d.value) for d in series] for tag, series in tags.items()}
                             for run, tags in data.items()}
                    if shown and shown == last:
                        return shown
                    last = shown
                    time.sleep(0.3)
                raise RuntimeError("the Rust data server's scalars did not settle within 30 s")
        finally:
            proc.stdin.close()  # --die-after-stdin
            proc.wait(timeout=30)
