"""Which training samples worker w uses at its step t.

Worker w's minibatch at step t is positions [(t·W + w)·b, (t·W + w + 1)·b) of
a stream that visits the pool in a fresh seeded permutation each epoch (the
same layout as real/data.py). So a step's W minibatches are together exactly
the single-process minibatch of W·b samples at that step — what makes
"W workers of batch b = one worker of batch W·b" testable — and every
(worker, step) gets its batch regardless of the order anyone asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from syncsim.config import check_int

__all__ = ["Sampler"]


@dataclass(frozen=True)
class Sampler:
    samples: int
    """Size of the training pool."""
    batch_size: int
    workers: int
    seed: int = 0
    _epochs: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, minimum in (("samples", 1), ("batch_size", 1), ("workers", 1), ("seed", 0)):
            object.__setattr__(self, name, check_int("Sampler", name, getattr(self, name), minimum))

    def permutation(self, epoch: int) -> np.ndarray:
        order = self._epochs.get(epoch)
        if order is None:
            if len(self._epochs) > 64:   # a long run walks forward: forget old epochs
                self._epochs.clear()
            order = self._epochs[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.samples)
        return order

    def indices(self, worker: int, step: int) -> np.ndarray:
        b, n = self.batch_size, self.samples
        start = (step * self.workers + worker) * b
        epoch, offset = divmod(start, n)
        if offset + b <= n:
            return self.permutation(epoch)[offset:offset + b]
        positions = np.arange(start, start + b)
        epochs, offsets = np.divmod(positions, n)
        return np.array([self.permutation(int(e))[o] for e, o in zip(epochs, offsets)])
