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
the most recently started of its active flows gets weight w = w0 * exp(sigma*Z),
Z a standard normal drawn per flow, and every other active flow weight 1, each
flow receiving the link in proportion to its weight (weighted processor
sharing, Parekh & Gallager's GPS), at most ``cap``, until it ends or a newer
flow starts. Why: TCP flows through one tc-tbf shaper do not converge to equal
shares within a transfer of a few hundred kilobytes. Which flow gets more is
not systematic but differs from one collision to the next, so w0 is the mean
preference for the newer flow and sigma how widely a collision's split
scatters; real.testbed.calibration's sharing probe measures both from pairs of
colliding transfers. For two flows any split is a pair of weights, so the form
is exact for what the probe measures; with more flows only the newest one's
share is perturbed, an approximation. The other flows keep the virtual-time
heap; the newcomer is tracked apart by its remaining bytes, so every event
still costs O(log n). w0 = 1 and sigma = 0 (the defaults) is exact processor
sharing.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SharedLink", "triggered"]

# Relative tolerance when deciding a flow's finish tag has been reached: the
# virtual time is a sum of float products and drifts by a few ulps.
_TAG_RTOL = 1e-12


@dataclass(slots=True)
class _Newcomer:
    """The newest flow of a weighted link, served apart from the virtual-time heap."""

    left: float          # bytes still to send
    size: float          # bytes it started with
    weight: float
    seq: int             # its place in arrival order: the heap's tie-break once a newer flow demotes it
    done: simpy.Event
    rate: float = 0.0    # bytes/second it receives now


class SharedLink:
    def __init__(self, env: simpy.Environment, bandwidth: float, cap: float = math.inf, name: str = "link",
                 burst: float = 0.0, refill: float | None = None, newcomer_weight: float = 1.0,
                 sharing_spread: float = 0.0, rng: np.random.Generator | None = None) -> None:
        if not bandwidth > 0:
            raise ValueError(f"SharedLink {name!r}: bandwidth must be > 0, got {bandwidth!r}")
        if not 0 < newcomer_weight < math.inf:
            raise ValueError(f"SharedLink {name!r}: newcomer_weight must be a finite number > 0, "
                             f"got {newcomer_weight!r}")
        if not 0 <= sharing_spread < math.inf:
            raise ValueError(f"SharedLink {name!r}: sharing_spread must be a finite number >= 0, "
                             f"got {sharing_spread!r}")
        if sharing_spread and rng is None:
            raise ValueError(f"SharedLink {name!r}: a sharing_spread needs an rng (numpy Generator) to draw from")
        self.env = env
        self.bandwidth = float(bandwidth)
        self.cap = float(cap)
        self.name = name
        self.burst = float(burst)
        self.refill = self.bandwidth if refill is None else float(refill)  # bytes/s the bucket refills at
        self.newcomer_weight = float(newcomer_weight)
        self.sharing_spread = float(sharing_spread)
        self._rng = rng
        self._weighted = newcomer_weight != 1.0 or sharing_spread > 0  # else exact equal sharing
        self.tokens = self.burst     # bytes the bucket holds (full at the start)
        self._idle_since = 0.0       # when the link last became idle
        self._virtual = 0.0          # bytes served to each active flow (other than the newcomer) so far
        self._updated = 0.0          # simulated time of the last virtual-time update
        self._rate = self.rate(1)    # current rate of each flow in the heap
        self._heap: list[tuple[float, int, simpy.Event]] = []
        self._newcomer: _Newcomer | None = None  # only on a weighted link
        self._seq = 0
        self._wake_pending = False
        self._wake_gen = 0           # generation of the pending wake-up (stale ones are ignored)
        self.bytes_served = 0.0
        self.peak_flows = 0

    @property
    def active(self) -> int:
        return len(self._heap) + (self._newcomer is not None)

    def rate(self, flows: int) -> float:
        """Bytes/second each of ``flows`` equally shared active flows receives: min(cap, B/n)."""
        return min(self.cap, self.bandwidth / max(1, flows))

    def _shares(self, others: int, w: float) -> tuple[float, float]:
        """(each other flow's rate, the newcomer's rate) with ``others`` flows beside a newcomer: weights 1
        and w, each flow at most ``cap``, and what a capped flow leaves goes to the rest (max-min fair)."""
        cap, bandwidth = self.cap, self.bandwidth
        if not others:
            return 0.0, min(cap, bandwidth)
        unit = bandwidth / (w + others)
        if w * unit > cap:
            return min(cap, (bandwidth - cap) / others), cap
        if unit > cap:
            return cap, min(cap, bandwidth - others * cap)
        return unit, w * unit

    def transfer(self, nbytes: float) -> simpy.Event:
        """Start a flow of ``nbytes`` now; returns the event that fires when its last byte has left."""
        env = self.env
        done = env.event()
        now = env.now
        heap = self._heap
        # an idle shaper: its bucket lets bytes through at once
        if self.burst and not heap and self._newcomer is None and nbytes > 0:
            self.tokens = min(self.burst, self.tokens + (now - self._idle_since) * self.refill)
            granted = min(self.tokens, nbytes)
            self.tokens -= granted
            self._idle_since = now
            self.bytes_served += granted
            nbytes -= granted
        if nbytes <= 0:
            return done.succeed()
        # serve every active flow up to now (written out here and in _on_wake: the simulator's hot path)
        newcomer = self._newcomer
        elapsed = now - self._updated
        if heap:
            self._virtual += elapsed * self._rate
        if newcomer is not None:
            newcomer.left -= elapsed * newcomer.rate
        self._updated = now
        self._seq += 1
        self.bytes_served += nbytes
        if not self._weighted:
            heapq.heappush(heap, (self._virtual + nbytes, self._seq, done))
            n = len(heap)
            self._rate = self.rate(n)
            rearm = heap[0][1] == self._seq
        else:  # the newest flow takes the newcomer's weight; the one it replaces joins the others
            if newcomer is not None:
                heapq.heappush(heap, (self._virtual + newcomer.left, newcomer.seq, newcomer.done))
            weight = self.newcomer_weight
            if self.sharing_spread:  # lognormal about the systematic weight (see the module docstring)
                weight *= math.exp(self.sharing_spread * self._rng.standard_normal())
            newcomer = self._newcomer = _Newcomer(left=nbytes, size=nbytes, weight=weight, seq=self._seq, done=done)
            self._rate, newcomer.rate = self._shares(len(heap), weight)
            n = len(heap) + 1
            rearm = True
        if n > self.peak_flows:
            self.peak_flows = n
        # A new flow moves the next completion earlier only if it finishes first; otherwise the pending
        # wake-up stays valid (early at worst, as arrivals only slow the others down).
        if not self._wake_pending or rearm:
            self._arm(now)
        return done

    def _arm(self, now: float) -> None:
        newcomer = self._newcomer
        if newcomer is None:
            delay = (self._heap[0][0] - self._virtual) / self._rate
        else:
            delay = newcomer.left / newcomer.rate
            if self._heap:
                delay = min(delay, (self._heap[0][0] - self._virtual) / self._rate)
        self._wake_gen += 1
        self._wake_pending = True
        wake = self.env.timeout(delay if delay > 0 else 0.0, self._wake_gen)
        wake.callbacks.append(self._on_wake)

    def _on_wake(self, event: simpy.Event) -> None:
        if event._value != self._wake_gen:
            return  # superseded by a later arm
        now = self.env.now
        heap = self._heap
        newcomer = self._newcomer
        elapsed = now - self._updated  # serve every active flow up to now, as in transfer
        if heap:
            self._virtual += elapsed * self._rate
        if newcomer is not None:
            newcomer.left -= elapsed * newcomer.rate
        self._updated = now
        self._wake_pending = False
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
        # the same two tests for the newcomer, on its bytes left
        if newcomer is not None and (newcomer.left <= _TAG_RTOL * (1 + newcomer.size)
                                     or now + newcomer.left / newcomer.rate <= now):
            finished.append(newcomer.done)
            newcomer = self._newcomer = None
        if newcomer is None:
            self._rate = self.rate(len(heap))
        else:
            self._rate, newcomer.rate = self._shares(len(heap), newcomer.weight)
        if heap or newcomer is not None:
            self._arm(now)
        else:
            self._idle_since = now
        for done in finished:
            _resume_now(done)


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
