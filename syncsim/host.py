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
syncsim.network uses for flows sharing a link. With a spread longer than a step's work each computes
alone. With no spread (``exit_spread`` 0) the ranks leave together and a compute after a collective keeps
its drawn time: they all compute at once, which is what the probe timed.

``SharedCores`` prices the computes of workers that never meet at a collective (a parameter server's)
the same way, as the simulation reaches each: such workers do not start together (a server's replies
end when each worker's share of its link lets them, and a worker whose reply came first computes while
the others still receive). Each compute joins the cores when it starts, as a job of its drawn time over
the contention, and the jobs present share the cores as above, each arrival and departure changing the
others' pace: all workers computing at once take their drawn time, fewer take less. On the testbed,
four parameter-server workers of LeNet on two cores computed a median 19.7-27.7 ms a step where the
probe's four ranks at once took 37.1 ms and a lone rank 17.4 ms (docs/log.md, "The cores a parameter
server's workers share"). Workers that meet at collectives keep their drawn times when they leave
together: the probe timed its ranks meeting so, and the jitter a study gives them is the one whose
slowest independent draw is as late as the probe's slowest rank (syncsim.compute.jitter_for_slowest).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SharedCores", "SharedHost", "shared_finish"]

_KEPT_STEPS = 4  # schedules kept: every worker takes its compute of a step within a few steps of the others


def _rate(present: int, cores: int, overhead: float) -> float:
    """The share of a core each of ``present`` jobs gets: processor sharing's min(1, cores / present), less
    ``overhead`` while the jobs outnumber the cores."""
    return min(1.0, cores / present) / (overhead if present > cores else 1.0)


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
        rate = _rate(len(left), cores, overhead)
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


def _slowdowns(cores: int, workers: int, contention: float | None) -> tuple[float, float]:
    """How many times longer than alone a worker computes with all ``workers`` computing at once on
    ``cores`` cores (the measured ``contention``, or the even share max(1, workers / cores) where none is
    given or the workers do not outnumber the cores), and the overhead beyond that even share."""
    even = max(1.0, workers / cores)  # processor sharing's slowdown of every rank computing at once
    # With more ranks than cores, time-slicing them need not cost the even share (measured: four ranks
    # on two cores 1.9-2.9 times a lone rank's step of the small model, 1.5-1.8 times LeNet's); the
    # difference is charged whenever more ranks than cores compute, so all of them starting together
    # still take the drawn time.
    slowdown = even if contention is None or workers <= cores else contention
    return slowdown, slowdown / even


class SharedCores:
    """The host's cores as the simulation runs (SimPy): each compute that ``start`` is given is a job of its
    drawn seconds over the contention (its work alone), and the jobs present at any moment share the cores
    as shared_finish shares them. Unlike SharedHost's schedules, which know every start in advance, jobs
    arrive as the simulated workers reach their compute (a parameter-server worker's, when its pull ends),
    so each arrival and each departure resets the others' progress rates."""

    def __init__(self, env, cores: int, workers: int, contention: float | None = None) -> None:
        self.env, self.cores = env, cores
        self.contention, self.overhead = _slowdowns(cores, workers, contention)
        self._left: dict[object, float] = {}  # the event a job's end triggers -> its work left, jobs present
        self._since = 0.0  # when the jobs' work left was last brought up to date
        self._due = 0  # which departure scheduled last is still due (an arrival or departure reschedules)

    def start(self, at: float, drawn: float):
        """An event that triggers when a compute of ``drawn`` seconds (a draw of the step all workers take
        computing at once) that starts at ``at`` (not before now) ends on the shared cores."""
        done = self.env.event()
        work = drawn / self.contention
        if at > self.env.now:
            self.env.timeout(at - self.env.now).callbacks.append(lambda _: self._arrive(done, work))
        else:
            self._arrive(done, work)
        return done

    def _pace(self) -> float:
        """The share of a core each job present gets now (_rate of their number)."""
        return _rate(len(self._left), self.cores, self.overhead)

    def _catch_up(self) -> None:
        now = self.env.now
        if self._left:
            done = (now - self._since) * self._pace()
            for job in self._left:
                self._left[job] -= done
        self._since = now

    def _arrive(self, done, work: float) -> None:
        self._catch_up()
        self._left[done] = work
        self._schedule()

    def _schedule(self) -> None:
        self._due += 1
        if self._left:
            due = self._due
            wait = max(0.0, min(self._left.values())) / self._pace()
            self.env.timeout(wait).callbacks.append(lambda _: self._depart(due))

    def _depart(self, due: int) -> None:
        if due != self._due:  # an arrival or departure since rescheduled the next departure
            return
        self._catch_up()
        first = min(self._left, key=self._left.__getitem__)
        for job in [job for job, work in self._left.items() if job is first or work <= 1e-15]:
            del self._left[job]
            job.succeed()
        self._schedule()


class SharedHost:
    """The compute of ``workers`` ranks on one host of ``cores`` cores (the module's docstring); ranks leave
    each collective ``exit_spread`` seconds apart, their order drawn from ``seed``. ``contention``: how many
    times longer a rank's step took with every rank computing at once than alone (None: workers / cores,
    the cores shared evenly and nothing lost to sharing them)."""

    def __init__(self, cores: int, workers: int, exit_spread: float, seed: int,
                 contention: float | None = None) -> None:
        self.cores, self.workers, self.spread, self.seed = cores, workers, exit_spread, seed
        self.contention, self.overhead = _slowdowns(cores, workers, contention)
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
