"""Top-k sparsification with error feedback, one worker's side, and the all-gathered sum.

Stich, Cordonnier & Jaggi 2018, "Sparsified SGD with Memory": Δ = g + e; send
the k entries of largest |Δ|; keep e = Δ − (what was sent). Rounding to the
wire's precision is part of what was sent, so e also keeps it, and the sum over
workers of (sent + e) equals that of Δ: error feedback loses nothing.

Ties are broken by index (the lower first), so every executor picks the same
entries. Selection is O(n): the k-th largest magnitude by ``np.partition``,
then every entry above it and the first ones equal to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["Sparsifier", "select", "scatter_mean"]


def select(delta: np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of the ``k`` entries of largest magnitude; ties go to the lower index."""
    size = delta.shape[0]
    if k >= size:
        return np.arange(size)
    magnitude = np.abs(delta)
    threshold = np.partition(magnitude, size - k)[size - k]
    above = np.flatnonzero(magnitude > threshold)
    equal = np.flatnonzero(magnitude == threshold)[:k - above.shape[0]]
    return np.union1d(above, equal)


def scatter_mean(indices: Sequence[np.ndarray], values: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The dense mean over workers of sparse gradients (worker w's ``values`` at its ``indices``),
    summed in worker order."""
    dense = np.zeros(size)
    for idx, vals in zip(indices, values):
        dense[idx] += vals  # a worker's indices are distinct, so += adds each once
    return dense / len(indices)


class Sparsifier:
    """One worker's top-k state: its residual over a flat gradient of ``size`` values."""

    def __init__(self, size: int, k: int, send: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.size, self.k = int(size), int(k)
        self.send = send or (lambda x: x)
        self.error = np.zeros(self.size)

    def compress(self, gradient: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices, values as sent) of this step; the residual keeps the rest."""
        delta = np.asarray(gradient, dtype=float) + self.error
        indices = select(delta, self.k)
        sent = self.send(delta[indices])
        delta[indices] -= sent
        self.error = delta
        return indices, sent
