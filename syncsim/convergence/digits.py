"""A LeNet-style convolutional classifier on scikit-learn's bundled 8×8 digits, in numpy.

The seed article trained LeNet on MNIST; at 8×8 the same idea (convolution,
non-linearity, subsampling, then fully connected layers) fits in a few
thousand parameters and a numpy forward/backward of a minibatch takes tens of
microseconds. The data ship inside scikit-learn (``load_digits``: 1,797 images
from the UCI optdigits set), so nothing is downloaded.

Layers: 3×3 convolution to ``channels`` maps (6×6), ReLU, 2×2 average pooling
(LeNet-5's subsampling, LeCun et al. 1998) to 3×3, a fully connected hidden
layer of ``hidden`` ReLU units, and 10 logits; softmax cross-entropy loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from syncsim.config import check_float, check_int
from syncsim.convergence.problems import Problem
from syncsim.limits import check_memory

__all__ = ["Digits"]

KERNEL = 3
SIDE = 8
CONV = SIDE - KERNEL + 1     # 6: valid convolution
POOLED = CONV // 2           # 3
CLASSES = 10


@dataclass(frozen=True)
class Digits(Problem):
    channels: int = 8
    hidden: int = 32
    test_fraction: float = 0.2
    seed: int = 0
    metrics = ("loss", "accuracy")

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", check_int("Digits", "channels", self.channels, 1))
        object.__setattr__(self, "hidden", check_int("Digits", "hidden", self.hidden, 1))
        object.__setattr__(self, "test_fraction", check_float("Digits", "test_fraction", self.test_fraction,
                                                              low=0.0, high=1.0, low_open=True, high_open=True))
        object.__setattr__(self, "seed", check_int("Digits", "seed", self.seed, 0))
        # parameters (a few copies in the replay) and the activations of all 1,797 images
        c, h = self.channels, self.hidden
        check_memory("Digits", 10 * c + (9 * c + 11) * h + 1797 * (36 * c + h), "values (parameters and activations)",
                     32, "lower channels or hidden")

    # -- data ---------------------------------------------------------------------------
    @cached_property
    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(train patches, train labels, test patches, test labels); patches are (n, 36, 9)."""
        from sklearn.datasets import load_digits  # lazily: only this problem needs scikit-learn

        digits = load_digits()
        images = digits.images / 16.0            # pixel values are 0..16
        order = np.random.default_rng([self.seed, 4]).permutation(len(images))
        test = int(round(self.test_fraction * len(images)))
        windows = np.lib.stride_tricks.sliding_window_view(images, (KERNEL, KERNEL), axis=(1, 2))
        patches = np.ascontiguousarray(windows.reshape(len(images), CONV * CONV, KERNEL * KERNEL))
        labels = digits.target.astype(np.int64)
        train_idx, test_idx = order[test:], order[:test]
        return patches[train_idx], labels[train_idx], patches[test_idx], labels[test_idx]

    @property
    def samples(self) -> int:
        return len(self.data[1])

    # -- parameters ---------------------------------------------------------------------
    @cached_property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        c, h = self.channels, self.hidden
        return ((KERNEL * KERNEL, c), (c,), (POOLED * POOLED * c, h), (h,), (h, CLASSES), (CLASSES,))

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        return tuple(np.cumsum([0] + [int(np.prod(s)) for s in self.shapes]).tolist())

    @property
    def dim(self) -> int:
        return self.offsets[-1]

    def unpack(self, x: np.ndarray) -> list[np.ndarray]:
        o = self.offsets
        return [x[o[i]:o[i + 1]].reshape(shape) for i, shape in enumerate(self.shapes)]

    def init(self, seed: int) -> np.ndarray:
        # He initialisation for the ReLU layers (He et al. 2015), zero biases.
        rng = np.random.default_rng([seed, 5])
        parts = []
        for shape in self.shapes:
            fan_in = shape[0]
            parts.append(rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape) if len(shape) == 2 else np.zeros(shape))
        return np.concatenate([p.ravel() for p in parts])

    # -- forward / backward ---------------------------------------------------------------
    # Average pooling is linear, so it is folded into the first dense layer:
    # pooled @ W2 == conv_map @ W2e, where W2e repeats each pooled cell's rows
    # of W2, times ¼, for the four conv positions under it. Small matmuls are
    # all numpy does fast; multi-axis reductions and 6-d reshapes are not.
    @cached_property
    def cell(self) -> np.ndarray:
        """Pooled cell (0..8) under each of the 36 conv positions, row-major."""
        rows, cols = np.divmod(np.arange(CONV * CONV), CONV)
        return (rows // 2) * POOLED + cols // 2

    @cached_property
    def pool_matrix(self) -> np.ndarray:
        """(9, 36): ¼ where a conv position lies under a pooled cell."""
        matrix = np.zeros((POOLED * POOLED, CONV * CONV))
        matrix[self.cell, np.arange(CONV * CONV)] = 0.25
        return matrix

    def _expanded(self, w2: np.ndarray) -> np.ndarray:
        c = self.channels
        return (w2.reshape(POOLED * POOLED, c, -1)[self.cell] * 0.25).reshape(CONV * CONV * c, -1)

    def _forward(self, x: np.ndarray, patches: np.ndarray):
        w1, b1, w2, b2, w3, b3 = self.unpack(x)
        n = len(patches)
        z1 = (patches.reshape(-1, KERNEL * KERNEL) @ w1 + b1).reshape(n, -1)   # (n, 36·c)
        a1 = np.maximum(z1, 0.0)
        w2e = self._expanded(w2)
        z2 = a1 @ w2e + b2
        a2 = np.maximum(z2, 0.0)
        logits = a2 @ w3 + b3
        return z1, a1, w2e, z2, a2, logits

    def gradient(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        patches, labels = self.data[0][indices], self.data[1][indices]
        w1, b1, w2, b2, w3, b3 = self.unpack(x)
        n, c = len(indices), self.channels
        z1, a1, w2e, z2, a2, logits = self._forward(x, patches)
        # softmax cross-entropy: d loss / d logits = softmax - one_hot, averaged over the batch
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        probs[np.arange(n), labels] -= 1.0
        d3 = probs * (1.0 / n)
        g = np.empty(self.dim)
        gw1, gb1, gw2, gb2, gw3, gb3 = self.unpack(g)
        np.matmul(a2.T, d3, out=gw3)
        gb3[:] = d3.sum(axis=0)
        d2 = (d3 @ w3.T) * (z2 > 0)
        gw2e = a1.T @ d2                                            # (36·c, h)
        gw2[:] = (self.pool_matrix @ gw2e.reshape(CONV * CONV, -1)).reshape(gw2.shape)
        gb2[:] = d2.sum(axis=0)
        d1 = ((d2 @ w2e.T) * (z1 > 0)).reshape(-1, c)               # (n·36, c)
        np.matmul(patches.reshape(-1, KERNEL * KERNEL).T, d1, out=gw1)
        gb1[:] = d1.sum(axis=0)
        return g

    def evaluate(self, x: np.ndarray) -> dict[str, float]:
        _, _, patches, labels = self.data
        logits = self._forward(x, patches)[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = float(-np.mean(log_probs[np.arange(len(labels)), labels]))
        accuracy = float(np.mean(np.argmax(logits, axis=1) == labels))
        return {"loss": loss, "accuracy": accuracy}

    def train_loss(self, x: np.ndarray, indices: np.ndarray) -> float:
        """Mean cross-entropy over training samples ``indices`` (used to check the gradient)."""
        patches, labels = self.data[0][indices], self.data[1][indices]
        logits = self._forward(x, patches)[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(-np.mean(log_probs[np.arange(len(labels)), labels]))
