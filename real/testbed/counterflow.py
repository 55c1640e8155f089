"""Two-way traffic at a parameter server's host: how long one transfer out of the host (a reply to a pull)
takes while k transfers come in (pushes), and one transfer in while k go out, on the testbed's shapers,
with no model in the traffic.

Host 0 is the server, host 1 the peer whose transfer is timed (hosts 1..n with ``--timed n``: n replies
or pushes timed together, until all are in), the hosts after them the others. In each trial the
k others start their transfers at one instant, or ``stagger`` seconds apart (the j-th at j x stagger: a
run's pushes do not coincide), each a single message of the size, as a run's workers push once a step;
the timed transfer starts LEAD seconds after the first; the trial waits for all of them. A TCP flow's
acknowledgements travel the other way, through the shaper that the other direction's data fills: on the
testbed they queue behind it (Zhang, Shenker and Clark, SIGCOMM 1991, "Observations on the dynamics of
a congestion control algorithm: the effects of two-way traffic"), so a transfer slows with the flows
coming the other way: syncsim prices a push's by one crossing reply (Link.crossing_stretch), a reply's
by its window per queueing delay of the pushes it waits behind (Link.window).
``python -m real.testbed.counterflow`` (as root) prints, per rate, size and stagger, each direction's mean
time with 0 to ``--others`` flows the other way and its stretch over none, and the reply's stretches as
syncsim prices them with the window read on the same testbed at that rate and size (real.testbed.window).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Crossing", "measure", "predicted_reply", "main", "LEAD", "DIRECTIONS"]

LEAD = 1e-3  # seconds the timed transfer starts after the others: they have entered the shapers
DIRECTIONS = ("reply", "push")  # the timed transfer leaves the server (its reply) or enters it (a push)
PLURAL = {"reply": "replies", "push": "pushes"}
MAX_OTHERS = 6
MAX_TIMED = 3
MAX_STAGGER = 1.0  # seconds between starts: beyond, the flows no longer cross at any rate the studies use


@dataclass(frozen=True)
class Crossing:
    """One rate's and size's timings: ``times[direction][k]``, seconds of the timed transfer with k flows
    the other way, one per trial."""

    rate: str
    size: int
    times: dict[str, list[list[float]]]
    stagger: float = 0.0
    timed: int = 1  # transfers timed together (replies to, or pushes from, hosts 1..timed): until all are in

    def stretches(self, direction: str) -> list[float]:
        """The mean time with k flows the other way over the mean with none, for k = 0, 1, ..."""
        lone = statistics.fmean(self.times[direction][0])
        return [statistics.fmean(t) / lone for t in self.times[direction]]

    def predicted(self, window: float) -> list[float]:
        """The reply's stretches as syncsim's server prices them with a ``window`` of bytes (Link.window),
        for k = 0, 1, ... pushes coming in as the trials started them."""
        from syncsim.units import parse_bandwidth

        rate = parse_bandwidth(self.rate, "rate")
        took = [predicted_reply(rate, self.size, k, self.stagger, window, self.timed)
                for k in range(len(self.times["reply"]))]
        return [t / took[0] for t in took]

    def line(self, direction: str, window: float | None = None) -> str:
        """One direction's timings and stretches; for the reply, with a ``window``, the simulator's too."""
        means = [statistics.fmean(t) * 1e3 for t in self.times[direction]]
        other = "pushes coming in" if direction == "reply" else "replies going out"
        started = f" started {self.stagger * 1e3:g} ms apart" if self.stagger else ""
        timed = f"{self.timed} {PLURAL[direction]} together" if self.timed > 1 else f"a {direction}"
        text = (f"{self.rate}, {self.size:,} B: {timed} with 0-{len(means) - 1} {other}{started} took "
                f"{' / '.join(f'{m:.1f}' for m in means)} ms (means of {len(self.times[direction][0])}), "
                f"stretch {' / '.join(f'{s:.2f}' for s in self.stretches(direction))}")
        if direction == "reply" and window is not None:
            text += (f"; syncsim (Link.window {window / 1e3:,.0f} kB) "
                     f"{' / '.join(f'{s:.2f}' for s in self.predicted(window))}")
        return text


def predicted_reply(rate: float, size: int, pushes: int, stagger: float, window: float,
                    replies: int = 1) -> float:
    """Seconds syncsim's parameter server (syncsim.server) takes for ``replies`` replies of ``size`` bytes at
    ``rate`` bytes/s, started together LEAD after the first of ``pushes`` pushes of that size, ``stagger``
    apart, each sent at the rate by its own worker, until every reply is in: the trial, priced with a
    Link.window of ``window`` bytes and no bucket (the transfers are 40-1,700 times the testbed's)."""
    import simpy

    from syncsim import Cluster, Link
    from syncsim.recorder import Recorder
    from syncsim.server import ServerGroup

    link = Link(bandwidth=rate, window=window)
    cluster = Cluster(nodes=pushes + replies, gpus_per_node=1, inter=link, servers=1, server_link=link)
    env = simpy.Environment()
    server = ServerGroup(env, cluster, Recorder(), state=None)
    took = []

    def push(at: float):
        yield env.timeout(at)
        yield server.push(size)

    def reply():
        yield env.timeout(LEAD)
        yield server.pull(size)
        took.append(env.now - LEAD)

    for j in range(pushes):
        env.process(push(j * stagger))
    for _ in range(replies):
        env.process(reply())
    env.run()
    return max(took)


def measure(rate: str, size: int, others: int = 3, repeats: int = 10, prefix: str = "sstbcf",
            folder: Path | None = None, stagger: float = 0.0, timed: int = 1) -> Crossing:
    """The trials at ``rate`` with messages of ``size`` bytes, ``timed`` transfers timed together and up to
    ``others`` flows the other way, started ``stagger`` seconds apart, on a testbed of others + timed + 1
    hosts built for them and torn down after."""
    import tempfile

    from real.testbed.launcher import torchrun_on
    from real.testbed.namespaces import Testbed

    with tempfile.TemporaryDirectory(prefix="counterflow-") as scratch:
        folder = Path(scratch) if folder is None else folder
        out = folder / "counterflow.json"
        with Testbed(hosts=others + timed + 1, bandwidth=rate, prefix=prefix) as bed:
            codes = torchrun_on(bed, "real.testbed.counterflow",
                                ["_rank", str(out), str(size), str(repeats), repr(stagger), str(timed)],
                                folder / "logs", timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"counterflow at {rate} failed (node exit codes {codes}); logs in {folder / 'logs'}")
        return Crossing(rate, size, json.loads(out.read_text()), stagger, timed)


def _rank(out: str, size: int, repeats: int, stagger: float, timed: int) -> None:
    """One rank of the trials (the module's docstring); rank 0 writes every timing."""
    import torch
    import torch.distributed as dist

    from syncsim.files import write_atomic

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    message = torch.zeros(max(1, size // 4))
    timings: dict[str, list[list[float]]] = {direction: [] for direction in DIRECTIONS}
    peers = list(range(1, 1 + timed))  # the hosts the timed transfers go to or come from
    for direction in DIRECTIONS:
        for k in range(world - timed):
            crossing = list(range(1 + timed, 1 + timed + k))
            times = []
            for trial in range(repeats + 1):  # the first is a warm-up (connections, buffers)
                took = _trial(direction, crossing, message, rank, stagger, peers)
                if trial:
                    times.append(took)
            gathered = [None] * world
            dist.all_gather_object(gathered, times)
            # a reply's end is seen by its receiver, a push's by the server: until every timed one is in
            timings[direction].append([max(trial) for trial in zip(*(gathered[r] for r in peers))]
                                      if direction == "reply" else gathered[0])
    if rank == 0:
        write_atomic(Path(out), json.dumps(timings))
    dist.destroy_process_group()


def _trial(direction: str, crossing: list[int], message, rank: int, stagger: float, peers: list[int]) -> float:
    """One trial: the timed transfers between host 0 and each of ``peers`` (hosts 1, 2, ...), LEAD
    after the first of the ``crossing`` hosts' transfers the other way, which start ``stagger`` seconds
    apart; the seconds they took as the rank that saw them end measured it (NaN on the others). Every
    namespace reads one CLOCK_MONOTONIC (time.perf_counter), so instants compare."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = torch.tensor([time.perf_counter() + 0.02], dtype=torch.float64)
    dist.broadcast(start, 0)  # one instant for all
    first = float(start)
    begin = first + LEAD
    starts = {peer: first + j * stagger for j, peer in enumerate(crossing)}  # each crossing flow's instant
    _until(first)
    took = float("nan")
    if rank == 0:
        if direction == "reply":  # pushes in from the crossing hosts (each sends at its instant), the reply out
            works = [dist.irecv(message.clone(), peer) for peer in crossing]
            _until(begin)
            works += [dist.isend(message, peer) for peer in peers]
        else:  # replies out to the crossing hosts at their instants, the pushes in from the peers
            works, took = _send_while_receiving(message, starts, begin, peers)
        for work in works:
            work.wait()
    elif rank in peers:
        _until(begin)
        if direction == "reply":
            dist.recv(message, 0)
            took = time.perf_counter() - begin
        else:
            dist.send(message, 0)
    elif rank in crossing:
        if direction == "reply":
            _until(starts[rank])
            dist.send(message, 0)
        else:
            dist.recv(message, 0)
    dist.barrier()
    return took


def _send_while_receiving(message, starts: dict[int, float], begin: float, peers: list[int]) -> tuple[list, float]:
    """Rank 0's side of a push trial: each reply sent at its instant while the timed pushes come in from the
    ``peers``; the sends and the seconds from ``begin`` until every push is in. A thread waits for them
    (gloo completes a receive only in its wait, so polling would never see it end; the wait releases the
    GIL) while this one keeps the replies' instants."""
    import threading

    import torch.distributed as dist

    due = sorted(starts.items(), key=lambda item: item[1])
    # the replies that start with the first go out before the push is awaited, as with no stagger at all
    works = [dist.isend(message, peer) for peer, instant in due if instant == due[0][1]]
    received = [dist.irecv(message.clone(), peer) for peer in peers]
    ended: list[float] = []
    waiter = threading.Thread(target=lambda: ([r.wait() for r in received], ended.append(time.perf_counter())))
    waiter.start()
    for peer, instant in due[len(works):]:
        _until(instant)
        works.append(dist.isend(message, peer))
    waiter.join()
    return works, ended[0] - begin


def _until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.001) if left > 0.002 else 0)


def _parsed(args) -> tuple[list[str], list[int], list[float]]:
    """The command's rates, sizes and staggers, each checked (ValueError naming the option), and its counts."""
    from real.testbed.namespaces import shapable_rates
    from syncsim.arguments import check_count
    from syncsim.units import parse_size, parse_time

    rates = shapable_rates(args.rates, "--rates")
    sizes = [int(parse_size(size.strip(), "--sizes")) for size in args.sizes.split(",") if size.strip()]
    if not rates or not sizes:
        raise ValueError("--rates and --sizes must each name at least one value")
    if any(size < 4 for size in sizes):
        raise ValueError(f"--sizes must be at least 4 bytes each, got {min(sizes)}")
    check_count("--others", args.others, 1, MAX_OTHERS)
    check_count("--repeats", args.repeats, 1, 1000)
    check_count("--timed", args.timed, 1, MAX_TIMED)
    staggers = [float(parse_time(t.strip(), "--stagger")) for t in args.stagger.split(",") if t.strip()]
    if not staggers:
        raise ValueError("--stagger must name at least one time")
    outside = [t for t in staggers if not 0 <= t <= MAX_STAGGER]
    if outside:
        raise ValueError(f"--stagger times must each be 0 to {MAX_STAGGER * 1e3:g} ms, got {outside[0] * 1e3:g} ms")
    return rates, sizes, staggers


def main(argv: list[str] | None = None) -> int:
    from syncsim.arguments import ArgumentParser, integer

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_rank":  # one rank of the trials, in a testbed host
        _rank(argv[1], int(argv[2]), int(argv[3]), float(argv[4]), int(argv[5]))
        return 0
    ap = ArgumentParser(prog="python -m real.testbed.counterflow", description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50Mbit/s,200Mbit/s,1Gbit/s", help="comma-separated link rates")
    ap.add_argument("--sizes", default="1724320,407080",
                    help="comma-separated message sizes in bytes (default: LeNet's and the small model's "
                         "fp32 gradients)")
    ap.add_argument("--others", type=integer, default=3,
                    help=f"most flows the other way, 1 to {MAX_OTHERS} (the testbed's hosts: this + 2)")
    ap.add_argument("--repeats", type=integer, default=10, help="trials per condition, 1 to 1,000")
    ap.add_argument("--timed", type=integer, default=1,
                    help=f"transfers timed together, 1 to {MAX_TIMED} (replies to, or pushes from, that many "
                         f"hosts: until every one is in)")
    ap.add_argument("--stagger", default="0",
                    help=f"comma-separated times between the starts of the flows the other way, each 0 to "
                         f"{MAX_STAGGER * 1e3:g} ms (default 0: together), e.g. 0,5ms,10ms")
    args = ap.parse_args(argv)
    try:
        rates, sizes, staggers = _parsed(args)
    except ValueError as err:
        ap.error(str(err))
    from real.testbed.window import STUDY_REPEATS
    from real.testbed.window import measure as measure_window

    windows: dict[tuple[str, int], float] = {}
    for rate, size, stagger in itertools.product(rates, sizes, staggers):
        crossing = measure(rate, size, args.others, args.repeats, stagger=stagger, timed=args.timed)
        if (rate, size) not in windows:  # the window syncsim prices the reply with, read on the same testbed
            windows[rate, size] = measure_window(rate, size, 3, STUDY_REPEATS).window
        for direction in DIRECTIONS:
            print(f"real.testbed.counterflow: {crossing.line(direction, windows[rate, size])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
