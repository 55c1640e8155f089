"""Steady-state step time, throughput, speedup and staleness: one definition for simulated and real runs.

Both sides write the same schema (syncsim.recorder: a trace row per timed action, an updates row per
applied gradient), and every figure here is computed from it alone, so a simulated and a measured
run are compared on exactly the same footing:

- a worker's **step boundary** is the end of the last trace row of that (worker, step): a step ends
  when its last sync action (or, for a local step, its compute) has finished;
- **warm-up**: the first tenth of the steps, at least one when there are two or more, is left out (a
  real run's first steps pay for allocator growth and DDP's bucket rebuild; a simulation starts with
  every worker in lockstep);
- a worker's **step time** is the mean gap between the ends of its successive steps after the
  warm-up: (end of its last step − end of its last warm-up step) / (steps after the warm-up);
- **throughput** is the sum over workers of batch / step time (samples per second, whole cluster);
  the run's **step time** is the harmonic mean of the workers' (W · batch / throughput), the time
  per step at which W equal workers would give the same throughput;
- **speedup** is throughput over that of one worker training alone;
- **staleness** statistics are over the updates of steps after the warm-up;
- a run's **spread** is how much its step time wandered while it ran: the coefficient of variation of
  the step times of consecutive equal windows of its steps after the warm-up (step_time_spread);
- several runs of one configuration (simulations with different seeds) are **pooled** as one longer
  run: each worker's step time is its mean over the runs, the staleness every run's updates
  (pooled_steady_state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # frames are only read here; not importing pandas saves every executor rank 0.3 s of start
    import pandas as pd

__all__ = ["SteadyState", "steady_state", "pooled_steady_state", "step_ends", "warmup_steps", "staleness_distance",
           "step_time_spread"]


def _harmonic_step_time(worker_step_times: np.ndarray) -> np.ndarray:
    """The run's step time from its workers' (last axis): their harmonic mean, W · batch / throughput."""
    return worker_step_times.shape[-1] / np.sum(1.0 / worker_step_times, axis=-1)


def warmup_steps(steps: int) -> int:
    """Steps left out of the steady state: the first tenth, at least one when a run has two or more."""
    return max(1, steps // 10) if steps >= 2 else 0


def step_ends(trace: pd.DataFrame, workers: int | None = None, steps: int | None = None) -> np.ndarray:
    """End of each (step, worker): the latest end among that step's trace rows; NaN where it has none.

    Shape (steps, workers); both default to one more than the largest index in the trace.
    """
    w = trace["worker"].to_numpy(dtype=np.int64)
    s = trace["step"].to_numpy(dtype=np.int64)
    workers = int(w.max()) + 1 if workers is None else workers
    steps = int(s.max()) + 1 if steps is None else steps
    ends = np.full((steps, workers), -np.inf)
    np.maximum.at(ends, (s, w), trace["end"].to_numpy(dtype=float))
    ends[np.isneginf(ends)] = np.nan
    return ends


@dataclass(frozen=True)
class SteadyState:
    """The steady-state figures of one run (simulated or real)."""

    steps: int
    warmup: int
    batch_size: int
    worker_step_times: np.ndarray
    """Each worker's mean seconds per step after the warm-up (NaN: too few steps completed)."""
    staleness: np.ndarray
    """Staleness of every update of a step after the warm-up."""

    @property
    def throughput(self) -> float:
        """Samples per second of the whole cluster: sum over workers of batch / step time."""
        times = self.worker_step_times[np.isfinite(self.worker_step_times)]
        return float(self.batch_size * np.sum(1.0 / times)) if len(times) else float("nan")

    @property
    def step_time(self) -> float:
        """Harmonic mean of the workers' step times, so that throughput = W · batch / step_time."""
        times = self.worker_step_times[np.isfinite(self.worker_step_times)]
        return float(_harmonic_step_time(times)) if len(times) else float("nan")

    def speedup(self, baseline_throughput: float) -> float:
        """Throughput over ``baseline_throughput`` (one worker training alone)."""
        return self.throughput / baseline_throughput

    @property
    def staleness_mean(self) -> float:
        return float(self.staleness.mean()) if len(self.staleness) else 0.0

    @property
    def staleness_max(self) -> int:
        return int(self.staleness.max()) if len(self.staleness) else 0


def steady_state(trace: pd.DataFrame, updates: pd.DataFrame, batch_size: int, steps: int | None = None,
                 workers: int | None = None) -> SteadyState:
    """The steady-state figures of a run from its trace and updates tables (see the module's definitions).

    ``steps`` and ``workers`` default to what the trace shows; a worker that completed fewer steps (a
    failed run) is timed over the steps it completed, and left out if those are within the warm-up.
    """
    ends = step_ends(trace, workers, steps)
    steps = ends.shape[0]
    warm = warmup_steps(steps)
    times = np.full(ends.shape[1], np.nan)
    for w in range(ends.shape[1]):
        done = np.flatnonzero(np.isfinite(ends[:, w]))
        last = int(done.max()) if len(done) else -1
        if last < warm or len(done) != last + 1:
            continue  # nothing after the warm-up, or a hole in the trace: no honest figure
        origin = ends[warm - 1, w] if warm else 0.0
        times[w] = (ends[last, w] - origin) / (last + 1 - warm)
    stale = updates.loc[updates["step"].to_numpy() >= warm, "staleness"].to_numpy(dtype=np.int64)
    return SteadyState(steps=steps, warmup=warm, batch_size=int(batch_size), worker_step_times=times,
                       staleness=stale)


def pooled_steady_state(states: list[SteadyState]) -> SteadyState:
    """Runs of one configuration taken together, as one run as long as all of them: each worker's step
    time is its mean over the runs (they time the same number of steps after the same warm-up), the
    staleness every run's updates. A worker without a figure in any run has none pooled (NaN)."""
    if not states:
        raise ValueError("pooled_steady_state: no runs to pool")
    first = states[0]
    for other in states[1:]:
        if (other.steps, other.warmup, other.batch_size) != (first.steps, first.warmup, first.batch_size) \
                or other.worker_step_times.shape != first.worker_step_times.shape:
            raise ValueError("pooled_steady_state: runs differ in steps, warm-up, batch size or workers "
                             f"({other.steps}, {other.warmup}, {other.batch_size}, {len(other.worker_step_times)}"
                             f" against {first.steps}, {first.warmup}, {first.batch_size}, "
                             f"{len(first.worker_step_times)})")
    times = np.mean([s.worker_step_times for s in states], axis=0)  # NaN in any run stays NaN
    return SteadyState(steps=first.steps, warmup=first.warmup, batch_size=first.batch_size, worker_step_times=times,
                       staleness=np.concatenate([s.staleness for s in states]))


def step_time_spread(trace: pd.DataFrame, windows: int = 4, steps: int | None = None,
                     workers: int | None = None) -> float:
    """How much a run's step time wandered while it ran: the coefficient of variation of the step times
    of ``windows`` consecutive, equal windows of its steps after the warm-up.

    Each window's step time is taken as the run's is (each worker's mean gap between step ends in the
    window, harmonic mean over workers). A simulation without jitter gives 0; a measured run gives the
    drift of the machine it ran on, the floor below which no prediction of it can be judged. NaN when
    a worker has a hole in its trace or a window would hold no step.
    """
    if windows < 2:
        raise ValueError(f"step_time_spread: windows must be at least 2, got {windows}")
    ends = step_ends(trace, workers, steps)
    warm = warmup_steps(ends.shape[0])
    # window i holds the steps after bounds[i] up to bounds[i+1]; the first starts at the warm-up's last step
    bounds = np.linspace(warm - 1, ends.shape[0] - 1, windows + 1).round().astype(int)
    if warm < 1 or np.any(np.diff(bounds) < 1) or not np.isfinite(ends[bounds[0]:]).all():
        return float("nan")
    per_worker = (ends[bounds[1:]] - ends[bounds[:-1]]) / np.diff(bounds)[:, None]  # (windows, workers)
    times = _harmonic_step_time(per_worker)
    return float(times.std() / times.mean())


def staleness_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov–Smirnov statistic of two staleness samples: max |F_a(k) − F_b(k)| over k.

    0 for identical distributions, 1 for disjoint ones; staleness is an integer, so the empirical CDFs
    are compared at every value either sample takes.
    """
    a, b = np.sort(np.asarray(a)), np.sort(np.asarray(b))
    if not len(a) or not len(b):
        return float("nan")
    values = np.union1d(a, b)
    cdf_a = np.searchsorted(a, values, side="right") / len(a)
    cdf_b = np.searchsorted(b, values, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))
