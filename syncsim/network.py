"""Links shared by concurrent flows: processor sharing with virtual-time bookkeeping.

A ``SharedLink`` by default serves every active flow at the same rate,
min(cap, B/n) for n flows (equal sharing, as long TCP or RDMA flows of equal
RTT converge to; the per-flow ``cap`` is the sender's own NIC). Instead of recomputing every flow's
rate when one arrives or leaves (O(n) per event), it keeps the *virtual time*
V: the bytes each active flow has received so far. A flow of s bytes arriving
at virtual time V finishes when V reaches V + s, so flows sit in a heap keyed
by that finish tag and every arrival or departure costs O(log n) (the
generalised processor-sharing bookkeeping of Parekh & Gallager 1993, "A
Generalized Processor Sharing Approach to Flow Control").

Completion wake-ups use one SimPy timeout at a time. Arrivals only slow flows
down, so a pending wake-up is never late; when it fires early it re-arms. A
finished flow's waiter is resumed right inside the wake-up (no second event).
The link models transmission only: propagation latency is charged by its
users, who fold it into a wait they make anyway (see syncsim.engine).

A link with a ``burst`` is a token-bucket shaper (tc-tbf): while idle it
gathers tokens at its ``refill`` rate (by default its bandwidth), up to
``burst`` bytes, and a flow arriving at the idle link passes that many of its
bytes at once; a busy link has spent them (what a shaper refilling faster than
its flows send would gather while busy is not modelled).

A link may share unequally (``newcomer_weight`` w0, ``sharing_spread`` sigma):
every flow draws its own weight as it enters, exp(sigma/sqrt(2) * Z) with Z a
standard normal, and the most recently started of the active flows weighs w0
times that while it is the newest; each flow receives the link in proportion
to its weight (weighted processor sharing, Parekh & Gallager's GPS), at most
``cap`` (what a capped flow leaves goes to the rest: weighted max-min
fairness), until it ends. Why: TCP flows through one tc-tbf shaper do not
converge to equal shares within a transfer of a few hundred kilobytes. Which
flow gets more is not systematic but differs from one collision to the next,
so w0 is the mean preference for the newer flow and sigma how widely a
collision's split scatters: two colliding flows split in the ratio
w0 * exp(sigma/sqrt(2) * (Z1 - Z2)), a log-normal of log-sd sigma, which is
what real.calibration's sharing probe measures from pairs of
colliding transfers. Every flow draws its own weight, not only the newest,
because more flows scatter more: on the testbed, four workers' pulls from
one server ended a median 11-588 ms apart, 2.5-4.7 times as far as when
only the newest flow's share was perturbed (the simulator then predicted
the four-worker synchronous server up to 12 % slow); two workers' pulls
ended about as far apart as simulated. Its known cost: four asynchronous
workers of the larger model pushed and pulled 11-16 % faster simulated than
measured at 50 and 200 Mbit/s, where the newest-only form matched within
2 % (docs/log.md, "Every flow's own weight"). A weighted link recomputes every
flow's rate at each arrival and departure, O(n log n) per event; it is
meant for a calibrated testbed of a few hosts. w0 = 1 and sigma = 0 (the
defaults) is exact processor sharing, kept as the virtual-time heap above.

Senders' own buckets (``sender_burst`` b_s): where every sender's own link
is a token-bucket shaper too (the testbed's hosts: a tbf on each host's
egress in front of the server's), a flow that arrives while the link is busy
brings b_s bytes that its sender's bucket let through at once; they queue in
the link's FIFO ahead of the bytes the other flows send after them, so the
link serves them first, at its full rate, while the others wait (a flow
arriving at an idle link has them passed by the link's own bucket instead).
Why: two flows of n bytes paced by their senders' shapers at B into one
FIFO shaper of rate B and bucket b, started d apart, leave it at
(2n - Bd - b)/B and (2n - b)/B, exactly d apart; a single shaper whose
bucket goes to the first flow ends them d + b/B apart, so every collision
would push two asynchronous workers a bucket's time further apart (on the
testbed at 50 Mbit/s, 2.4 ms) and settle them into taking turns sooner than
the real pair does (docs/log.md, "A push while the server replies"). b_s = 0
(the default, and every link without a bucket) changes nothing.

Windows (``window``, ``acks_via``): a flow whose acknowledgements wait in
another link's queue sends at most its window per queueing delay
(syncsim.window).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

from syncsim.window import window_cap

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SharedLink", "triggered"]

# Relative tolerance when deciding a flow's finish tag has been reached: the
# virtual time is a sum of float products and drifts by a few ulps.
_TAG_RTOL = 1e-12


@dataclass(slots=True)
class _Flow:
    """A flow of a weighted link, served by its bytes left (no virtual-time heap: weights differ)."""

    left: float          # bytes still to send
    size: float          # bytes it started with
    weight: float        # its own weight, drawn as it entered (1 without a sharing spread)
    done: simpy.Event
    rate: float = 0.0    # bytes/second it receives now
    head: float = 0.0    # bytes of its sender's own bucket still ahead of the others' (served first)
    start: float = 0.0   # when it started (its sender's first byte)
    bucket: float = 0.0  # bytes its sender's bucket let through as it started (its first head)


class SharedLink:
    def __init__(self, env: simpy.Environment, bandwidth: float, cap: float = math.inf, name: str = "link",
                 burst: float = 0.0, refill: float | None = None, newcomer_weight: float = 1.0,
                 sharing_spread: float = 0.0, rng: np.random.Generator | None = None,
                 sender_burst: float = 0.0, window: float = 0.0,
                 acks_via: SharedLink | None = None) -> None:
        _check(name, bandwidth, newcomer_weight, sharing_spread, sender_burst, rng, window, acks_via)
        self.env = env
        self.bandwidth = float(bandwidth)
        self.cap = float(cap)
        self.name = name
        self.burst = float(burst)
        self.refill = self.bandwidth if refill is None else float(refill)  # bytes/s the bucket refills at
        self.newcomer_weight = float(newcomer_weight)
        self.sharing_spread = float(sharing_spread)
        self._rng = rng
        self.sender_burst = float(sender_burst)
        self.window = float(window)  # bytes each flow keeps in flight at most (0: no window)
        self.acks_via = acks_via     # the link its flows' acknowledgements wait in (window-capped), or None
        self._watchers: list[SharedLink] = []  # links whose flows' acknowledgements wait in this one
        self._ack_horizon = math.inf  # seconds from the last share until its window cap is to be re-read
        if acks_via is not None:
            acks_via._watchers.append(self)
        # else exact equal sharing, by virtual time (no per-flow progress)
        self._weighted = (newcomer_weight != 1.0 or sharing_spread > 0 or sender_burst > 0
                          or self.window > 0)
        self._flow_spread = sharing_spread / math.sqrt(2.0)  # each flow's: a pair's log-ratio then has sigma
        self.tokens = self.burst     # bytes the bucket holds (full at the start)
        self._idle_since = 0.0       # when the link last became idle
        self._virtual = 0.0          # bytes served to each active flow of an unweighted link so far
        self._updated = 0.0          # simulated time of the last update (virtual time or bytes left)
        self._rate = self.rate(1)    # current rate of each flow in the heap
        self._heap: list[tuple[float, int, simpy.Event]] = []
        self._flows: list[_Flow] = []  # a weighted link's active flows, in arrival order (no heap)
        self._newest: _Flow | None = None  # a weighted link's latest arrival: w0 times its own weight while active
        self._seq = 0                # arrivals on an unweighted link so far
        self._wake_pending = False
        self._wake_gen = 0           # generation of the pending wake-up (stale ones are ignored)
        self.bytes_served = 0.0
        self.peak_flows = 0
        self._busy = 0.0             # seconds the link carried a flow, up to _busy_from
        self._busy_from: float | None = None  # when its current busy spell began (None: idle)

    @property
    def active(self) -> int:
        return len(self._heap) + len(self._flows)

    def busy_time(self) -> float:
        """Seconds the link has carried at least one flow since the run began (its bucket's instant
        passes take none)."""
        if self._busy_from is None:
            return self._busy
        return self._busy + self.env.now - self._busy_from

    def rate(self, flows: int) -> float:
        """Bytes/second each of ``flows`` equally shared active flows receives: min(cap, B/n)."""
        return min(self.cap, self.bandwidth / max(1, flows))

    def _share(self) -> None:
        """Set each flow of a weighted link to its rate: in proportion to its weight (the newest's times
        w0), each at most ``cap``, what a capped flow leaves going to the rest (weighted max-min fairness
        by progressive filling: the heaviest flows reach the cap first, and once the heaviest flow left
        is under it, every lighter one is too)."""
        flows, newest = self._flows, self._newest
        ack_cap, self._ack_horizon = window_cap(self)
        cap = min(self.cap, ack_cap)
        weights = [f.weight * (self.newcomer_weight if f is newest else 1.0) for f in flows]
        if any(f.head > 0 for f in flows):  # senders' buckets queued ahead: served first, at the link's rate
            total = sum(w for f, w in zip(flows, weights) if f.head > 0)
            for f, w in zip(flows, weights):
                f.rate = self.bandwidth * w / total if f.head > 0 else 0.0
            return
        bandwidth, total, capped = self.bandwidth, sum(weights), set()
        for i in sorted(range(len(flows)), key=weights.__getitem__, reverse=True):
            if bandwidth * weights[i] / total < cap:
                break
            capped.add(i)
            bandwidth -= cap
            total -= weights[i]
        unit = bandwidth / total if len(capped) < len(flows) else 0.0
        for i, (flow, weight) in enumerate(zip(flows, weights)):
            flow.rate = cap if i in capped else weight * unit

    def transfer(self, nbytes: float) -> simpy.Event:
        """Start a flow of ``nbytes`` now; returns the event that fires when its last byte has left."""
        env = self.env
        done = env.event()
        now = env.now
        heap, flows = self._heap, self._flows
        # an idle shaper: its bucket lets bytes through at once
        if self.burst and not heap and not flows and nbytes > 0:
            self.tokens = min(self.burst, self.tokens + (now - self._idle_since) * self.refill)
            granted = min(self.tokens, nbytes)
            self.tokens -= granted
            self._idle_since = now
            self.bytes_served += granted
            nbytes -= granted
        if nbytes <= 0:
            return done.succeed()
        if self._busy_from is None:
            self._busy_from = now
        self.bytes_served += nbytes
        if not self._weighted:
            # serve every active flow up to now (written out here and in _on_wake: the simulator's hot path)
            if heap:
                self._virtual += (now - self._updated) * self._rate
            self._updated = now
            self._seq += 1  # the heap's tie-break between equal tags: arrival order
            heapq.heappush(heap, (self._virtual + nbytes, self._seq, done))
            n = len(heap)
            self._rate = self.rate(n)
            rearm = heap[0][1] == self._seq
        else:  # the newest flow takes w0 on top of its own weight; the one it replaces keeps its own
            self._serve(now)
            weight = math.exp(self._flow_spread * self._rng.standard_normal()) if self._flow_spread else 1.0
            head = min(self.sender_burst, nbytes) if flows else 0.0  # an idle link's own bucket passed it
            self._newest = flow = _Flow(left=nbytes, size=nbytes, weight=weight, done=done, head=head, start=now,
                                        bucket=head)
            flows.append(flow)
            self._share()
            n = len(flows)
            rearm = True
            self._notify(now)
        if n > self.peak_flows:
            self.peak_flows = n
        # A new flow moves the next completion earlier only if it finishes first; otherwise the pending
        # wake-up stays valid (early at worst, as arrivals only slow the others down).
        if not self._wake_pending or rearm:
            self._arm(now)
        return done

    def _serve(self, now: float) -> None:
        """A weighted link's flows served at their rates since the last update."""
        elapsed = now - self._updated
        for flow in self._flows:
            flow.left -= elapsed * flow.rate
            if flow.head > 0:
                flow.head -= elapsed * flow.rate
                if _spent(flow.head, flow, now):
                    flow.head = 0.0
        self._updated = now

    def _arm(self, now: float) -> None:
        if self._flows:
            # a flow waiting behind senders' buckets (rate 0) moves at no instant of its own
            delay = min((flow.head if flow.head > 0 else flow.left) / flow.rate
                        for flow in self._flows if flow.rate > 0)
            if self.acks_via is not None:  # re-read the window's cap as the other link's queue moves
                delay = min(delay, self._ack_horizon)
        else:
            delay = (self._heap[0][0] - self._virtual) / self._rate
        self._wake_gen += 1
        self._wake_pending = True
        wake = self.env.timeout(delay if delay > 0 else 0.0, self._wake_gen)
        wake.callbacks.append(self._on_wake)

    def _on_wake(self, event: simpy.Event) -> None:
        if event._value != self._wake_gen:
            return  # superseded by a later arm
        now = self.env.now
        self._wake_pending = False
        if self._weighted:
            self._serve(now)
            # A finished newest flow is in no list any more, so no flow inherits its w0.
            active, finished = [], []
            for flow in self._flows:
                (finished if _spent(flow.left, flow, now) else active).append(flow)
            self._flows = active
            if active:
                self._share()
                self._arm(now)
            else:
                self._went_idle(now)
            if finished:
                self._notify(now)
            for flow in finished:
                _resume_now(flow.done)
            return
        heap = self._heap
        if heap:  # serve every active flow up to now, as in transfer
            self._virtual += (now - self._updated) * self._rate
        self._updated = now
        threshold = self._virtual * (1 + _TAG_RTOL) + _TAG_RTOL
        finished = []
        rate = self._rate
        while heap:
            tag = heap[0][0]
            # Done if within rounding of its tag, or if what is left would finish
            # within the float resolution of ``now`` (else it could never advance).
            if tag > threshold and now + (tag - self._virtual) / rate > now:
                break
            finished.append(heapq.heappop(heap)[2])
        self._rate = self.rate(len(heap))
        if heap:
            self._arm(now)
        else:
            self._went_idle(now)
        for done in finished:
            _resume_now(done)

    def _notify(self, now: float) -> None:
        """This link's queue has changed: the links whose acknowledgements wait in it re-read their cap."""
        for link in self._watchers:
            if link._flows:
                link._serve(now)
                link._share()
                link._arm(now)

    def _went_idle(self, now: float) -> None:
        self._idle_since = now
        if self._busy_from is not None:
            self._busy += now - self._busy_from
            self._busy_from = None


def _check(name: str, bandwidth: float, newcomer_weight: float, sharing_spread: float, sender_burst: float,
           rng: object, window: float, acks_via: SharedLink | None) -> None:
    """A SharedLink's arguments, each refused with its name, value and what is allowed."""
    if not bandwidth > 0:
        raise ValueError(f"SharedLink {name!r}: bandwidth must be > 0, got {bandwidth!r}")
    if not 0 < newcomer_weight < math.inf:
        raise ValueError(f"SharedLink {name!r}: newcomer_weight must be a finite number > 0, "
                         f"got {newcomer_weight!r}")
    if not 0 <= sharing_spread < math.inf:
        raise ValueError(f"SharedLink {name!r}: sharing_spread must be a finite number >= 0, "
                         f"got {sharing_spread!r}")
    if not 0 <= sender_burst < math.inf:
        raise ValueError(f"SharedLink {name!r}: sender_burst must be a finite number of bytes >= 0, "
                         f"got {sender_burst!r}")
    if not 0 <= window < math.inf:
        raise ValueError(f"SharedLink {name!r}: window must be a finite number of bytes >= 0, got {window!r}")
    if acks_via is not None and not window:
        raise ValueError(f"SharedLink {name!r}: acks_via caps each flow at its window over the queue its "
                         f"acknowledgements wait in, so it needs a window > 0")
    if sharing_spread and rng is None:
        raise ValueError(f"SharedLink {name!r}: a sharing_spread needs an rng (numpy Generator) to draw from")


def _spent(amount: float, flow: _Flow, now: float) -> bool:
    """Whether ``amount`` bytes of a weighted link's ``flow`` (what is left of it, or of its sender's
    bucketful) are gone: within rounding of its size, or what is left would be served within the float
    resolution of ``now`` (else it could never advance). A flow waiting behind senders' buckets (rate 0)
    is served nothing."""
    return amount <= _TAG_RTOL * (1 + flow.size) or (flow.rate > 0 and now + amount / flow.rate <= now)


def triggered(event: simpy.Event) -> simpy.Event:
    """Mark ``event`` succeeded with value None, so processing it resumes its waiters.

    ``simpy.Event.succeed`` also schedules the event at once; this leaves the
    scheduling (with a delay, or none) to the caller.
    """
    event._ok = True
    event._value = None
    return event


def _resume_now(event: simpy.Event) -> None:
    """Trigger ``event`` and run its callbacks at once, as Environment.step would.

    The flow ended at this very instant, so processing its event inline is the
    same as scheduling it with zero delay, minus one pass through the event
    queue (a third of the events of an asynchronous parameter-server run).
    """
    triggered(event)
    callbacks, event.callbacks = event.callbacks, None
    for callback in callbacks:
        callback(event)
