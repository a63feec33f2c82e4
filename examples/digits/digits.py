"""The digits example's data and model: scikit-learn's 8x8 digits (shipped with
scikit-learn, nothing is downloaded) and a small CNN."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digits_datasets(val_fraction: float = 0.2, split_seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Train and validation sets: images (N, 1, 8, 8) scaled to [0, 1], labels (N,)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    # A fixed permutation so the split is the same on every machine.
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    n_val = int(len(y) * val_fraction)
    val, train = perm[:n_val], perm[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def digits_dataset(split: str = "train", val_fraction: float = 0.2, split_seed: int = 0) -> TensorDataset:
    """One split ("train" or "val") of :func:`digits_datasets`; the config name ``digits``."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    train, val = digits_datasets(val_fraction, split_seed)
    return train if split == "train" else val


def digits_loaders(batch_size: int = 32, num_workers: int = 0) -> tuple[DataLoader, DataLoader]:
    train, val = digits_datasets()
    return (DataLoader(train, batch_size=batch_size, shuffle=True, num_workers=num_workers),
            DataLoader(val, batch_size=256, shuffle=False, num_workers=num_workers))


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, a max-pool and two linear layers (about 140k weights)."""

    def __init__(self, num_classes: int = 10, width: int = 32, dropout: float = 0.2) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 128), nn.ReLU(), nn.Dropout(dropout), nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
