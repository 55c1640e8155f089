"""Seeded, cheap optimisation problems to replay a simulated update order on.

Every problem is a finite sum over a pool of ``samples`` training samples:
``gradient(x, indices)`` is the mean per-sample gradient over ``indices``, so
W minibatches of b samples average to exactly the gradient of their union (the
linearity the data-parallel invariants rest on). ``evaluate(x)`` scores the
parameters on held-out data (the quadratic has no data: its loss is exact).
Parameters are one flat float64 vector; float64 arithmetic stands for the fp32
master copy, and only the narrower wire formats are modelled (``wire.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from syncsim.config import check_float, check_int, is_number
from syncsim.convergence.sampler import Sampler
from syncsim.limits import check_memory

__all__ = ["Problem", "Quadratic", "LogisticRegression", "log_sigmoid", "sigmoid"]


class Problem:
    """What replay needs from a problem; subclasses are frozen dataclasses validated on construction.

    Besides the methods, a problem has ``dim`` (number of parameters),
    ``samples`` (size of the training pool minibatches are drawn from) and
    ``shapes`` (its tensors, in the order they lie in the flat vector).
    """

    metrics: tuple[str, ...] = ("loss",)
    dim: int
    samples: int

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of the problem's tensors, laid end to end in the flat parameters (their values
        add up to ``dim``): what a low-rank compressor views as matrices (rows = shape[0], cols = the
        rest; syncsim.compression.layout). By default one vector of ``dim`` values."""
        return ((self.dim,),)

    def init(self, seed: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def gradient(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, x: np.ndarray) -> dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def sampler(self, batch_size: int, workers: int, seed: int):
        """Which samples worker w takes at step t: an object with ``indices(w, t)``.

        The seeded stream of ``Sampler`` unless a problem brings its own data
        order (``real.replay.TorchProblem`` replays a real run's).
        """
        return Sampler(self.samples, batch_size, workers, seed)


def sigmoid(z: np.ndarray) -> np.ndarray:
    # 1/(1+e^-z) written with tanh: no overflow for large |z|, and one ufunc.
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


@dataclass(frozen=True)
class Quadratic(Problem):
    """f(x) = ½ Σ λᵢ xᵢ², with optional per-sample gradient noise of standard deviation ``noise``.

    Sample i's gradient is λ⊙x + ξᵢ, the ξᵢ drawn once per problem and centred
    over the pool, so the full-batch gradient is exactly λ⊙x and a minibatch's
    noise has standard deviation ≈ noise/√b. Diagonal on purpose: every
    eigen-direction evolves on its own, so the delay-stability bound
    (``stability.py``) applies direction by direction.
    """

    eigenvalues: tuple[float, ...]
    noise: float = 0.0
    pool: int = 1024
    """Samples in the pool (only matters when ``noise`` > 0)."""
    seed: int = 0

    def __post_init__(self) -> None:
        values = self.eigenvalues
        if is_number(values) or not hasattr(values, "__iter__") or len(tuple(values)) == 0:
            raise ValueError(f"Quadratic.eigenvalues must be a non-empty sequence of numbers > 0, got {values!r}")
        values = tuple(check_float("Quadratic", f"eigenvalues[{i}]", v, low=0.0, low_open=True)
                       for i, v in enumerate(values))
        object.__setattr__(self, "eigenvalues", values)
        object.__setattr__(self, "noise", check_float("Quadratic", "noise", self.noise, low=0.0))
        object.__setattr__(self, "pool", check_int("Quadratic", "pool", self.pool, 1))
        object.__setattr__(self, "seed", check_int("Quadratic", "seed", self.seed, 0))
        if self.noise > 0:  # the per-sample noise is drawn up front: pool × dim values
            check_memory("Quadratic", self.pool * len(values), "noise values (pool × eigenvalues)", 8,
                         "lower pool or the number of eigenvalues")

    @property
    def dim(self) -> int:
        return len(self.eigenvalues)

    @property
    def samples(self) -> int:
        return self.pool

    @cached_property
    def lam(self) -> np.ndarray:
        return np.asarray(self.eigenvalues, dtype=float)

    @cached_property
    def xi(self) -> np.ndarray:
        xi = np.random.default_rng([self.seed, 1]).normal(0.0, self.noise, size=(self.pool, self.dim))
        return xi - xi.mean(axis=0)

    def init(self, seed: int) -> np.ndarray:
        return np.random.default_rng([seed, 2]).normal(size=self.dim)

    def gradient(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        g = self.lam * x
        if self.noise > 0:
            g += self.xi[indices].mean(axis=0)
        return g

    def evaluate(self, x: np.ndarray) -> dict[str, float]:
        return {"loss": float(0.5 * np.dot(self.lam, x * x))}


@dataclass(frozen=True)
class LogisticRegression(Problem):
    """L2-regularised logistic regression on seeded synthetic data.

    Features are N(0, 1/features), so a sample's norm is about 1 and the
    Hessian's largest eigenvalue is about ¼·(1 + features/samples)² + l2
    (Marchenko-Pastur edge), whatever the size: the same step sizes work at
    10 features and at 1,000. Labels follow a logistic model with a seeded
    true weight vector (logit standard deviation ``margin``), so the Bayes
    accuracy is below 1 and the held-out loss has a floor above 0.
    """

    features: int
    samples: int
    test_samples: int = 2000
    l2: float = 1e-3
    margin: float = 4.0
    seed: int = 0
    metrics = ("loss", "accuracy")

    def __post_init__(self) -> None:
        owner = "LogisticRegression"
        object.__setattr__(self, "features", check_int(owner, "features", self.features, 1))
        object.__setattr__(self, "samples", check_int(owner, "samples", self.samples, 1))
        object.__setattr__(self, "test_samples", check_int(owner, "test_samples", self.test_samples, 1))
        object.__setattr__(self, "l2", check_float(owner, "l2", self.l2, low=0.0))
        object.__setattr__(self, "margin", check_float(owner, "margin", self.margin, low=0.0, low_open=True))
        object.__setattr__(self, "seed", check_int(owner, "seed", self.seed, 0))
        # the data set is drawn up front in float64 and kept (training part) in float32
        check_memory(owner, (self.samples + self.test_samples) * self.features, "feature values", 12,
                     "lower features or samples")

    @property
    def dim(self) -> int:
        return self.features

    @cached_property
    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, 3])
        n = self.samples + self.test_samples
        truth = rng.normal(0.0, self.margin, size=self.features)
        x = rng.normal(0.0, 1.0 / np.sqrt(self.features), size=(n, self.features))
        y = (rng.random(n) < sigmoid(x @ truth)).astype(float)
        # Training features are stored in float32: a minibatch gradient is
        # memory-bound (gathering b rows), and half the bytes is twice the
        # replay speed; the float32 products are summed into float64 below.
        train = x[: self.samples].astype(np.float32)
        return train, y[: self.samples].astype(np.float32), x[self.samples:], y[self.samples:]

    def init(self, seed: int) -> np.ndarray:
        return np.zeros(self.features)

    def gradient(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        features, labels = self.data[0][indices], self.data[1][indices]
        residual = sigmoid(features @ x.astype(np.float32)) - labels
        g = (residual @ features).astype(np.float64)
        g *= 1.0 / len(indices)
        if self.l2:
            g += self.l2 * x
        return g

    def evaluate(self, x: np.ndarray) -> dict[str, float]:
        _, _, features, labels = self.data
        z = features @ x
        # held-out log-loss: -[y log σ(z) + (1-y) log σ(-z)] = log(1+e^z) - y z
        loss = float(np.mean(np.logaddexp(0.0, z) - labels * z))
        accuracy = float(np.mean((z > 0) == (labels > 0.5)))
        return {"loss": loss, "accuracy": accuracy}
