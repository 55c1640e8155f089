"""SGD with momentum, as torch.optim.SGD (dampening 0, no Nesterov): v ← μ·v + g; x ← x − lr·v.

Works in place on one parameter vector or on a stack of replicas (one row
per worker), each row with its own momentum buffer: per-worker optimiser
state is what separates local SGD from all-reduce once momentum is on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from syncsim.config import check_float

__all__ = ["SGD"]


@dataclass(frozen=True)
class SGD:
    lr: float
    momentum: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", check_float("SGD", "lr", self.lr, low=0.0, low_open=True))
        object.__setattr__(self, "momentum", check_float("SGD", "momentum", self.momentum,
                                                         low=0.0, high=1.0, high_open=True))

    def step(self, x: np.ndarray, velocity: np.ndarray, gradient: np.ndarray) -> None:
        """One step on ``x`` (and its ``velocity``) with ``gradient``, in place."""
        if self.momentum:
            velocity *= self.momentum
            velocity += gradient
            x -= self.lr * velocity
        else:
            x -= self.lr * gradient
