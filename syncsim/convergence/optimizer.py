"""The replay's optimisers, each exactly as torch.optim defines it (float64 arithmetic).

- ``SGD``: SGD with heavy-ball momentum, as torch.optim.SGD (dampening 0, no
  Nesterov): v ← μ·v + g; x ← x − lr·v. The run's optimiser (replicas,
  servers) and local SGD's inner one.
- ``Nesterov``: SGD with Nesterov momentum, as torch.optim.SGD(nesterov=True,
  dampening 0): v ← μ·v + g; x ← x − lr·(g + μ·v). DiLoCo's outer optimiser.
- ``AdamW``: torch.optim.AdamW with torch's defaults (betas (0.9, 0.999), eps
  1e-8, weight decay 0.01, no amsgrad): x ← x·(1 − lr·wd) (decoupled decay);
  m ← m + (1 − β₁)(g − m); v ← β₂v + (1 − β₂)g²; with bias corrections
  c₁ = 1 − β₁ᵗ, c₂ = 1 − β₂ᵗ, x ← x − (lr/c₁)·m / (√v/√c₂ + ε). DiLoCo's inner
  optimiser.

Each works in place on one parameter vector or on a stack of replicas (one row
per worker), each row with its own state: per-worker optimiser state is what
separates local SGD from all-reduce once momentum is on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from syncsim.config import check_float

__all__ = ["SGD", "Nesterov", "AdamW"]


@dataclass(frozen=True)
class SGD:
    lr: float
    momentum: float = 0.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "lr", check_float(owner, "lr", self.lr, low=0.0, low_open=True))
        object.__setattr__(self, "momentum", check_float(owner, "momentum", self.momentum,
                                                         low=0.0, high=1.0, high_open=True))

    def step(self, x: np.ndarray, velocity: np.ndarray, gradient: np.ndarray) -> None:
        """One step on ``x`` (and its ``velocity``) with ``gradient``, in place."""
        if self.momentum:
            velocity *= self.momentum
            velocity += gradient
            x -= self.lr * velocity
        else:
            x -= self.lr * gradient


@dataclass(frozen=True)
class Nesterov(SGD):
    def step(self, x: np.ndarray, velocity: np.ndarray, gradient: np.ndarray) -> None:
        """One step on ``x`` (and its ``velocity``) with ``gradient``, in place (torch: the buffer
        starts as the first gradient, which is μ·0 + g)."""
        if self.momentum:
            velocity *= self.momentum
            velocity += gradient
            x -= self.lr * (gradient + self.momentum * velocity)
        else:
            x -= self.lr * gradient


@dataclass(frozen=True)
class AdamW:
    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        owner = "AdamW"
        object.__setattr__(self, "lr", check_float(owner, "lr", self.lr, low=0.0, low_open=True))
        for name in ("beta1", "beta2"):
            object.__setattr__(self, name, check_float(owner, name, getattr(self, name), low=0.0, high=1.0,
                                                       high_open=True))
        object.__setattr__(self, "eps", check_float(owner, "eps", self.eps, low=0.0))
        object.__setattr__(self, "weight_decay", check_float(owner, "weight_decay", self.weight_decay, low=0.0))

    def step(self, x: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, step: int,
             gradient: np.ndarray) -> None:
        """Step number ``step`` (1 for the first) on ``x`` and its moments, in place."""
        lr, beta1, beta2 = self.lr, self.beta1, self.beta2
        if self.weight_decay:
            x *= 1.0 - lr * self.weight_decay
        exp_avg += (gradient - exp_avg) * (1.0 - beta1)        # torch: exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq *= beta2
        exp_avg_sq += (1.0 - beta2) * gradient * gradient
        step_size = lr / (1.0 - beta1**step)
        denom = np.sqrt(exp_avg_sq) / math.sqrt(1.0 - beta2**step) + self.eps
        x -= step_size * exp_avg / denom
