"""What a parameter server adds to each request beyond its link: one worker and one server, no model.

The link probe's ping-pong times raw gloo messages. A run's push and pull go through the executor's
protocol (real.server): a header, then the payload, received by the server's per-worker thread into a
receive posted in advance, copied, applied under a lock, and answered (a clock wait by a wake-up; a
pull by the slowest clock, then the shard, copied to the wire format). On the testbed, one worker and
one server with a 407 kB flat tensor and nothing else in either process took longer than the
ping-pong fit prices the same bytes: a push with its wait 0.5-1.1 ms more, a pull about 0.3 ms more
(1 Gbit/s to 50 Mbit/s). Those milliseconds were most of the one-worker parameter-server rows' error
(-2 % to -9 %, always under-predicted; -2 % to +2 % once the simulator was given them).

``measure_server`` times that protocol on a 2-host testbed (rank 0 a ``Client``, rank 1 a ``Server``,
the payload at the run's size and wire precision), each push-and-wait and each pull after the links
rested long enough to refill their buckets, as a step's compute rests them. ``fit_service`` takes the
per-request time that makes the simulator's own price of one push-and-wait and one pull (on the
ping-pong's α, B and bucket: push α + (n - burst)/B, then a wait's round trip 2α; pull 2α + (n - burst)/B)
equal to their measured means: ``Cluster.server_service``, which the simulator adds to every push and every pull.

``python -m real.testbed.server_probe --out FILE --size BYTES --precision fp32 --repeats N --idle S`` is
one rank of the probe (started by ``measure_server`` on the testbed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

__all__ = ["measure_server", "fit_service", "simulated_requests", "SERVER_REPEATS"]

SERVER_REPEATS = 20  # timed push-and-waits and pulls (after one untimed warm-up of each)


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


def measure_server(bandwidth: str, folder: Path, size: int, precision: str = "fp32", prefix: str = "sstb",
                   repeats: int = SERVER_REPEATS) -> dict:
    """The server protocol timed on a 2-host testbed at ``bandwidth`` with a payload of ``size`` bytes at
    the wire ``precision``: {"bandwidth", "size", "precision", "push_wait": [...], "pull": [...]},
    seconds, cached under ``folder`` (the calibration's cache: the same rate and size are timed once)."""
    from real.testbed.calibration import WIRE, _cached, _refill_idle, slug

    if precision not in WIRE:
        raise ValueError(f"measure_server: precision must be one of {sorted(WIRE)}, got {precision!r}")
    name = f"server-{slug(bandwidth)}-{int(size)}-{precision}"

    def measure() -> dict:
        from real.testbed.launcher import torchrun_on
        from real.testbed.namespaces import Testbed

        out = folder / f"{name}.raw.json"
        with Testbed(hosts=2, bandwidth=bandwidth, prefix=prefix) as bed:
            idle = _refill_idle(bed.config)
            codes = torchrun_on(bed, "real.testbed.server_probe",
                                ["--out", str(out), "--size", str(int(size)), "--precision", precision,
                                 "--repeats", str(repeats), "--idle", str(idle)],
                                folder / "logs", timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"server probe at {bandwidth} failed (node exit codes {codes}); logs in {folder}/logs")
        return {"bandwidth": bandwidth, "size": int(size), "precision": precision} | json.loads(out.read_text())

    return _cached(folder / f"{name}.json", measure)


def _probe_rank(out: str, size: int, precision: str, repeats: int, idle: float) -> None:
    """Rank 0 a worker pushing (with a clock wait, as a synchronous server's worker does) and pulling,
    rank 1 a server; the worker writes the timings."""
    import torch
    import torch.distributed as dist

    from real.hooks import WIRE_DTYPES
    from real.server import Client, Server
    from real.trace import Recorder
    from syncsim.files import write_atomic

    dist.init_process_group("gloo")
    wire = WIRE_DTYPES[precision]
    numel = max(1, size // torch.tensor([], dtype=wire).element_size())
    if dist.get_rank() == 1:
        Server(1, 1, 1, torch.zeros(numel), 0.0, wire, Recorder(time.time())).run()
    else:
        client, grad = Client(1, 1, numel, wire), torch.zeros(numel)
        timings: dict[str, list[float]] = {"push_wait": [], "pull": []}
        for step in range(repeats + 1):  # the first of each is a warm-up (connections, buffers)
            time.sleep(idle)  # the links rest, as a step's compute rests them, and their buckets refill
            t0 = time.perf_counter()
            client.push(grad, step, aggregate=True)
            client.wait(step, step + 1)  # this push applied: the synchronous server's round
            t1 = time.perf_counter()
            time.sleep(idle)
            t2 = time.perf_counter()
            client.pull(step)
            t3 = time.perf_counter()
            if step:
                timings["push_wait"].append(t1 - t0)
                timings["pull"].append(t3 - t2)
        client.stop()
        write_atomic(out, json.dumps(timings))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from real.testbed.calibration import WIRE

    ap = argparse.ArgumentParser(prog="python -m real.testbed.server_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, required=True, help="payload bytes")
    ap.add_argument("--precision", default="fp32", choices=sorted(WIRE))
    ap.add_argument("--repeats", type=int, default=SERVER_REPEATS)
    ap.add_argument("--idle", type=float, default=0.0, help="seconds the links rest before each request")
    args = ap.parse_args(argv)
    if args.size < 1 or args.repeats < 1 or args.idle < 0:
        ap.error(f"--size and --repeats must be >= 1 and --idle >= 0, got {args.size}, {args.repeats}, {args.idle}")
    _probe_rank(args.out, args.size, args.precision, args.repeats, args.idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
