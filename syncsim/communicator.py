"""Collectives over all workers, carried out on the simulated cluster.

Every worker joins the same sequence of collectives (as with NCCL or MPI
communicators). A collective starts each bucket when the last worker has
produced it and the previous collective on the communicator has finished:
collectives run one after another, as on NCCL's single stream per
communicator, so they never contend with each other for the links. Each bucket
takes the closed-form time of its algorithm (``syncsim.collectives``; "auto"
picks NCCL's fastest for that bucket's size), cached per (algorithm, size), so
a bucket costs O(1) whatever the cluster's size. Which algorithm ran is
recorded per bucket (``SimResult.collectives``).

One shared SimPy event per collective resumes all W workers; the per-worker
bookkeeping is vectorised over workers, so a step of W workers costs O(W)
array work and a single scheduled event.

Sharded data parallelism (ZeRO, FSDP) interleaves its collectives with the
compute they feed: a unit's forward cannot start before its parameters are
gathered. A step's sharded actions join as one *schedule* (``join_schedule``):
the collectives in the order the workers issue them, each issued when the
slowest worker's compute reaches its issue point and run when the one before it
on the communicator is done, and compute held back at each unit whose gather
has not ended. Still one event per step for all W workers.
"""

from __future__ import annotations

import numpy as np
import simpy

from syncsim.cluster import Cluster, Link
from syncsim.collectives import allgather_time, allreduce_time, choose, reducescatter_time, sharded_allgather_time
from syncsim.network import triggered
from syncsim.recorder import KIND_CODE, Recorder

__all__ = ["Communicator", "ALLGATHER", "REDUCESCATTER", "Schedule", "build_schedule"]

_COMPUTE = KIND_CODE["compute"]
# The name a join gives as its algorithm for an all-gather (NCCL runs all-gather on its rings only).
ALLGATHER = "allgather"
# The name a schedule's reduce-scatter runs under (NCCL runs reduce-scatter on its rings only).
REDUCESCATTER = "reducescatter"


class Schedule:
    """A step's sharded actions laid out for the communicator (``build_schedule``).

    ``entries``: one (action index, bucket, algorithm, bytes, issue fraction, past the gates there?) per
    collective, in the order the workers issue them; ``gates``: (fraction, entry) for each gathered unit,
    in order of fraction: compute cannot pass the fraction before that entry's collective has ended;
    ``actions``: (trace kind, bytes) per action, for its trace row; ``last``: whether the step's
    optimiser step makes a new version when the schedule ends."""

    __slots__ = ("entries", "gates", "actions", "last", "keep")

    def __init__(self, entries, gates, actions, last, keep) -> None:
        self.entries, self.gates, self.actions, self.last, self.keep = entries, gates, actions, last, keep


def build_schedule(actions) -> Schedule:
    """The schedule of one step's sharded actions (syncsim.schemes.SHARDED_ACTIONS), in plan order.

    A reduce-scatter's bucket b is issued when compute reaches its ``ready`` fraction; a gather as its
    action says (``AllGatherParameters.issued``). At the same point, a collective that must wait for the
    compute to be let past it comes after one issued on arriving there, and otherwise plan order decides,
    bucket by bucket: FSDP issues a unit's prefetched gather before the reduce-scatter of the unit whose
    backward runs meanwhile (torch's BackwardPrefetch.BACKWARD_PRE: "prefetches the next set of parameters
    before the current set of parameters' gradient computation")."""
    from syncsim.schemes.actions import AllGatherParameters, ReduceScatterGradients, ShardedOptimizerStep

    raw, rows, last = [], [], False
    for index, action in enumerate(actions):
        if isinstance(action, ShardedOptimizerStep):
            last = True
            continue
        if isinstance(action, ReduceScatterGradients):
            for b, (nbytes, ready) in enumerate(zip(action.buckets, action.ready)):
                raw.append(((ready, False, index, b), REDUCESCATTER, nbytes, None))
        elif isinstance(action, AllGatherParameters):
            for b, (nbytes, need, (issue, past)) in enumerate(zip(action.units, action.needed, action.issued())):
                # a gather needed at 1.0 (after the compute: ZeRO-1/2's) holds no compute back
                raw.append(((issue, past, index, b), ALLGATHER, nbytes, need if need < 1.0 else None))
        else:
            raise ValueError(f"a sharded schedule takes reduce-scatters, gathers and optimiser steps, not "
                             f"{type(action).__name__}")
        rows.append((index, KIND_CODE[action.kind], float(action.nbytes)))
    raw.sort(key=lambda item: item[0])
    entries = tuple((key[2], key[3], algorithm, nbytes, key[0], key[1]) for key, algorithm, nbytes, _ in raw)
    gates = tuple(sorted((need, i) for i, (_, _, _, need) in enumerate(raw) if need is not None))
    return Schedule(entries, gates, tuple(rows), last, tuple(actions))


class _Pending:
    __slots__ = ("kind", "step", "buckets", "ready", "algorithm", "base", "span", "computed", "arrived", "done",
                 "last", "lead", "tail")

    def __init__(self, env: simpy.Environment, workers: int, kind: str, step: int, buckets: tuple[float, ...],
                 ready: tuple[float, ...], algorithm: str, last: bool, lead: float, tail: float) -> None:
        self.kind = kind
        self.last = last                   # whether it completes the step's synchronisation (a new version)
        self.lead = lead                   # seconds every worker works on its contribution before sending it
        self.tail = tail                   # seconds every worker works on the result after it arrives
        self.step = step
        self.buckets = buckets
        self.ready = np.asarray(ready, dtype=float)
        self.algorithm = algorithm
        self.base = np.empty(workers)      # when each worker's contribution starts being produced
        self.span = np.zeros(workers)      # how long producing it takes (compute time, or 0)
        self.computed = np.zeros(workers, dtype=bool)  # whether a compute row is owed to the trace
        self.arrived = 0
        self.done = env.event()


class _PendingSchedule:
    __slots__ = ("step", "schedule", "base", "span", "computed", "arrived", "done")

    def __init__(self, env: simpy.Environment, workers: int, step: int, schedule: Schedule) -> None:
        self.step = step
        self.schedule = schedule
        self.base = np.empty(workers)
        self.span = np.zeros(workers)
        self.computed = np.zeros(workers, dtype=bool)
        self.arrived = 0
        self.done = env.event()


class Communicator:
    def __init__(self, env: simpy.Environment, cluster: Cluster, recorder: Recorder, state: object) -> None:
        self.env = env
        self.cluster = cluster
        self.workers = cluster.gpus
        self.recorder = recorder
        self.state = state          # shared model state: .version, .read[worker]
        self.free_at = 0.0          # when the communicator's previous collective finished
        self._pending: _Pending | None = None
        self._cost: dict[tuple[str, float], tuple[str, float]] = {}
        self._wire: dict[tuple[str, float], float] = {}
        self._all = np.arange(self.workers)
        # Links with a burst (token-bucket shapers, tc-tbf) pass the tokens they hold at once: a
        # collective's transmission time shrinks by the tokens its slowest link holds when it has bytes
        # to send. The bucket refills at the shaper's rate (Link.refill), as tc-tbf's does: between
        # collectives, and, where a collective's own rate is below the shaper's, while it sends.
        # Every worker's link idles and refills alike, so one bucket stands for all of them.
        links = [link for link in (cluster.intra if cluster.gpus_per_node > 1 else None,
                                   cluster.inter if cluster.nodes > 1 else None) if link is not None]
        slowest = min(links, key=lambda link: link.bandwidth) if links else None  # type: ignore[arg-type,return-value]
        self.burst = float(slowest.burst) if slowest is not None else 0.0  # type: ignore[arg-type]
        self.rate = float(slowest.bandwidth) if slowest is not None else 0.0  # type: ignore[arg-type]
        self.refill = slowest.refill_rate if slowest is not None else 0.0
        self.tokens = self.burst
        if self.burst:
            wire = {name: None if link is None else Link(link.bandwidth)  # the same links, latencies aside
                    for name, link in (("intra", cluster.intra), ("inter", cluster.inter))}
            self._wire_cluster = cluster.replace(**wire, collective_latency=0.0)

    def cost(self, algorithm: str, nbytes: float) -> tuple[str, float]:
        """(algorithm that runs, seconds) of one all-reduce of ``nbytes`` (algorithm "allgather": one
        all-gather of ``nbytes`` from each worker, syncsim.collectives.allgather_time)."""
        key = (algorithm, nbytes)
        cost = self._cost.get(key)
        if cost is None:
            if algorithm == ALLGATHER:
                cost = (ALLGATHER, allgather_time(self.cluster, nbytes))
            else:
                cost = choose(algorithm, nbytes, self.cluster)
            self._cost[key] = cost
        return cost

    def sharded_cost(self, algorithm: str, nbytes: float) -> float:
        """Seconds of one of a schedule's collectives over ``nbytes`` (the whole buffer): a reduce-scatter
        (syncsim.collectives.reducescatter_time) or a gather of parameters sharded 1/p per GPU
        (sharded_allgather_time)."""
        key = ("sharded " + algorithm, nbytes)
        cost = self._cost.get(key)
        if cost is None:
            time = reducescatter_time if algorithm == REDUCESCATTER else sharded_allgather_time
            cost = self._cost[key] = (algorithm, time(self.cluster, nbytes))
        return cost[1]

    def sharded_wire_bytes(self, algorithm: str, nbytes: float) -> float:
        """Bytes the slowest link carries in one of a schedule's collectives (wire_bytes' counterpart)."""
        key = ("sharded " + algorithm, nbytes)
        wire = self._wire.get(key)
        if wire is None:
            time = reducescatter_time if algorithm == REDUCESCATTER else sharded_allgather_time
            wire = self._wire[key] = time(self._wire_cluster, nbytes) * self.rate
        return wire

    def wire_bytes(self, algorithm: str, nbytes: float) -> float:
        """Bytes the slowest link carries in one collective: its closed form's transmission term x rate."""
        key = (algorithm, nbytes)
        wire = self._wire.get(key)
        if wire is None:
            seconds = (allgather_time(self._wire_cluster, nbytes) if algorithm == ALLGATHER
                       else allreduce_time(algorithm, nbytes, self._wire_cluster))
            wire = self._wire[key] = seconds * self.rate
        return wire

    def _shaped(self, seconds: float, wire: float, idle: float) -> float:
        """The time of a collective of ``seconds`` (every byte at the link's rate) that sends ``wire``
        bytes over the slowest link after it idled ``idle`` seconds, given the bucket; updates the bucket.

        The tokens held when it starts (the bucket's, refilled through the idle spell) pass at once, the
        rest at the link's rate, during which the bucket gains what the shaper refills beyond that rate.
        The bytes that crossed by any instant are then at most the bucket plus the shaper's rate times
        the time elapsed, tc-tbf's bound. Its launch and hops' latencies refill nothing: they interleave
        with its sending (a ring's rounds follow one another), and the form its time was fitted to
        (α + max(0, n - burst)/B per hop after a full bucket, real.calibration.link_fit) credits a full
        bucket with exactly ``burst`` bytes."""
        held = min(self.burst, self.tokens + idle * self.refill)
        credit = min(held, wire)
        rest = (wire - credit) / self.rate
        self.tokens = min(self.burst, held - credit + rest * (self.refill - self.rate))
        return seconds - credit / self.rate

    def join(self, worker: int, step: int, kind: str, buckets: tuple[float, ...], ready: tuple[float, ...],
             algorithm: str, base: float, span: float, computed: bool, last: bool = True, lead: float = 0.0,
             tail: float = 0.0) -> simpy.Event:
        """Contribute to the current collective; returns the event that fires when it completes.

        Bucket b of this worker is ready at ``base + span * ready[b] + lead``;
        ``computed`` says the span is a compute phase whose trace row the
        collective records (vectorised) on the worker's behalf. ``last`` False: a collective that
        does not yet finish the step's synchronisation (PowerSGD's first round), no new version.
        ``lead`` and ``tail``, the same for every worker: seconds each worker works on its contribution
        before sending it (compression; no trace row of its own: it lies between the rows, like a
        wait), and on the result before it is applied (decompression): the event fires, the trace rows
        end and the new version lands that much after the collective's end; the links are free from
        its end.
        """
        pending = self._pending
        if pending is None:
            pending = self._pending = _Pending(self.env, self.workers, kind, step, buckets, ready, algorithm, last,
                                               lead, tail)
        pending.base[worker] = base
        pending.span[worker] = span
        pending.computed[worker] = computed
        pending.arrived += 1
        if pending.arrived == self.workers:
            self._pending = None
            self._complete(pending)
        return pending.done

    def join_schedule(self, worker: int, step: int, schedule: Schedule, base: float, span: float,
                      computed: bool) -> simpy.Event:
        """Contribute to a step's sharded schedule: this worker's compute starts at ``base`` and lasts
        ``span`` (its trace row recorded on its behalf when ``computed``); the event fires when the step's
        last collective has ended."""
        pending = self._pending
        if pending is None:
            pending = self._pending = _PendingSchedule(self.env, self.workers, step, schedule)
        pending.base[worker] = base
        pending.span[worker] = span
        pending.computed[worker] = computed
        pending.arrived += 1
        if pending.arrived == self.workers:
            self._pending = None
            self._complete_schedule(pending)
        return pending.done

    def _complete_schedule(self, pending: _PendingSchedule) -> None:
        """Lay a step's sharded schedule out in time, for every worker at once.

        ``at`` holds, per worker, when its compute reached fraction ``pos`` of the step's compute (not yet
        let past the gates there); moving on to fraction x adds (x − pos)·span, and passing a gate waits
        for its gather's end. Each collective starts when the communicator is free and the slowest worker
        has issued it, and takes its closed-form time (``sharded_cost``)."""
        recorder, schedule = self.recorder, pending.schedule
        span = pending.span
        at = pending.base.copy()
        pos, clock = 0.0, self.free_at
        gates, next_gate = schedule.gates, 0
        entries = schedule.entries
        ends = [0.0] * len(entries)
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        began = None  # when each worker's compute began: once the units needed at its start are gathered
        for i, (index, bucket, algorithm, nbytes, issue, past) in enumerate(entries):
            while next_gate < len(gates):
                need, owner = gates[next_gate]
                if need > issue or (need == issue and not past) or owner >= i:
                    break
                if need > pos:
                    at += (need - pos) * span
                    pos = need
                np.maximum(at, ends[owner], out=at)
                if need <= 0.0:
                    began = at.copy()
                next_gate += 1
            if issue > pos:
                at += (issue - pos) * span
                pos = issue
            start = max(clock, float(at.max()))
            seconds = self.sharded_cost(algorithm, nbytes)
            if self.burst:
                seconds = self._shaped(seconds, self.sharded_wire_bytes(algorithm, nbytes), start - clock)
            clock = ends[i] = start + seconds
            first.setdefault(index, start)
            last[index] = clock
            recorder.collective(pending.step, algorithm, bucket, nbytes, algorithm, start, clock)
        for need, owner in gates[next_gate:]:  # the rest of the compute, past every remaining gate
            if need > pos:
                at += (need - pos) * span
                pos = need
            np.maximum(at, ends[owner], out=at)
            if need <= 0.0:
                began = at.copy()
        if began is None:
            began = pending.base
        if pos < 1.0:
            at += (1.0 - pos) * span
        self.free_at = clock
        self._finish_schedule(pending, began, at, first, last, max(clock, float(at.max())))

    def _finish_schedule(self, pending: _PendingSchedule, began: np.ndarray, at: np.ndarray,
                         first: dict[int, float], last: dict[int, float], end: float) -> None:
        """Record a laid-out schedule (each worker's compute, each action from its first collective's start
        to its last's end) and end the step at ``end``, with a new version after the step's last
        reduce-scatter."""
        recorder, schedule, workers = self.recorder, pending.schedule, self._all
        if pending.computed.any():
            who = workers[pending.computed]
            recorder.events(who, pending.step, _COMPUTE, began[pending.computed], at[pending.computed], 0.0)
        for index, code, nbytes in schedule.actions:
            if index in first:
                recorder.events(workers, pending.step, code, first[index], last[index], nbytes)
        if schedule.last:
            self.state.collective_done(REDUCESCATTER, pending.step, end)
        self.env.schedule(triggered(pending.done), delay=end - self.env.now)

    def _complete(self, pending: _Pending) -> None:
        env, recorder, state = self.env, self.recorder, self.state
        # ready[w, b] = base[w] + span[w] * ready[b]; bucket b can start once every worker has it.
        bucket_ready = (pending.base[:, None] + pending.span[:, None] * pending.ready[None, :]).max(axis=0)
        if pending.lead:
            bucket_ready = bucket_ready + pending.lead
        clock = self.free_at
        first = None
        for b, nbytes in enumerate(pending.buckets):
            start = max(clock, bucket_ready[b])
            if first is None:
                first = start
            ran, seconds = self.cost(pending.algorithm, nbytes)
            if self.burst:
                seconds = self._shaped(seconds, self.wire_bytes(ran, nbytes), start - clock)
            clock = start + seconds
            recorder.collective(pending.step, pending.kind, b, nbytes, ran, start, clock)
        self.free_at = clock
        end = clock + pending.tail if pending.tail else clock  # the result is usable once decompressed
        workers = self._all
        if pending.computed.any():
            who = workers[pending.computed]
            recorder.events(who, pending.step, _COMPUTE, pending.base[pending.computed],
                            (pending.base + pending.span)[pending.computed], 0.0)
        recorder.events(workers, pending.step, KIND_CODE[pending.kind], first, end, float(sum(pending.buckets)))
        if pending.last:
            state.collective_done(pending.kind, pending.step, end)
        env.schedule(triggered(pending.done), delay=end - env.now)
