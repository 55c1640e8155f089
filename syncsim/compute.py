"""Per-(step, worker) compute times: speed factors, jitter and stragglers, drawn reproducibly; or
replayed from a table of measured times.

Times are drawn in blocks of steps from generators seeded by (seed, block), so
the time of (step, worker) depends only on the seed, never on the order in
which a simulation happens to ask for it. ``ReplayedTimes`` instead hands out
given times as they are (a measured run's own compute phases), which separates
what a prediction owes to its compute model from what it owes to the network.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from syncsim.cluster import Cluster
from syncsim.workload import Workload

__all__ = ["ComputeTimes", "ReplayedTimes", "slowest_excess", "jitter_for_slowest"]

BLOCK_STEPS = 64


class ComputeTimes:
    def __init__(self, cluster: Cluster, workload: Workload, seed: int) -> None:
        self.workers = cluster.gpus
        base = np.full(self.workers, float(workload.compute_time))  # type: ignore[arg-type]
        if cluster.speed is not None:
            base = base / np.asarray(cluster.speed, dtype=float)
        self.base = base
        self.seed = int(seed)
        # Lognormal noise with mean 1 and coefficient of variation ``jitter``:
        # sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2 (moments of the lognormal).
        self.sigma = math.sqrt(math.log1p(cluster.jitter**2)) if cluster.jitter > 0 else 0.0
        self.straggler_prob = cluster.straggler_prob
        self.slowdown = cluster.straggler_slowdown
        self._rows: dict[int, list[list[float]]] = {}
        # Keep about 256 MiB of drawn times; workers of an asynchronous run can
        # drift apart by many blocks, so evict only under memory pressure.
        self.max_blocks = max(4, (32 * 2**20) // (BLOCK_STEPS * self.workers))
        self.random = self.sigma > 0 or (self.straggler_prob > 0 and self.slowdown > 1)

    def block(self, index: int) -> np.ndarray:
        """Compute times of steps [index·64, index·64 + 64) for every worker, shape (64, workers)."""
        times = np.broadcast_to(self.base, (BLOCK_STEPS, self.workers)).copy()
        if self.random:
            rng = np.random.default_rng([self.seed, index])
            if self.sigma > 0:
                times *= rng.lognormal(-self.sigma**2 / 2, self.sigma, size=times.shape)
            if self.straggler_prob > 0 and self.slowdown > 1:
                times[rng.random(times.shape) < self.straggler_prob] *= self.slowdown
        return times

    def __call__(self, step: int, worker: int) -> float:
        # Kept as Python lists: they index several times faster than numpy
        # scalars, and this is called once per worker per step.
        index = step // BLOCK_STEPS
        rows = self._rows.get(index)
        if rows is None:
            rows = self._rows[index] = self.block(index).tolist()
            if len(self._rows) > self.max_blocks:
                # Evict the oldest; asking for it again regenerates the same values.
                self._rows.pop(min(self._rows))
        return rows[step % BLOCK_STEPS][worker]


class ReplayedTimes:
    """Compute times given per (step, worker), seconds: row ``step``, column ``worker`` of ``times``,
    used as they are (no speed factor, jitter or straggler is applied on top: they are what ran)."""

    def __init__(self, times, steps: int, workers: int) -> None:
        try:
            table = np.array(times, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"compute_times must be a table of seconds, one row per step and one column per "
                             f"worker; got {type(times).__name__}") from None
        if table.ndim != 2 or table.shape[0] < steps or table.shape[1] != workers:
            raise ValueError(f"compute_times must have at least {steps} rows (steps) and exactly {workers} "
                             f"columns (workers), got shape {table.shape}")
        bad = ~np.isfinite(table[:steps]) | (table[:steps] < 0)
        if bad.any():
            step, worker = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"compute_times[{step}][{worker}] must be a finite number of seconds >= 0, "
                             f"got {table[step, worker]!r}")
        self._rows = table[:steps].tolist()  # lists index faster than numpy scalars (ComputeTimes.__call__)

    def __call__(self, step: int, worker: int) -> float:
        return self._rows[step][worker]


# Common random numbers for slowest_excess: the same standard normals for every jitter, so the excess is a
# smooth increasing function of the jitter that bisection can invert (20,000 draws: a standard error of
# about 0.2 % of the mean at the jitters the testbed measures).
_SLOWEST_DRAWS, _SLOWEST_SEED = 20_000, 20261207


def slowest_excess(jitter: float, workers: int, steps: int = 1) -> float:
    """How far, on average, the slowest of ``workers`` workers' work between two meetings (each the sum of
    ``steps`` of ComputeTimes' lognormal draws of coefficient of variation ``jitter``, mean 1 each) lies
    above the mean work: E[max over workers] / steps - 1, by a fixed Monte Carlo sample."""
    if jitter <= 0 or workers < 2:
        return 0.0
    sigma = math.sqrt(math.log1p(jitter**2))
    work = np.exp(sigma * _slowest_draws(workers, steps) - sigma**2 / 2).sum(axis=2)
    return float(work.max(axis=1).mean() / steps - 1.0)


@functools.lru_cache(maxsize=16)
def _slowest_draws(workers: int, steps: int) -> np.ndarray:
    """slowest_excess's standard normals, drawn once per shape: jitter_for_slowest's bisection asks for the
    same ones some forty times."""
    draws = np.random.default_rng(_SLOWEST_SEED).standard_normal((_SLOWEST_DRAWS, workers, steps))
    draws.flags.writeable = False  # shared by every caller
    return draws


def jitter_for_slowest(excess: float, workers: int, steps: int = 1, high: float = 10.0) -> float:
    """The jitter whose slowest_excess over ``workers`` workers and ``steps`` steps between meetings is
    ``excess``: 0 for none, ``high`` where even that falls short.

    Why: workers that share a machine's cores all at once are not independent. When one waits for a time slice
    another runs, so their steps' spread (the compute probe's jitter: 0.24-0.42 for four ranks of the small
    model on two cores) need not say how late the slowest of them is, which is what a collective waits for
    (four local-SGD ranks of it: a spread of 0.89, the slowest as late as 0.64 makes it). ComputeTimes draws
    each worker independently; given this jitter, the slowest of its draws is as late as the slowest rank was,
    measured, at each meeting of the compute probe."""
    if excess <= 0 or workers < 2:
        return 0.0
    if slowest_excess(high, workers, steps) <= excess:
        return high
    low, top = 0.0, high
    for _ in range(40):  # 10 / 2**40: far below what the sample resolves
        mid = (low + top) / 2
        if slowest_excess(mid, workers, steps) < excess:
            low = mid
        else:
            top = mid
    return (low + top) / 2

