"""How many bytes a TCP flow keeps in flight through the testbed's shapers: its window (syncsim's Link.window).

Host 0 is the server. In each trial hosts 2..k+1 push one message of the size to it together and host 1's
reply leaves it LEAD later (real.testbed.counterflow's reply trial, its ``_trial``); meanwhile one sampler per
host namespace reads the kernel's state of every data connection (``ss -tin``, once a millisecond or so):
bytes in flight are ``unacked`` segments times ``mss``, sent and not yet acknowledged, wherever they wait
(the sender's own shaper, the server's, the acknowledgements' way back). No model is in the traffic. A
sender whose window is all in flight waits for acknowledgements (Jacobson, SIGCOMM 1988), so with two or
more pushes filling the server's incoming shaper the pushes' bytes in flight are their windows, and what
a reply sends is its window per round trip (syncsim.network). ``python -m real.testbed.window`` (as root)
prints, per rate, each role's bytes in flight (median and p90 over the samples with any) and as
milliseconds of the link.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Sample", "parse_ss", "InFlight", "measure", "measure_window", "main", "ROLES", "STUDY_REPEATS"]

ROLES = ("push", "reply")  # a push from hosts 2.. into host 0; the reply from host 0 to host 1
SAMPLE_GAP = 1e-3  # seconds a sampler sleeps between reads: often enough for a 14 ms transfer, not a busy loop
MAX_PUSHES = 6
STUDY_REPEATS = 5  # trials per rate and size when the validation study calibrates a server link's window


@dataclass(frozen=True)
class Sample:
    """One connection's state as ``ss -tin`` showed it: its two ends and its bytes in flight and window."""

    local: str
    peer: str
    in_flight: int  # unacked segments x mss: bytes sent, not yet acknowledged
    cwnd: int       # congestion window x mss, bytes


def parse_ss(text: str) -> list[Sample]:
    """The TCP connections in ``ss -tinH state established`` output (one line of queues and addresses, one
    indented line of its TCP state each) that show an mss and a window; ``unacked`` (absent when 0)."""
    samples, ends = [], None
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not line[0].isspace():  # "0 0 10.213.1.101:1234 10.213.1.102:5678" (a state filter drops the state)
            ends = (fields[-2], fields[-1]) if len(fields) >= 4 else None
            continue
        if ends is None:
            continue
        info = dict(item.split(":", 1) for item in fields if ":" in item)
        try:
            mss, cwnd = int(info["mss"]), int(info["cwnd"])
        except (KeyError, ValueError):
            continue
        samples.append(Sample(ends[0], ends[1], int(info.get("unacked", 0)) * mss, cwnd * mss))
        ends = None
    return samples


@dataclass(frozen=True)
class InFlight:
    """One rate's samples: bytes in flight of each role's connections while they had any."""

    rate: str
    size: int
    pushes: int
    samples: dict[str, list[int]]
    windows: dict[str, list[int]]

    @property
    def window(self) -> float:
        """The window syncsim's Link.window takes: the median congestion window of every connection sampled
        with bytes in flight, pushes and reply pooled (a sender whose window is all out has that many in
        flight; one not held by its window, fewer); 0 without a sample."""
        pooled = self.windows["push"] + self.windows["reply"]
        return float(statistics.median(pooled)) if pooled else 0.0

    def line(self, bandwidth: float) -> str:
        parts = []
        for role in ROLES:
            flying = self.samples[role]
            if not flying:
                parts.append(f"{role}: no sample in flight")
                continue
            median, p90 = statistics.median(flying), _quantile(flying, 0.9)
            cwnd = statistics.median(self.windows[role])
            parts.append(f"{role} {median / 1e3:,.0f} kB in flight (p90 {p90 / 1e3:,.0f} kB; "
                         f"{median / bandwidth * 1e3:.2f} ms of the link; congestion window {cwnd / 1e3:,.0f} kB; "
                         f"{len(flying)} samples)")
        return (f"{self.rate}, {self.size:,} B, {self.pushes} pushes with a reply: " + "; ".join(parts)
                + f"; window (Link.window) {self.window / 1e3:,.0f} kB")


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _sampler(command: list[str], found: list[Sample], stop: threading.Event) -> None:
    while not stop.is_set():
        shown = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout
        found.extend(parse_ss(shown))
        time.sleep(SAMPLE_GAP)


def measure(rate: str, size: int, pushes: int = 3, repeats: int = 10, prefix: str = "sstbwin") -> InFlight:
    """The trials at ``rate``, messages of ``size`` bytes, ``pushes`` pushes against one reply, sampled on a
    testbed of pushes + 2 hosts built for them and torn down after."""
    from real.testbed.launcher import torchrun_on
    from real.testbed.namespaces import Testbed

    samples: dict[str, list[Sample]] = {"push": [], "reply": []}
    with tempfile.TemporaryDirectory(prefix="window-") as scratch, \
            Testbed(hosts=pushes + 2, bandwidth=rate, prefix=prefix) as bed:
        server, receiver = bed.ips[0], bed.ips[1]
        stop = threading.Event()
        # each sampler reads its own host's connections: the server's to host 1 (the reply), a pusher's to host 0
        watched = [(0, "reply")] + [(h, "push") for h in range(2, pushes + 2)]
        threads = [threading.Thread(target=_sampler, args=(bed.command(h, ["ss", "-tinH", "state", "established"]),
                                                           found, stop), daemon=True)
                   for h, role in watched for found in [samples[role]]]
        for thread in threads:
            thread.start()
        try:
            codes = torchrun_on(bed, "real.testbed.window", ["_rank", str(size), str(repeats), str(pushes)],
                                Path(scratch) / "logs", timeout=900, agent=False)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        if any(codes):
            raise RuntimeError(f"window trials at {rate} failed (node exit codes {codes})")
    # the data connections only: gloo's pairs, not the store's (its port: the launcher's rendezvous port)
    from real.testbed.launcher import RDZV_PORT

    def ours(sample: Sample, role: str) -> bool:
        to = receiver if role == "reply" else server
        ports = {sample.local.rsplit(":", 1)[1], sample.peer.rsplit(":", 1)[1]}
        host = sample.peer.rsplit(":", 1)[0].strip("[]")  # an IPv4-mapped address prints as [::ffff:a.b.c.d]
        return host.endswith(to) and str(RDZV_PORT) not in ports

    sending = {role: [s for s in samples[role] if ours(s, role) and s.in_flight > 0] for role in ROLES}
    return InFlight(rate, size, pushes, {role: [s.in_flight for s in kept] for role, kept in sending.items()},
                    {role: [s.cwnd for s in kept] for role, kept in sending.items()})


def measure_window(bandwidth: str, folder: Path, size: float, prefix: str = "sstb",
                   repeats: int = STUDY_REPEATS) -> dict:
    """The window of flows of ``size`` bytes at ``bandwidth``: three pushes against a reply (``measure``),
    cached under ``folder`` (real.calibration.cache); {"window": bytes, "samples", "windows"}."""
    from real.calibration.cache import cached, slug
    from real.calibration.messages import wire_bytes

    size = wire_bytes(size, "fp32")  # the ranks send it as a float32 tensor

    def probe() -> dict:
        flight = measure(bandwidth, size, 3, repeats, prefix=prefix)
        return {"bandwidth": bandwidth, "size": size, "window": flight.window, "samples": flight.samples,
                "windows": flight.windows}

    return cached(folder / f"window-{slug(bandwidth)}-{size}.json", probe)


def _rank(size: int, repeats: int, pushes: int) -> None:
    """One rank: the reply trials with every push coming in (real.testbed.counterflow's ``_trial``)."""
    import torch
    import torch.distributed as dist

    from real.testbed.counterflow import _trial

    dist.init_process_group("gloo")
    message = torch.zeros(max(1, size // 4))
    for _ in range(repeats + 1):  # the first a warm-up, as counterflow's
        _trial("reply", list(range(2, 2 + pushes)), message, dist.get_rank(), 0.0, [1])
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from real.testbed.namespaces import shapable_rates
    from syncsim.arguments import ArgumentParser, check_count, integer
    from syncsim.units import parse_bandwidth, parse_size

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_rank":
        _rank(int(argv[1]), int(argv[2]), int(argv[3]))
        return 0
    ap = ArgumentParser(prog="python -m real.testbed.window", description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50Mbit/s,200Mbit/s,1Gbit/s", help="comma-separated link rates")
    ap.add_argument("--size", default="1724320", help="message size in bytes (default: LeNet's fp32 gradient)")
    ap.add_argument("--pushes", type=integer, default=3, help=f"pushes against each reply, 1 to {MAX_PUSHES}")
    ap.add_argument("--repeats", type=integer, default=10, help="trials per rate, 1 to 1,000")
    ap.add_argument("--json", default=None, help="also write every rate's samples to this file")
    args = ap.parse_args(argv)
    try:
        rates = shapable_rates(args.rates, "--rates")
        if not rates:
            raise ValueError("--rates must name at least one rate")
        size = int(parse_size(args.size, "--size"))
        if size < 4:
            raise ValueError(f"--size must be at least 4 bytes, got {size}")
        check_count("--pushes", args.pushes, 1, MAX_PUSHES)
        check_count("--repeats", args.repeats, 1, 1000)
    except ValueError as err:
        ap.error(str(err))
    found = []
    for rate in rates:
        flight = measure(rate, size, args.pushes, args.repeats)
        found.append(flight)
        print(f"real.testbed.window: {flight.line(parse_bandwidth(rate, 'rate'))}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([vars(f) for f in found]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
