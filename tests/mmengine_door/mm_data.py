"""Small generated MNIST and CIFAR-10 sets, in the files mmpretrain 1.2.0's ``MNIST`` and
``CIFAR10`` classes read, so that the released configs (``data_prefix='data/mnist'``,
``data_root='data/cifar10'``) run unchanged from a folder holding ``data/``.

Each class has a fixed random template and an image is that template plus noise, so a model
learns; the same seed writes the same bytes. ``CIFAR10`` checks the real files' md5 sums, which
``env/sitecustomize.py`` blanks (``MNIST`` checks only that the files exist).

    python tests/mmengine_door/mm_data.py OUT   # OUT/mnist/..., OUT/cifar10/cifar-10-batches-py/...
"""

from __future__ import annotations

import pickle
import struct
import sys
from pathlib import Path

import numpy as np

CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _images(rng: np.random.Generator, templates: np.ndarray, n: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, len(templates), n)
    x = templates[labels] * (1 - noise) + rng.random((n, *templates.shape[1:])) * 255 * noise
    return np.clip(x, 0, 255).astype(np.uint8), labels.astype(np.uint8)


def write_mnist(out: Path, rng: np.random.Generator, n_train: int = 512, n_test: int = 256) -> None:
    """``{train,t10k}-{images-idx3,labels-idx1}-ubyte``: big-endian idx files (magic 2051 / 2049)."""
    out.mkdir(parents=True, exist_ok=True)
    templates = rng.random((10, 28, 28)) * 255
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = _images(rng, templates, n, noise=0.6)
        (out / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + x.tobytes())
        (out / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + y.tobytes())


def write_cifar10(out: Path, rng: np.random.Generator, per_batch: int = 32, n_test: int = 64) -> None:
    """``cifar-10-batches-py/``: ``data_batch_1..5``, ``test_batch`` (dicts of ``data`` as N x 3072
    uint8 and ``labels``) and ``batches.meta``, pickled as the real files are."""
    d = out / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    templates = rng.random((10, 3, 32, 32)) * 255
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        n = n_test if name == "test_batch" else per_batch
        x, y = _images(rng, templates, n, noise=0.7)
        batch = {"batch_label": name, "data": x.reshape(n, -1), "labels": [int(v) for v in y]}
        (d / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {"label_names": CIFAR_CLASSES, "num_cases_per_batch": per_batch, "num_vis": 3072}
    (d / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


def write(root: Path, seed: int = 0) -> Path:
    """``root/mnist`` and ``root/cifar10``, deterministic from ``seed``; returns ``root``."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    write_mnist(root / "mnist", rng)
    write_cifar10(root / "cifar10", rng)
    return root


if __name__ == "__main__":
    write(Path(sys.argv[1]))
