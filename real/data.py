"""Seeded training data and the batch each worker takes at each step.

Worker w's batch at step t is samples [(t·W + w)·B, (t·W + w + 1)·B) of one
seeded permutation (wrapping around), so the W batches of a step are exactly
one combined batch of W·B samples: what a single-process run on the combined
batch sees, which is how tests check the all-reduce executor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["Dataset", "load"]

SYNTHETIC_SAMPLES = 4096


class Dataset:
    def __init__(self, x: torch.Tensor, y: torch.Tensor, seed: int):
        self.x, self.y = x, y
        self.order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device | str) -> Dataset:
        self.x, self.y, self.order = self.x.to(device), self.y.to(device), self.order.to(device)
        return self

    def indices(self, worker: int, step: int, world: int, batch_size: int) -> torch.Tensor:
        start = (step * world + worker) * batch_size
        positions = torch.arange(start, start + batch_size, device=self.order.device) % len(self)
        return self.order[positions]

    def batch(self, worker: int, step: int, world: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices(worker, step, world, batch_size)
        return self.x[idx], self.y[idx]

    def combined(self, step: int, world: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All workers' batches of ``step`` in worker order: one batch of world·batch_size samples."""
        parts = [self.batch(w, step, world, batch_size) for w in range(world)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def synthetic(seed: int) -> Dataset:
    # Gaussian images labelled by a fixed random linear teacher: learnable, so
    # the loss falls and staleness has a visible cost, with nothing to download.
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(SYNTHETIC_SAMPLES, 1, 28, 28, generator=g)
    teacher = torch.randn(784, 10, generator=g)
    y = (x.flatten(1) @ teacher).argmax(1)
    return Dataset(x, y, seed)


def digits(seed: int) -> Dataset:
    # scikit-learn's bundled 8×8 handwritten digits (1,797 images, values
    # 0..16; UCI "Optical Recognition of Handwritten Digits"): no download.
    # Nearest-neighbour upsampling ×3 gives 24×24, zero padding 2 gives the
    # 28×28 of MNIST that LeNet expects.
    from sklearn.datasets import load_digits

    raw = load_digits()
    x = torch.tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.pad(F.interpolate(x, scale_factor=3, mode="nearest"), (2, 2, 2, 2))
    x = (x - x.mean()) / x.std()
    return Dataset(x, torch.tensor(raw.target, dtype=torch.int64), seed)


def load(name: str, seed: int) -> Dataset:
    return {"synthetic": synthetic, "digits": digits}[name](seed)
