"""A small GAN on a ring of 2-D Gaussians: two optimizers and a custom train step.

The model defines ``train_step(batch, trainer)``, so the Trainer calls it instead of
its default step; it updates the discriminator and then the generator through
``trainer.optim_wrappers["disc"]`` and ``["gen"]`` (AMP, accumulation and clipping
then apply to each, as configured). Its ``val_step`` measures how many of the ring's
modes the generator covers. The data is generated in code: nothing is downloaded.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset


def gaussian_ring(n: int = 4096, modes: int = 8, radius: float = 2.0, std: float = 0.05, seed: int = 0) -> TensorDataset:
    """``n`` points (N, 2) drawn from ``modes`` Gaussians evenly spaced on a circle."""
    g = torch.Generator().manual_seed(seed)
    angles = torch.randint(0, modes, (n,), generator=g).float() * (2 * math.pi / modes)
    centers = torch.stack([angles.cos(), angles.sin()], dim=1) * radius
    return TensorDataset(centers + std * torch.randn(n, 2, generator=g))


def _mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
                         nn.Linear(hidden, d_out))


class RingGAN(nn.Module):
    """Generator ``gen`` (noise -> point) and discriminator ``disc`` (point -> logit).

    The submodule names are the optimizer names: ``optimizer: {gen: {...}, disc: {...}}``
    gives each submodule its own optimizer.
    """

    def __init__(self, latent_dim: int = 8, hidden: int = 64) -> None:
        super().__init__()
        self.latent_dim = latent_dim
        self.gen = _mlp(latent_dim, hidden, 2)
        self.disc = _mlp(2, hidden, 1)

    def forward(self, n: int) -> Tensor:
        """``n`` generated points."""
        z = torch.randn(n, self.latent_dim, device=self.gen[0].weight.device)
        return self.gen(z)

    def train_step(self, batch: list[Tensor], trainer) -> dict[str, Tensor]:
        """One discriminator update, then one generator update (non-saturating loss)."""
        real = batch[0]
        ow_d, ow_g = trainer.optim_wrappers["disc"], trainer.optim_wrappers["gen"]
        with ow_g.autocast():
            fake = self(real.shape[0])
        with ow_d.autocast():
            logits_real, logits_fake = self.disc(real), self.disc(fake.detach())
            loss_disc = F.binary_cross_entropy_with_logits(logits_real, torch.ones_like(logits_real)) + \
                F.binary_cross_entropy_with_logits(logits_fake, torch.zeros_like(logits_fake))
        ow_d.update(loss_disc)
        # Freeze the discriminator for the generator's backward: its gradients from
        # this loss would otherwise leak into the discriminator's next update.
        self.disc.requires_grad_(False)
        try:
            with ow_g.autocast():
                logits = self.disc(fake)
                loss_gen = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
            ow_g.update(loss_gen)
        finally:
            self.disc.requires_grad_(True)
        return {"loss_disc": loss_disc.detach(), "loss_gen": loss_gen.detach()}

    def val_step(self, batch: list[Tensor], trainer) -> dict[str, float]:
        """Validation: the fraction of the ring's modes the generator covers (``val/modes``),
        from as many generated points as the batch holds real ones."""
        return {"modes": self.mode_coverage(n=batch[0].shape[0])}

    @torch.no_grad()
    def mode_coverage(self, n: int = 2000, modes: int = 8, radius: float = 2.0, tol: float = 0.3) -> float:
        """Fraction of the ring's modes with at least 1% of ``n`` samples within ``tol``."""
        pts = self(n).float().cpu()
        angles = torch.arange(modes).float() * (2 * math.pi / modes)
        centers = torch.stack([angles.cos(), angles.sin()], dim=1) * radius
        nearest = torch.cdist(pts, centers)
        close = nearest.min(dim=1).values < tol
        counts = torch.bincount(nearest.argmin(dim=1)[close], minlength=modes)
        return float((counts >= 0.01 * n).float().mean())
