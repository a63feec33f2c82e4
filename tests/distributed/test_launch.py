"""treadle.distributed.launch: the options `treadle train --nproc N` gives torch's agent
(the real launches are in tests/test_cli.py and tests/strategies/test_elastic.py, slow)."""

from __future__ import annotations

import os

import pytest


def test_the_launcher_unshares_the_rendezvous_store_only_for_restarts(monkeypatch):
    """TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 while the agent runs (it and its workers read
    it) when max_restarts > 0; the launcher's own environment is as it was afterwards."""
    import torch.distributed.launcher.api as api

    from treadle.distributed.launch import UNSHARED_STORE, launch_local

    seen = []

    def fake_launch(config, entrypoint):
        return lambda *args: seen.append((config.max_restarts, os.environ.get(UNSHARED_STORE)))

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    monkeypatch.delenv(UNSHARED_STORE, raising=False)
    assert launch_local(2, ["-c", "pass"], max_restarts=2) == 0
    assert launch_local(2, ["-c", "pass"]) == 0
    assert seen == [(2, "1"), (0, None)]
    assert UNSHARED_STORE not in os.environ
    with pytest.raises(ValueError, match="max_restarts"):
        launch_local(2, ["-c", "pass"], max_restarts=-1)
