"""One host's cores shared by every worker's compute: an emulated cluster on one machine.

Real GPUs compute independently; the testbed's ranks (real.testbed) are processes on one machine of a
few cores. Its compute probe times a rank's step with every rank computing at once, which is what
``Workload.compute_time`` then is. After a collective the ranks do not start together: a gloo ring's
ranks leave it milliseconds apart (four hosts of the small model: 3.2-4.5 ms at every rate, measured by
real.calibration.timing's exits), and whoever leaves first computes while the others are still in the
ring or computing beside it. How much their compute then overlaps on the cores, not the probe's
all-at-once step, sets when the last of them reaches the next collective.

``SharedHost`` prices that: a rank's work alone is the drawn compute time divided by the contention the
probe saw (measured: the all-at-once step over a lone rank's; by default max(1, workers / cores), the
even share, whose excess or shortfall is charged while more ranks than cores compute); after each
collective the ranks leave ``exit_spread`` apart (evenly spaced, in an order drawn per collective), and
their work is shared among the cores by processor sharing (each of n computing ranks progresses at
min(1, cores / n) of a core), the model
syncsim.network uses for flows sharing a link. With no spread the ranks start together and, their
draws equal, each takes the drawn time, as without a host (unequal draws end closer together than drawn:
the cores are shared until the shortest is done); with a spread longer than a step's work each computes
alone.
Compute that does not follow a collective (a local step, a parameter-server worker's) keeps the drawn
time: the ranks are then all computing, as in the probe.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SharedHost", "shared_finish"]

_KEPT_STEPS = 4  # schedules kept: every worker takes its compute of a step within a few steps of the others


def shared_finish(starts, works, cores: int, overhead: float = 1.0) -> list[float]:
    """When each job ends: job i arrives at ``starts[i]`` with ``works[i]`` seconds of work for one core,
    and the jobs present share ``cores`` cores equally (each at min(1, cores / n) of a core while n are
    present; processor sharing), each ``overhead`` times slower still (below 1: faster) while more jobs than
    cores are present (what time-slicing them costs or spares beyond the even share, as measured)."""
    order = sorted(range(len(starts)), key=lambda i: starts[i])
    finish = [0.0] * len(starts)
    left: dict[int, float] = {}  # job -> work left, for the jobs present
    now, arrived = (starts[order[0]] if order else 0.0), 0
    while arrived < len(order) or left:
        if not left:  # idle until the next arrival
            now = max(now, starts[order[arrived]])
        while arrived < len(order) and starts[order[arrived]] <= now:
            left[order[arrived]] = float(works[order[arrived]])
            arrived += 1
        rate = min(1.0, cores / len(left)) / (overhead if len(left) > cores else 1.0)
        first = min(left, key=left.__getitem__)
        done_at = now + left[first] / rate
        next_arrival = starts[order[arrived]] if arrived < len(order) else float("inf")
        until = min(done_at, next_arrival)
        for job in left:
            left[job] -= (until - now) * rate
        now = until
        for job in [job for job, work in left.items() if work <= 1e-15 or (job == first and until == done_at)]:
            finish[job] = now
            del left[job]
    return finish


class SharedHost:
    """The compute of ``workers`` ranks on one host of ``cores`` cores (the module's docstring); ranks leave
    each collective ``exit_spread`` seconds apart, their order drawn from ``seed``. ``contention``: how many
    times longer a rank's step took with every rank computing at once than alone (None: workers / cores,
    the cores shared evenly and nothing lost to sharing them)."""

    def __init__(self, cores: int, workers: int, exit_spread: float, seed: int,
                 contention: float | None = None) -> None:
        self.cores, self.workers, self.spread, self.seed = cores, workers, exit_spread, seed
        even = max(1.0, workers / cores)  # processor sharing's slowdown of every rank computing at once
        # With more ranks than cores, time-slicing them need not cost the even share (measured: four ranks
        # on two cores 1.9-2.9 times a lone rank's step of the small model, 1.5-1.8 times LeNet's); the
        # difference is charged whenever more ranks than cores compute, so all of them starting together
        # still take the drawn time.
        self.contention = even if contention is None or workers <= cores else contention
        self.overhead = self.contention / even
        self._schedules: dict[int, list[float]] = {}

    def after_collective(self, step: int, worker: int, times) -> float:
        """Seconds from a collective's end until ``worker``'s compute of ``step`` ends, every worker having
        left that collective and taken its compute of ``step`` (drawn by ``times(step, w)``) after it."""
        schedule = self._schedules.get(step)
        if schedule is None:
            schedule = self._schedules[step] = self._schedule(step, times)
            if len(self._schedules) > _KEPT_STEPS:
                self._schedules.pop(min(self._schedules))
        return schedule[worker]

    def _schedule(self, step: int, times) -> list[float]:
        n = self.workers
        gap = self.spread / (n - 1) if n > 1 else 0.0  # between one worker's leaving and the next's
        leads = [0.0] * n  # how long before the collective's end each worker left it
        for position, worker in enumerate(np.random.default_rng([self.seed, step, 1]).permutation(n)):
            leads[int(worker)] = gap * (n - 1 - position)
        works = [times(step, w) / self.contention for w in range(n)]
        return [max(0.0, end) for end in shared_finish([-lead for lead in leads], works, self.cores, self.overhead)]
