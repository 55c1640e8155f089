"""The step-size bound under which gradient descent with a fixed delay converges on a quadratic.

On one eigen-direction of a quadratic, a gradient that is always ``tau``
versions old gives the linear difference-delay equation

    x[t+1] = x[t] - a * x[t - tau],   a = step size × eigenvalue,

whose zero solution is asymptotically stable iff 0 < a < 2·sin(π / (2(2τ+1)))
(Levin & May 1976, "A note on difference-delay equations", Theoretical
Population Biology 9:178-187). τ = 0 gives plain gradient descent's a < 2;
then 1, 0.618 (the golden ratio's inverse), 0.445, ... ~ π/(2τ) for large τ:
staleness shrinks the usable step size roughly in proportion.
"""

from __future__ import annotations

import math

import numpy as np

from syncsim.config import check_int

__all__ = ["delay_bound", "delay_spectral_radius"]


def delay_bound(tau: int) -> float:
    """Largest a (exclusive) for which x[t+1] = x[t] - a·x[t-tau] converges."""
    tau = check_int("delay_bound", "tau", tau, 0)
    return 2.0 * math.sin(math.pi / (2 * (2 * tau + 1)))


def delay_spectral_radius(a: float, tau: int) -> float:
    """Per-step contraction (<1) or growth (>1) factor: the largest root of z^(τ+1) - z^τ + a."""
    tau = check_int("delay_spectral_radius", "tau", tau, 0)
    coefficients = np.zeros(tau + 2)
    coefficients[0], coefficients[1], coefficients[-1] = 1.0, -1.0, a
    if tau == 0:
        coefficients = np.array([1.0, a - 1.0])
    return float(np.max(np.abs(np.roots(coefficients))))
