"""What a parameter server adds to each request beyond its link, as syncsim prices it (no torch, no I/O).

The link probe's ping-pong times raw gloo messages. A run's push and pull go through the executor's
protocol (real.server): a header, then the payload, received by the server's per-worker thread into a
receive posted in advance, copied, applied under a lock, and answered (a clock wait by a wake-up; a
pull by the slowest clock, then the shard, copied to the wire format). On the testbed, one worker and
one server with a 407 kB flat tensor and nothing else in either process took longer than the
ping-pong fit prices the same bytes: a push with its wait 0.5-1.1 ms more, a pull about 0.3 ms more
(1 Gbit/s to 50 Mbit/s). Those milliseconds were most of the one-worker parameter-server rows' error
(-2 % to -9 %, always under-predicted; -2 % to +2 % once the simulator was given them).

``measure_server`` (real.calibration.server_probe) times that protocol on a 2-host testbed (rank 0 a
``Client``, rank 1 a ``Server``, the payload at the run's size and wire precision), each push-and-wait
and each pull after the links rested long enough to refill their buckets, as a step's compute rests them.
``fit_service`` takes the per-request time that makes the simulator's own price of one push-and-wait
and one pull (on the ping-pong's α, B and bucket: push α + (n - burst)/B, then a wait's round trip 2α;
pull 2α + (n - burst)/B) equal to their measured means: ``Cluster.server_service``, which the simulator
adds to every push and every pull.
"""

from __future__ import annotations

import statistics

__all__ = ["fit_service", "simulated_requests"]


def fit_service(timings: dict, alpha: float, bandwidth: float, burst: float, size: float) -> float:
    """The per-request server time (seconds, >= 0) that makes the simulator's one-worker push-and-wait
    and pull, on a link of ``alpha``, ``bandwidth`` and bucket ``burst``, take the means of ``timings``
    ({"push_wait": [...], "pull": [...]}, seconds) for a payload of ``size`` bytes: each is charged one
    service, so the service is half of what the two measured means exceed the two prices by. The price
    is the simulator's own (``simulated_requests``), not a second copy of its pricing."""
    for key in ("push_wait", "pull"):
        if not timings.get(key):
            raise ValueError(f"fit_service needs {key} timings, got {timings.get(key)!r}")
    price = sum(simulated_requests(alpha, bandwidth, burst, size))
    measured = statistics.fmean(timings["push_wait"]) + statistics.fmean(timings["pull"])
    return max(0.0, (measured - price) / 2)


def simulated_requests(alpha: float, bandwidth: float, burst: float, size: float,
                       service: float = 0.0) -> tuple[float, float]:
    """(push-and-wait, pull) seconds of one synchronous worker of a parameter server as syncsim prices
    them on that link, each request meeting a full bucket (the worker computes long enough between them
    to refill it, as the probe rests its links)."""
    from syncsim import Cluster, Link, Workload, simulate

    link = Link(bandwidth, alpha, burst=burst)
    cluster = Cluster.homogeneous(1, link, servers=1, server_link=link, server_service=service)
    rest = 2 * burst / bandwidth + 1e-3  # a bucket's refill twice over, as the probe's idle
    trace = simulate(cluster, Workload(size, rest, batch_size=1), "ps", steps=3).trace
    phases = trace[trace["step"] == 2].set_index("kind")
    return (float(phases.loc["wait", "end"] - phases.loc["push", "start"]),
            float(phases.loc["pull", "end"] - phases.loc["pull", "start"]))
