"""The generated sets (mm_data.py) are read by mmpretrain's own MNIST and CIFAR10 classes, built
from the released configs' dataset settings, as MMEngine's Runner builds them."""

from __future__ import annotations

from pathlib import Path

import mm_data


def _dataset(work: Path, config: str, loader: str, monkeypatch):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import DATASETS

    monkeypatch.chdir(work)  # the configs' data paths are relative (data/mnist, data/cifar10)
    cfg = Config.fromfile(config)
    init_default_scope(cfg.default_scope)
    return DATASETS.build(cfg[loader].dataset)


def test_mnist_as_lenet5_mnist_reads_it(mm_work, monkeypatch):
    train = _dataset(mm_work, "configs/lenet/lenet5_mnist.py", "train_dataloader", monkeypatch)
    val = _dataset(mm_work, "configs/lenet/lenet5_mnist.py", "val_dataloader", monkeypatch)
    assert (len(train), len(val)) == (512, 256)
    sample = train[0]
    assert tuple(sample["inputs"].shape) == (1, 32, 32)  # the config's Resize(scale=32)
    assert {int(train.get_gt_labels()[i]) for i in range(len(train))} == set(range(10))


def test_cifar10_as_resnet18_cifar10_reads_it(mm_work, monkeypatch):
    """CIFAR10 reads the pickled batches (its md5 checks blanked by env/sitecustomize.py)."""
    config = "configs/resnet/resnet18_8xb16_cifar10.py"
    train = _dataset(mm_work, config, "train_dataloader", monkeypatch)
    val = _dataset(mm_work, config, "val_dataloader", monkeypatch)
    assert (len(train), len(val)) == (5 * 32, 64)
    assert tuple(train[0]["inputs"].shape) == (3, 32, 32)


def test_same_seed_same_bytes(tmp_path):
    a, b, c = (mm_data.write(tmp_path / name, seed=s) for name, s in (("a", 0), ("b", 0), ("c", 1)))
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 4 + 7
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    images = Path("mnist/train-images-idx3-ubyte")
    assert (a / images).read_bytes() != (c / images).read_bytes()
