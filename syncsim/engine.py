"""The SimPy engine: one process per worker carrying out its policy's plan, step by step.

The engine knows how to perform each *action* (syncsim.schemes.actions) on the
modelled cluster; it never looks at which scheme produced the plan.

Compute is taken lazily: a ``Compute`` action only notes when the worker's
gradient will be ready. The next action decides how to wait for it: a
collective folds the compute into its own schedule (overlapping buckets with
backward), anything else waits until the compute has finished. This keeps a
synchronous step at one scheduled event for all W workers instead of W. A
compute that starts after its worker sat idle since its last one (waiting for
parameter servers) lasts ``Workload.idle_extra`` of that idle time longer; a
worker that waited for a collective of its own was not idle (the collective's
reduction runs on its processor) and pays nothing.

Compressors' own work (``compression_work``) is charged at the workload's physical rates
(``Workload.compress_flops``, ``Workload.scan_rate``) where it falls: the work before a collective
delays the worker's contribution (the collective starts when the slowest worker's is ready; the
time lies between the trace rows, like waiting), the work after its last collective (decompression)
ends the collective's trace row and lands the new version that much later. Unset rates cost nothing.
Every worker works at the same rates: the cluster's speed factors, jitter and stragglers scale the
model's compute only, and replayed compute times (``simulate(compute_times=...)``) leave the
compressors' work priced as it is.

Sharded data parallelism's actions (``SHARDED_ACTIONS``: reduce-scatters, parameter gathers, the
sharded optimiser step) are taken lazily too: each is noted, and at the end of the step the step's
sharded actions and its compute join the communicator as one schedule
(``Communicator.join_schedule``), which lays every unit's gather, compute and reduce-scatter out in
time: one event per step for all workers, as for an all-reduce. A plan that mixes them with actions
other than ``Compute`` is refused. The compute's trace row then runs from when the first unit's
parameters have arrived to the compute's end, later waits for gathered parameters included; the
optimiser step takes no time (as no optimiser step does here), and the new version lands when the
step's last collective ends.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from syncsim.cluster import Cluster
from syncsim.communicator import ALLGATHER, Communicator, build_schedule
from syncsim.compression.work import compression_work
from syncsim.compute import ComputeTimes, ReplayedTimes
from syncsim.config import check_int
from syncsim.host import SharedCores, SharedHost
from syncsim.limits import SIM_BYTES_PER_WORKER_STEP, check_memory
from syncsim.model_state import ModelState
from syncsim.recorder import KIND_CODE, Recorder
from syncsim.result import SimResult
from syncsim.schemes import (
    SHARDED_ACTIONS,
    AllGatherParameters,
    AllReduceGradients,
    AverageParameters,
    Compute,
    LocalUpdate,
    LowRankAllReduce,
    OuterStep,
    Pull,
    Push,
    ReduceScatterGradients,
    Scheme,
    ShardedOptimizerStep,
    SparseAllGather,
    WaitForClock,
    parse,
)
from syncsim.server import ServerGroup
from syncsim.workload import Workload

__all__ = ["simulate", "speedup", "PendingCompute"]

_GENERATOR = type(x for x in ())

_COMPUTE, _PUSH, _PULL, _WAIT = (KIND_CODE[k] for k in ("compute", "push", "pull", "wait"))
_COLLECTIVES = (AllReduceGradients, AverageParameters, LowRankAllReduce, SparseAllGather, OuterStep,
                AllGatherParameters, ReduceScatterGradients)
# collectives every worker waits out and leaves before its next action (a sharded action is only noted,
# and carried out with the step's compute in one schedule): what a shared host's workers leave apart
_LEFT = tuple(kind for kind in _COLLECTIVES if kind not in SHARDED_ACTIONS)
# actions at which workers meet: where a scheme has any, its computes keep their drawn times on a shared host
# with no exit spread (syncsim.host): the compute probe timed its ranks meeting so, and the jitter a study
# gives such workers makes the slowest of independent draws as late as the probe's slowest rank
_MEETINGS = frozenset(_COLLECTIVES) | frozenset(SHARDED_ACTIONS)


@dataclass(slots=True)
class PendingCompute:
    """A worker's lazily taken compute (the module's docstring) and the message latency it still owes.

    Mutable and slotted: the engine's hot path updates it in place once or twice per action.
    """

    start: float = 0.0
    duration: float = 0.0
    outstanding: bool = False
    """Whether the compute from ``start`` for ``duration`` has not yet been waited out or joined."""
    owed: float = 0.0
    """Seconds of message latency owed, paid by the next wait (a pull's or clock wait's answer)."""


class _Run:
    def __init__(self, cluster: Cluster, workload: Workload, scheme: Scheme, steps: int, seed: int,
                 compute_times=None) -> None:
        self.env = env = simpy.Environment()
        self.steps = steps
        self.workers = cluster.gpus
        self.recorder = Recorder()
        self.state = ModelState(self.workers, self.recorder)
        self.policy = scheme.policy(workload.param_bytes, workload.layers, workload.backward_fraction,
                                    workload.shapes)
        kinds = self.policy.action_types(steps)
        # One host's cores shared by every worker's compute (syncsim.host), when the cluster has one: where the
        # workers meet at collectives, the computes after each left its measured spread apart (host); where
        # they never meet (a parameter server's), every compute as it comes (cores).
        self.host: SharedHost | None = None
        self.cores: SharedCores | None = None
        if compute_times is None:
            self.times = ComputeTimes(cluster, workload, seed)
            self.idle_extra = workload.idle_extra if workload.idle_cost else None
            if cluster.host_cores is not None and not kinds & _MEETINGS:
                self.cores = SharedCores(env, cluster.host_cores, cluster.gpus, cluster.host_contention)
            elif cluster.host_cores is not None and cluster.exit_spread > 0:
                self.host = SharedHost(cluster.host_cores, cluster.gpus, cluster.exit_spread, seed,
                                       cluster.host_contention)
        else:  # measured phases already hold whatever their idling (and sharing) cost them: nothing on top
            self.times, self.idle_extra = ReplayedTimes(compute_times, steps, cluster.gpus), None
        self.comm = Communicator(env, cluster, self.recorder, self.state)
        uses_servers = self.policy.needs_servers(steps)
        self.servers = ServerGroup(env, cluster, self.recorder, self.state, seed) if uses_servers else None
        self.heard = [0] * self.workers  # the slowest clock each worker last heard of from the servers
        self.step_end = np.zeros((steps, self.workers))
        self.flop_rate, self.scan_rate = workload.compress_flops, workload.scan_rate
        self._stages: dict[object, tuple[float, ...]] = {}
        if kinds & set(SHARDED_ACTIONS) and kinds - set(SHARDED_ACTIONS) - {Compute}:
            others = ", ".join(sorted(k.__name__ for k in kinds - set(SHARDED_ACTIONS) - {Compute}))
            raise ValueError(f"scheme {str(scheme)!r}: the simulator schedules sharded actions only with the step's "
                             f"Compute, not beside {others}")
        self.noted: list[list] = [[] for _ in range(self.workers)]  # each worker's sharded actions of its step
        self._schedules: dict[tuple[int, ...], object] = {}
        self.handlers: dict[type, Callable] = {
            AllReduceGradients: self._allreduce, AverageParameters: self._average, LocalUpdate: self._local_update,
            Push: self._push, WaitForClock: self._wait, Pull: self._pull, LowRankAllReduce: self._low_rank,
            SparseAllGather: self._allgather, OuterStep: self._outer, ReduceScatterGradients: self._note,
            AllGatherParameters: self._note, ShardedOptimizerStep: self._note,
        }  # Compute is taken inline in worker(), lazily

    # A handler returns None, one event to wait for, or a generator of
    # events (several waits). ``pending`` carries the lazily
    # taken compute and the latency owed (PendingCompute). Message
    # latency is folded into a wait the worker makes anyway: a push waits out
    # compute and then alpha before its bytes enter the link; a pull's alpha
    # delays the start of the next compute. Uncontended, both equal alpha + n/B.
    def worker(self, w: int):
        plan, steps, handlers, step_end, env = self.policy.plan, self.steps, self.handlers, self.step_end, self.env
        times, idle_extra, host, cores = self.times, self.idle_extra, self.host, self.cores
        pending = PendingCompute()
        computed = None  # when this worker's last compute ended
        left_collective = False  # whether the worker's last action was a collective, just over
        shared = False  # whether the compute just taken is the shared cores' to time (cores)
        noted = self.noted[w]
        for step in range(steps):
            for action in plan(step, steps):
                if type(action) is Compute:
                    start = env.now + pending.owed
                    if left_collective:  # shared with the others who left it (syncsim.host)
                        duration = host.after_collective(step, w, times)  # type: ignore[union-attr]
                    else:
                        duration = times(step, w)
                    if idle_extra is not None and computed is not None and start > computed:
                        duration += idle_extra(start - computed)  # it idled since (Workload.idle_cost)
                    pending.start, pending.duration, pending.outstanding, pending.owed = start, duration, True, 0.0
                    computed = start + duration
                    shared = cores is not None
                    left_collective = False
                    continue
                if shared:  # the compute just taken ends when the cores, shared with whatever else computes
                    shared = False  # meanwhile, finish it
                    yield from self._share(pending)
                    computed = pending.start + pending.duration
                if idle_extra is not None and type(action) in _COLLECTIVES:
                    computed = None  # the worker's own reduction keeps its processor busy: not idle
                wait = handlers[type(action)](w, step, action, pending)
                if wait is not None:  # a single event, or a generator of several
                    if type(wait) is _GENERATOR:
                        yield from wait
                    else:
                        yield wait
                left_collective = host is not None and type(action) in _LEFT
            if shared:  # a step that ends on its own compute
                shared = False
                yield from self._share(pending)
                computed = pending.start + pending.duration
            if noted:  # the step's sharded actions, with its compute, as one schedule
                yield self._sharded(w, step, pending, noted)
            if pending.outstanding:  # a step that ends on its own compute (a local step)
                yield from self._settle(w, step, pending)
            # A pull's latency still owed is paid by the next compute; the step
            # itself ends when the parameters have arrived.
            step_end[step, w] = env.now + pending.owed

    def _share(self, pending: PendingCompute):
        """Wait out the compute just taken on the shared cores (SharedCores): its drawn duration becomes the
        time the cores, shared with every other compute in progress, take to finish it."""
        yield self.cores.start(pending.start, pending.duration)  # type: ignore[union-attr]
        pending.duration = self.env.now - pending.start

    def _ready_in(self, w: int, step: int, pending: PendingCompute, extra: float = 0.0) -> float:
        """Seconds until the outstanding compute (and any owed latency, plus ``extra``) is over."""
        now = self.env.now
        ready = now + pending.owed
        pending.owed = 0.0
        if pending.outstanding:
            start, duration = pending.start, pending.duration
            pending.outstanding = False
            self.recorder.event(w, step, _COMPUTE, start, start + duration, 0.0)
            if start + duration > ready:
                ready = start + duration
        return ready + extra - now

    def _settle(self, w: int, step: int, pending: PendingCompute):
        delay = self._ready_in(w, step, pending)
        if delay > 0:
            yield self.env.timeout(delay)

    def _allreduce(self, w: int, step: int, action: AllReduceGradients, pending: PendingCompute):
        if pending.outstanding:  # _join's, written out: the hot path of every synchronous step
            pending.outstanding = False
            return self.comm.join(w, step, "allreduce", action.buckets, action.ready, action.algorithm,
                                  pending.start, pending.duration, True)
        return self._join_now(w, step, "allreduce", action.buckets, action.ready, action.algorithm, pending)

    def _join(self, w, step, kind, buckets, ready, algorithm, pending, before=0.0, after=0.0, last=True):
        """Join a collective: a compute still outstanding is folded into its schedule (no event of the
        worker's own); otherwise the worker joins once any latency it owes is paid."""
        if pending.outstanding:
            pending.outstanding = False
            return self.comm.join(w, step, kind, buckets, ready, algorithm, pending.start, pending.duration, True, last,
                                  before, after)
        return self._join_now(w, step, kind, buckets, ready, algorithm, pending, before, after, last)

    def _join_now(self, w, step, kind, buckets, ready, algorithm, pending, before=0.0, after=0.0, last=True):
        yield from self._settle(w, step, pending)
        yield self.comm.join(w, step, kind, buckets, ready, algorithm, self.env.now, 0.0, False, last, before, after)

    def stage_seconds(self, action) -> tuple[float, ...]:
        """Seconds of each stage of ``action``'s compression work (compression_work) at the workload's
        rates; a rate left unset (None) costs nothing. Cached per distinct action."""
        seconds = self._stages.get(action)
        if seconds is None:
            flop_rate, scan_rate = self.flop_rate, self.scan_rate
            seconds = self._stages[action] = tuple(
                (flops / flop_rate if flop_rate else 0.0) + (values / scan_rate if scan_rate else 0.0)
                for flops, values in compression_work(action, self.workers))
        return seconds

    def _note(self, w: int, step: int, action: object, pending: PendingCompute) -> None:
        # a sharded action: carried out with the rest of the step's (worker(), _sharded)
        self.noted[w].append(action)

    def _sharded(self, w: int, step: int, pending: PendingCompute, noted: list):
        """Join the step's sharded schedule: the noted actions, laid out around the step's compute."""
        key = tuple(map(id, noted))
        schedule = self._schedules.get(key)
        if schedule is None:  # the schedule keeps its actions, so their ids stay theirs
            schedule = self._schedules[key] = build_schedule(tuple(noted))
        noted.clear()
        if pending.outstanding:
            pending.outstanding = False
            return self.comm.join_schedule(w, step, schedule, pending.start, pending.duration, True)
        base = self.env.now + pending.owed
        pending.owed = 0.0
        return self.comm.join_schedule(w, step, schedule, base, 0.0, False)

    def _local_update(self, w: int, step: int, action: LocalUpdate, pending: PendingCompute):
        yield from self._settle(w, step, pending)
        self.state.local[w].append(step)

    def _average(self, w: int, step: int, action: AverageParameters, pending: PendingCompute):
        return self._join_now(w, step, "average", (action.nbytes,), (1.0,), action.algorithm, pending)

    def _low_rank(self, w: int, step: int, action: LowRankAllReduce, pending: PendingCompute):
        # two all-reduces, one after the other: P (with the uncompressed values), then Q; one new version.
        # Each worker computes P before round one and Q between the rounds; P̂Qᵀ after round two.
        before, between, after = self.stage_seconds(action)
        first = self._join(w, step, "allreduce", (action.p_bytes,), (1.0,), action.algorithm, pending, before,
                           last=False)
        if type(first) is _GENERATOR:
            yield from first
        else:
            yield first
        yield self.comm.join(w, step, "allreduce", (action.q_bytes,), (1.0,), action.algorithm, self.env.now, 0.0,
                             False, True, between, after)

    def _allgather(self, w: int, step: int, action: SparseAllGather, pending: PendingCompute):
        # the selection before the all-gather, the scatter-add of every worker's entries after it
        before, after = self.stage_seconds(action)
        return self._join(w, step, "allgather", (action.nbytes,), (1.0,), ALLGATHER, pending, before, after)

    def _outer(self, w: int, step: int, action: OuterStep, pending: PendingCompute):
        # the pseudo-gradient before the all-reduce, the outer optimiser's step after it
        before, after = self.stage_seconds(action)
        return self._join(w, step, "outer", (action.nbytes,), (1.0,), action.algorithm, pending, before, after)

    def _push(self, w: int, step: int, action: Push, pending: PendingCompute):
        servers = self.servers
        sent = max(self.env.now + pending.owed, pending.start + pending.duration if pending.outstanding else 0.0)
        delay = self._ready_in(w, step, pending, servers.latency)  # type: ignore[union-attr]
        if delay > 0:
            yield self.env.timeout(delay)
        yield servers.push(action.nbytes)  # type: ignore[union-attr]
        if servers.service:  # the server takes the pushed bytes in before it applies them
            yield self.env.timeout(servers.service)  # type: ignore[union-attr]
        self.recorder.event(w, step, _PUSH, sent, self.env.now, action.nbytes)
        servers.arrive(w, step, self.state.read[w], action.aggregate)  # type: ignore[union-attr]

    def _wait(self, w: int, step: int, action: WaitForClock, pending: PendingCompute):
        yield from self._settle(w, step, pending)
        # A clock wait the slowest clock last heard of (with the last pull or wake-up) already allows
        # sends nothing. Otherwise it is a request to the servers and their answer, a message each
        # way: it ends one latency after the slowest worker's clock allows it, and never before a
        # round trip. The latency is owed, like a pull's (see worker()). Recorded even when it takes
        # no time, so the trace compares action by action with real runs.
        servers = self.servers
        start = self.env.now
        if self.heard[w] >= servers.clock[w] - action.slack:  # type: ignore[union-attr]
            # the slowest clock the worker last heard of already lets it go on: no message (actions.py)
            self.recorder.event(w, step, _WAIT, start, start, 0.0)
            return
        waiter = servers.wait(w, action.slack)  # type: ignore[union-attr]
        if waiter is not None:
            yield waiter
        pending.owed = servers.latency * (1 if waiter is not None else 2)  # type: ignore[union-attr]
        self.heard[w] = servers.min_clock  # type: ignore[union-attr]  # the answer carries it
        self.recorder.event(w, step, _WAIT, start, self.env.now + pending.owed, 0.0)

    def _pull(self, w: int, step: int, action: Pull, pending: PendingCompute):
        if pending.outstanding or pending.owed:
            yield from self._settle(w, step, pending)
        servers = self.servers
        start, version = self.env.now, self.state.version
        self.heard[w] = servers.min_clock  # type: ignore[union-attr]  # the reply carries the slowest clock
        yield servers.pull(action.nbytes)  # type: ignore[union-attr]
        # A pull is a request and a reply: two latencies besides the reply's bytes, both owed, and the
        # server's work to answer it.
        pending.owed = 2 * servers.latency + servers.service  # type: ignore[union-attr]
        self.recorder.event(w, step, _PULL, start, self.env.now + pending.owed, action.nbytes)
        self.state.read[w] = version


def simulate(cluster: Cluster, workload: Workload, scheme: Scheme | str, steps: int = 100,
             seed: int = 0, compute_times=None) -> SimResult:
    """Simulate ``steps`` steps per worker of ``scheme`` training ``workload`` on ``cluster``.

    ``compute_times`` (optional), a table of seconds with a row per step and a column per worker,
    replaces the drawn compute times: each step computes exactly that long (the cluster's speed,
    jitter and stragglers and the workload's compute_time and idle_cost are not applied). Given a
    measured run's own compute phases it replays the run's compute, so what differs from the run is
    the rest of the model: communication, sharing, scheduling."""
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a syncsim.Cluster, got {type(cluster).__name__}")
    if not isinstance(workload, Workload):
        raise ValueError(f"workload must be a syncsim.Workload, got {type(workload).__name__}")
    scheme = parse(scheme)
    steps = check_int("simulate", "steps", steps, 1)
    seed = check_int("simulate", "seed", seed, 0)
    check_memory("simulate", cluster.gpus * steps, "worker-steps", SIM_BYTES_PER_WORKER_STEP,
                 "lower steps or the number of GPUs")
    wall = time.perf_counter()
    run = _Run(cluster, workload, scheme, steps, seed, compute_times)
    for w in range(run.workers):
        run.env.process(run.worker(w))
    # The cyclic garbage collector walks every live object on each full pass;
    # W suspended worker generators make passes cost O(W) while their number
    # grows with W·steps, so a large run would be superlinear. Everything the
    # loop frees goes by reference counting; cycles wait until it ends.
    collecting = gc.isenabled()
    gc.disable()
    try:
        run.env.run()
    finally:
        if collecting:
            gc.enable()
    wall = time.perf_counter() - wall
    return SimResult(cluster=cluster, workload=workload, scheme=scheme, steps=steps, seed=seed,
                     step_end=run.step_end, recorder=run.recorder, wall_time=wall,
                     versions=run.state.version)


def speedup(cluster: Cluster, workload: Workload, scheme: Scheme | str, steps: int = 100, seed: int = 0) -> float:
    """Cluster throughput over that of the same workload on one nominal GPU (no communication, no noise)."""
    return simulate(cluster, workload, scheme, steps=steps, seed=seed).speedup
