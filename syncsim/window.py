"""Windows: what a flow sends while its acknowledgements wait in another link's queue.

A TCP sender keeps at most its window of bytes unacknowledged, so a flow whose acknowledgements wait in a
queue for D seconds sends at most W/D (Jacobson, SIGCOMM 1988, "Congestion Avoidance and Control": the
acknowledgement clock). A link with a window counts each flow's bytes queued at it as what its sender has sent
(at the link's ``cap`` from its start, its bucketful at once) less what the link has passed, at most W: a
sender with a window's worth waiting is held back (``flow_queue``). A link whose flows' acknowledgements cross
another link (``acks_via``: a server's replies, whose acknowledgements come back through the server's incoming
link behind the pushes' data; Zhang, Shenker and Clark, SIGCOMM 1991, "Observations on the dynamics of a
congestion control algorithm: the effects of two-way traffic") caps each of its flows at W·B/Q, Q that link's
queue and B its rate (the round trip outside the queue is left out: on the testbed its veths' tens of
microseconds against the queue's milliseconds). A reply crossing k pushes whose windows fill the queue gets
B/k, as each push does, and two replies together twice that (on the testbed three pushes stretched one 1.72 MB
reply 2.75 times and two together 1.42 times; docs/log.md). The queue is linear between events, so the cap is
held for steps over which Q moves by ``WINDOW_STEP`` (or until its growth changes) at its exact mean over the
step, and re-read at every event of either link. One window queued caps a flow at B, its share anyway. W = 0
(the default): no window.

The functions read a syncsim.network.SharedLink's flows as they stand now (their bytes left as of the link's
last update, served at their rates since).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from syncsim.network import SharedLink, _Flow

__all__ = ["flow_queue", "window_cap", "WINDOW_STEP"]

# A window-capped flow's cap is held for steps over which the queue its acknowledgements wait in (plus a
# window, below which the cap does not bind) moves by at most this fraction, at its exact mean over the
# step; only a step cut short by an event misprices, by at most its own part of the cap's change. 0.1 moved
# the testbed's four-worker server rows by under 0.5 % against 0.02, at half the simulation's extra time.
WINDOW_STEP = 0.1
_RTOL = 1e-12  # relative rounding below which a queue has reached a level (syncsim.network's tag tolerance)


def flow_queue(link: SharedLink, flow: _Flow) -> tuple[float, float, float]:
    """``flow`` of a windowed ``link``, at its rate now: its bytes queued, how fast that grows (bytes/s), and
    in how many seconds that growth next changes (its sender sends all, or its queue reaches or leaves the
    window; inf if never before the next event)."""
    now, window, cap = link.env.now, link.window, link.cap
    passed = flow.size - flow.left + (now - link._updated) * flow.rate
    if math.isinf(cap):
        sent, sending = flow.size, 0.0
    else:
        sent = min(flow.size, flow.bucket + cap * (now - flow.start))
        sending = (flow.start + (flow.size - flow.bucket) / cap - now) if sent < flow.size else 0.0
    unpassed = max(0.0, sent - passed)
    if sending:  # its sender sends at the cap, at least as fast as the link passes, until the window is out
        if unpassed >= window:  # then it waits for acknowledgements and sends as fast as the link passes
            return window, 0.0, sending
        growth = cap - flow.rate
        return unpassed, growth, min(sending, (window - unpassed) / growth if growth > 0 else math.inf)
    if unpassed > window:  # all sent, a window's worth still waiting to go: the queue holds until then
        return window, 0.0, (unpassed - window) / flow.rate if flow.rate > 0 else math.inf
    return unpassed, -flow.rate, math.inf


def window_cap(link: SharedLink) -> tuple[float, float]:
    """What each flow of ``link`` may send at most until the cap is next re-read, and in how many seconds that
    is. A flow sends at most its window W per time its acknowledgements wait in the other link's queue, Q/B,
    and Q grows linearly (g bytes/s) until a sender there changes pace: over the next h seconds the cap's
    mean is W·B·ln(1 + g·h/Q)/(g·h), so a flow held to it sends what the moving cap lets through. h: until Q
    has moved by WINDOW_STEP of Q + W, its growth changes, or it crosses W·B/(this link's rate), below which
    the cap binds no flow (inf if it stands still). (inf, inf) for a link without ``acks_via``."""
    via, now = link.acks_via, link.env.now
    if via is None or not via._flows:
        return math.inf, math.inf
    total, growth, kink = 0.0, 0.0, math.inf
    for flow in via._flows:
        q, g, k = flow_queue(via, flow)
        total, growth = total + q, growth + g
        if now + k > now:  # a change within rounding of now is the one just read
            kink = min(kink, k)
    # below this queue the cap is over the link's own rate: it binds no flow, and need not be re-read until
    # the queue grows past it (a draining queue reaches it in one step, never zero: no Zeno steps)
    unbound = link.window * via.bandwidth / link.bandwidth
    binding = total > unbound or (growth > 0 and total >= unbound * (1 - _RTOL))  # now, or from now on
    crossing = (unbound - total) / growth if growth and binding != (growth > 0) else math.inf
    if now + crossing > now:  # as above: within rounding of now, it is crossed
        kink = min(kink, crossing)
    step = min(kink, WINDOW_STEP * (total + via.window) / abs(growth)) if growth else kink
    if not binding:
        return math.inf, step
    scale = link.window * via.bandwidth / total
    if not growth or math.isinf(step):
        return scale, step
    change = growth * step / total  # > -1: a draining step ends at the unbound queue at the latest
    return scale * math.log1p(change) / change, step
