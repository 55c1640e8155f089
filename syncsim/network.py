"""Links shared by concurrent flows: processor sharing with virtual-time bookkeeping.

A ``SharedLink`` serves every active flow at the same rate, min(cap, B/n) for
n flows (equal sharing, as TCP or RDMA flows of equal RTT converge to; the
per-flow ``cap`` is the sender's own NIC). Instead of recomputing every flow's
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
gathers tokens at its rate, up to ``burst`` bytes, and a flow arriving at the
idle link passes that many of its bytes at once; a busy link has spent them.
"""

from __future__ import annotations

import heapq
import math

import simpy

__all__ = ["SharedLink", "triggered"]

# Relative tolerance when deciding a flow's finish tag has been reached: the
# virtual time is a sum of float products and drifts by a few ulps.
_TAG_RTOL = 1e-12


class SharedLink:
    def __init__(self, env: simpy.Environment, bandwidth: float, cap: float = math.inf, name: str = "link",
                 burst: float = 0.0) -> None:
        if not bandwidth > 0:
            raise ValueError(f"SharedLink {name!r}: bandwidth must be > 0, got {bandwidth!r}")
        self.env = env
        self.bandwidth = float(bandwidth)
        self.cap = float(cap)
        self.name = name
        self.burst = float(burst)
        self.tokens = self.burst     # bytes the bucket holds (full at the start)
        self._idle_since = 0.0       # when the link last became idle
        self._virtual = 0.0          # bytes served to each active flow so far
        self._updated = 0.0          # simulated time of the last virtual-time update
        self._rate = self.rate(1)    # current per-flow rate
        self._heap: list[tuple[float, int, simpy.Event]] = []
        self._seq = 0
        self._wake_pending = False
        self._wake_gen = 0           # generation of the pending wake-up (stale ones are ignored)
        self.bytes_served = 0.0
        self.peak_flows = 0

    @property
    def active(self) -> int:
        return len(self._heap)

    def rate(self, flows: int) -> float:
        """Bytes/second each of ``flows`` active flows receives: min(cap, B/n)."""
        return min(self.cap, self.bandwidth / max(1, flows))

    def transfer(self, nbytes: float) -> simpy.Event:
        """Start a flow of ``nbytes`` now; returns the event that fires when its last byte has left."""
        env = self.env
        done = env.event()
        now = env.now
        heap = self._heap
        if self.burst and not heap and nbytes > 0:  # an idle shaper: its bucket lets bytes through at once
            self.tokens = min(self.burst, self.tokens + (now - self._idle_since) * self.bandwidth)
            granted = min(self.tokens, nbytes)
            self.tokens -= granted
            self._idle_since = now
            self.bytes_served += granted
            nbytes -= granted
        if nbytes <= 0:
            return done.succeed()
        if heap:
            self._virtual += (now - self._updated) * self._rate
        self._updated = now
        self._seq += 1
        heapq.heappush(heap, (self._virtual + nbytes, self._seq, done))
        n = len(heap)
        self._rate = self.rate(n)
        self.bytes_served += nbytes
        if n > self.peak_flows:
            self.peak_flows = n
        # A new flow moves the next completion earlier only if it has the
        # smallest tag; otherwise the pending wake-up stays valid (early at worst).
        if not self._wake_pending or heap[0][1] == self._seq:
            self._arm(now)
        return done

    def _arm(self, now: float) -> None:
        delay = (self._heap[0][0] - self._virtual) / self._rate
        self._wake_gen += 1
        self._wake_pending = True
        wake = self.env.timeout(delay if delay > 0 else 0.0, self._wake_gen)
        wake.callbacks.append(self._on_wake)

    def _on_wake(self, event: simpy.Event) -> None:
        if event._value != self._wake_gen:
            return  # superseded by a later arm
        now = self.env.now
        heap = self._heap
        self._virtual += (now - self._updated) * self._rate
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
        self._rate = self.rate(len(heap))
        if heap:
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
