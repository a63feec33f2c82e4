"""MMEngine's own Runner on the released ``lenet5_mnist.py`` (mm_reference.py), on 1 process and
on 2 under torchrun: the outputs later tests compare treadle with are there and make sense."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.slow

N_TRAIN, N_TEST, BATCH = 512, 256, 128  # mm_data's MNIST; the config's batch size (per process)


@pytest.mark.parametrize("nproc", [1, 2])
def test_mmengine_trains_lenet5_mnist(mmengine_lenet, nproc):
    r = mmengine_lenet[nproc]  # lenet5_mnist.py, 2 epochs (conftest.py)
    assert r["world_size"] == nproc
    assert len(r["workarounds"]) == (0 if nproc == 1 else 3)

    per_epoch = N_TRAIN // (BATCH * nproc)
    train = r["train"]
    assert [t["iter"] for t in train] == list(range(1, 2 * per_epoch + 1))
    assert [t["epoch"] for t in train] == [1] * per_epoch + [2] * per_epoch
    assert all(t["lr"] == 0.01 for t in train)  # the config's SGD lr; MultiStepLR's milestone (15) is far off
    losses = [t["loss"] for t in train]  # rank 0's own loss on 2 processes (window_size=1)
    assert all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - math.log(10)) < 0.1  # 10 classes, untrained

    assert [v["step"] for v in r["val"]] == [1, 2]  # one validation per epoch, logged by epoch
    for v in r["val"]:
        correct = v["accuracy/top1"] * N_TEST / 100  # percent of the 256 test images, counted once over the ranks
        assert 0 <= correct <= N_TEST and abs(correct - round(correct)) < 1e-6
    assert r["final"] == {"accuracy/top1": r["val"][-1]["accuracy/top1"]}

    state = r["state_dict"]
    # LeNet5's classifier lives in its backbone; ImageClassifier's ClsHead has no weights of its own.
    assert {k.rsplit(".", 2)[0] for k in state} == {"backbone.features", "backbone.classifier"}
    assert state["backbone.classifier.2.weight"].shape == (10, 84)
    assert all(v.device.type == "cpu" and v.isfinite().all() for v in state.values())
    assert r["last_checkpoint"].endswith("epoch_2.pth")
    checkpoint = torch.load(r["last_checkpoint"], map_location="cpu", weights_only=False)  # MMEngine's, just written
    assert all(torch.equal(checkpoint["state_dict"][k], v) for k, v in state.items())
