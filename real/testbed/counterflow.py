"""Two-way traffic at a parameter server's host: how long one transfer out of the host (a reply to a pull)
takes while k transfers come in (pushes), and one transfer in while k go out, on the testbed's shapers,
with no model in the traffic.

Host 0 is the server, host 1 the peer whose transfer is timed, hosts 2.. the others. In each trial the
k others start their transfer at one instant (each a single message of the size, as a run's workers push
once a step) and the timed transfer LEAD seconds later; the trial waits for all of them. A TCP flow's
acknowledgements travel the other way, through the shaper that the other direction's data fills: on the
testbed they queue behind it (Zhang, Shenker and Clark, SIGCOMM 1991, "Observations on the dynamics of
a congestion control algorithm: the effects of two-way traffic"), so a transfer slows with the flows
coming the other way, which syncsim's server model does not price beyond one crossing push
(Link.crossing_stretch). ``python -m real.testbed.counterflow`` (as root) prints, per rate and size, each
direction's mean time with 0 to ``--others`` flows the other way and its stretch over none.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Crossing", "measure", "main", "LEAD", "DIRECTIONS"]

LEAD = 1e-3  # seconds the timed transfer starts after the others: they have entered the shapers
DIRECTIONS = ("reply", "push")  # the timed transfer leaves the server (its reply) or enters it (a push)
MAX_OTHERS = 6


@dataclass(frozen=True)
class Crossing:
    """One rate's and size's timings: ``times[direction][k]``, seconds of the timed transfer with k flows
    the other way, one per trial."""

    rate: str
    size: int
    times: dict[str, list[list[float]]]

    def stretches(self, direction: str) -> list[float]:
        """The mean time with k flows the other way over the mean with none, for k = 0, 1, ..."""
        lone = statistics.fmean(self.times[direction][0])
        return [statistics.fmean(t) / lone for t in self.times[direction]]

    def line(self, direction: str) -> str:
        means = [statistics.fmean(t) * 1e3 for t in self.times[direction]]
        other = "pushes coming in" if direction == "reply" else "replies going out"
        return (f"{self.rate}, {self.size:,} B: a {direction} with 0-{len(means) - 1} {other} took "
                f"{' / '.join(f'{m:.1f}' for m in means)} ms (means of {len(self.times[direction][0])}), "
                f"stretch {' / '.join(f'{s:.2f}' for s in self.stretches(direction))}")


def measure(rate: str, size: int, others: int = 3, repeats: int = 10, prefix: str = "sstbcf",
            folder: Path | None = None) -> Crossing:
    """The trials at ``rate`` with messages of ``size`` bytes and up to ``others`` flows the other way, on a
    testbed of others + 2 hosts built for them and torn down after."""
    import tempfile

    from real.testbed.launcher import torchrun_on
    from real.testbed.namespaces import Testbed

    with tempfile.TemporaryDirectory(prefix="counterflow-") as scratch:
        folder = Path(scratch) if folder is None else folder
        out = folder / "counterflow.json"
        with Testbed(hosts=others + 2, bandwidth=rate, prefix=prefix) as bed:
            codes = torchrun_on(bed, "real.testbed.counterflow", ["_rank", str(out), str(size), str(repeats)],
                                folder / "logs", timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"counterflow at {rate} failed (node exit codes {codes}); logs in {folder / 'logs'}")
        return Crossing(rate, size, json.loads(out.read_text()))


def _rank(out: str, size: int, repeats: int) -> None:
    """One rank of the trials (the module's docstring); rank 0 writes every timing."""
    import torch
    import torch.distributed as dist

    from syncsim.files import write_atomic

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    message = torch.zeros(max(1, size // 4))
    timings: dict[str, list[list[float]]] = {direction: [] for direction in DIRECTIONS}
    for direction in DIRECTIONS:
        for k in range(world - 1):
            crossing = list(range(2, 2 + k))
            times = []
            for trial in range(repeats + 1):  # the first is a warm-up (connections, buffers)
                took = _trial(direction, crossing, message, rank)
                if trial:
                    times.append(took)
            gathered = [None] * world
            dist.all_gather_object(gathered, times)
            timings[direction].append(gathered[1] if direction == "reply" else gathered[0])
    if rank == 0:
        write_atomic(Path(out), json.dumps(timings))
    dist.destroy_process_group()


def _trial(direction: str, crossing: list[int], message, rank: int) -> float:
    """One trial: the timed transfer between hosts 0 and 1 LEAD after the ``crossing`` hosts' transfers the
    other way; the seconds it took as the rank that saw it end measured it (NaN on the others). Every
    namespace reads one CLOCK_MONOTONIC (time.perf_counter), so instants compare."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = torch.tensor([time.perf_counter() + 0.02], dtype=torch.float64)
    dist.broadcast(start, 0)  # one instant for all
    begin = float(start) + LEAD
    _until(float(start))
    took = float("nan")
    if rank == 0:
        if direction == "reply":  # pushes in from the crossing hosts, the reply out to host 1
            works = [dist.irecv(message.clone(), peer) for peer in crossing]
            _until(begin)
            works.append(dist.isend(message, 1))
        else:  # replies out to the crossing hosts, a push in from host 1
            works = [dist.isend(message, peer) for peer in crossing]
            received = dist.irecv(message.clone(), 1)
            received.wait()
            took = time.perf_counter() - begin
        for work in works:
            work.wait()
    elif rank == 1:
        _until(begin)
        if direction == "reply":
            dist.recv(message, 0)
            took = time.perf_counter() - begin
        else:
            dist.send(message, 0)
    elif rank in crossing:
        (dist.send if direction == "reply" else dist.recv)(message, 0)
    dist.barrier()
    return took


def _until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.001) if left > 0.002 else 0)


def main(argv: list[str] | None = None) -> int:
    from real.testbed.namespaces import shapable_rates
    from syncsim.arguments import ArgumentParser, check_count, integer
    from syncsim.units import parse_size

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_rank":  # one rank of the trials, in a testbed host
        _rank(argv[1], int(argv[2]), int(argv[3]))
        return 0
    ap = ArgumentParser(prog="python -m real.testbed.counterflow", description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50Mbit/s,200Mbit/s,1Gbit/s", help="comma-separated link rates")
    ap.add_argument("--sizes", default="1724320,407080",
                    help="comma-separated message sizes in bytes (default: LeNet's and the small model's "
                         "fp32 gradients)")
    ap.add_argument("--others", type=integer, default=3,
                    help=f"most flows the other way, 1 to {MAX_OTHERS} (the testbed's hosts: this + 2)")
    ap.add_argument("--repeats", type=integer, default=10, help="trials per condition, 1 to 1,000")
    args = ap.parse_args(argv)
    try:
        rates = shapable_rates(args.rates, "--rates")
        sizes = [int(parse_size(size.strip(), "--sizes")) for size in args.sizes.split(",") if size.strip()]
        if not rates or not sizes:
            raise ValueError("--rates and --sizes must each name at least one value")
        if any(size < 4 for size in sizes):
            raise ValueError(f"--sizes must be at least 4 bytes each, got {min(sizes)}")
        check_count("--others", args.others, 1, MAX_OTHERS)
        check_count("--repeats", args.repeats, 1, 1000)
    except ValueError as err:
        ap.error(str(err))
    for rate in rates:
        for size in sizes:
            crossing = measure(rate, size, args.others, args.repeats)
            for direction in DIRECTIONS:
                print(f"real.testbed.counterflow: {crossing.line(direction)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
