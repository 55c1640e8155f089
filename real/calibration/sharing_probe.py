"""The sharing probe: two transfers colliding in one host's shaper on a 3-host testbed, timed, and the
newcomer weight that reproduces them on syncsim's link (real.calibration.sharing_fit); and two peers
taking turns at the host, each pushing into it while it replies to the other, each push timed against a
lone transfer's price: the sample of stretches syncsim draws a crossing push's from (Link.crossing_stretch,
real.calibration.sharing_fit.fit_duplex)."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

from real.calibration.cache import cached, slug
from real.calibration.sharing_fit import fit_duplex, fit_sharing
from real.calibration.timing import refill_idle
from syncsim.files import write_atomic

__all__ = ["SHARING_OFFSETS", "TURNS_TIME", "MIN_TURNS", "MAX_TURNS", "turns", "measure_sharing", "sharing_rank"]

# The sharing probe's second transfer starts these fractions of a lone transfer after the first: at once (a
# synchronous round's pulls) and part-way through (a push arriving while another is on the link).
SHARING_OFFSETS = (0.0, 0.25, 0.5)
# The peers then take turns at the host, pushing into it while it replies to the other, for as many turns as
# TURNS_TIME holds (at least MIN_TURNS, at most MAX_TURNS): on the testbed at 50 Mbit/s most such pushes
# took 5-10 % longer than a lone one and about one in five 15-65 ms longer, in spells of two to four
# turns (docs/log.md, "Taking turns"), so the sample must hold tens of stalls to give their share.
TURNS_TIME, MIN_TURNS, MAX_TURNS = 10.0, 40, 100


def measure_sharing(bandwidth: str, folder: Path, link: dict, burst: float, message_bytes: float,
                    prefix: str = "sstb", repeats: int = 5) -> dict:
    """Two transfers of ``message_bytes`` colliding in one host's shaper on a 3-host testbed at ``bandwidth``;
    {"trials": raw timings, ...fit_sharing}: the newcomer weight that reproduces them on ``link`` (a fit_links
    entry: the point-to-point α and B) with the testbed's bucket ``burst``."""
    size = max(4, int(message_bytes) // 4 * 4)

    def measure() -> dict:
        from real.testbed.launcher import torchrun_on
        from real.testbed.namespaces import Testbed

        probe_file = folder / f"sharing-{slug(bandwidth)}-{size}.raw.json"
        with Testbed(hosts=3, bandwidth=bandwidth, prefix=prefix) as bed:
            idle = refill_idle(bed.config)
            lone = size / bed.config.bandwidth
            codes = torchrun_on(bed, "real.calibration",
                                ["--sharing", str(probe_file), "--size", str(size), "--repeats", str(repeats),
                                 "--idle", str(idle), "--lone", str(lone)], folder / "logs", timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"sharing probe at {bandwidth} failed (node exit codes {codes}); logs in {folder}/logs")
        return {"bandwidth": bandwidth, "size": size, "trials": json.loads(probe_file.read_text())}

    measured = cached(folder / f"sharing-{slug(bandwidth)}-{size}.json", measure)
    trials = measured["trials"]
    colliding = [t for t in trials if t["pattern"] in ("into", "out")]
    crossing = [t for t in trials if t["pattern"] == "turns"]
    return (measured | fit_sharing(colliding, link["bandwidth"], link["alpha"], burst, size)
            | fit_duplex(crossing, link["bandwidth"], link["alpha"], burst, size))


def turns(lone: float) -> int:
    """How many turns the probe takes, each a transfer of ``lone`` seconds on its own each way."""
    return int(min(MAX_TURNS, max(MIN_TURNS, TURNS_TIME // lone)))


# -- what the ranks run -------------------------------------------------------------
def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.001) if left > 0.002 else 0)


def _wait_timed(works: list, ends: list[float]) -> None:
    """Wait for every receive of ``works``, writing when each completed into ``ends``. gloo completes a
    receive only inside wait(), so each is waited for on a thread of its own."""

    def receive(i: int) -> None:
        works[i].wait()
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=receive, args=(i,)) for i in range(len(works))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def sharing_rank(out: str, size: int, repeats: int, idle: float, lone: float) -> None:
    """Rank 0 is the shared host; ranks 1 and 2 its peers. "into": both peers send to rank 0 (pushes meeting
    in the shaper in front of a server); "out": rank 0 sends to both (pulls leaving through the server's
    own shaper). The second transfer starts SHARING_OFFSETS of a lone transfer after the first. Then the
    peers take ``turns(lone)`` turns at rank 0 (_take_turns). Every namespace of the testbed reads one
    CLOCK_MONOTONIC (time.perf_counter), so the instants compare."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    buffers = [torch.zeros(size // 4) for _ in range(2)]
    seen, labels = [], []  # each timed collision's instants on this rank, and its (pattern, fraction)
    for pattern, fraction in [(p, f) for p in ("into", "out") for f in SHARING_OFFSETS]:
        for repeat in range(repeats + 1):  # the first is a warm-up (connections, buffers)
            dist.barrier()
            start = torch.tensor([time.perf_counter() + idle + 0.02], dtype=torch.float64)
            dist.broadcast(start, 0)  # one instant for all; the links then rest ``idle`` (refilling buckets)
            at = (float(start), float(start) + fraction * lone)  # when flow 0 (peer 1) and flow 1 (peer 2) start
            starts, ends = _collide(pattern, at, buffers)
            if repeat:
                seen.append((starts, ends))
                labels.append((pattern, fraction))
    # The instants are exchanged once, after the last collision: gathered after each, by an all-gather ring in
    # which one peer sends to the host and the other receives from it, they made the next collision split
    # differently (at 200 Mbit/s the first of two 1.7 MB pushes a quarter of a transfer apart ended a median
    # 130 ms after its start with the exchange, 116 ms without; docs/log.md, "The probe's own chatter").
    trials = [{"pattern": pattern, "fraction": fraction, "starts": starts, "ends": ends}
              for (pattern, fraction), (starts, ends) in zip(labels, _known(seen))]
    trials += _take_turns(buffers, turns(lone))
    if dist.get_rank() == 0:
        write_atomic(out, json.dumps(trials))
    dist.destroy_process_group()


def _collide(pattern: str, at: tuple[float, float], buffers: list) -> tuple[list[float], list[float]]:
    """This rank's part of one collision of ``pattern`` whose flows start at the instants ``at``: (starts,
    ends) of flows 0 and 1, NaN where another rank takes the instant."""
    import torch.distributed as dist

    rank = dist.get_rank()
    starts, ends = [math.nan, math.nan], [math.nan, math.nan]
    if pattern == "into" and rank == 0:
        _wait_timed([dist.irecv(buffers[i], i + 1) for i in range(2)], ends)
    elif pattern == "into":
        _sleep_until(at[rank - 1])
        starts[rank - 1] = time.perf_counter()
        dist.send(buffers[0], 0)
    elif rank == 0:
        works = []
        for i in range(2):
            _sleep_until(at[i])
            starts[i] = time.perf_counter()
            works.append(dist.isend(buffers[i], i + 1))
        for work in works:
            work.wait()
    else:
        dist.recv(buffers[0], 0)
        ends[rank - 1] = time.perf_counter()
    return starts, ends


def _take_turns(buffers: list, turns: int) -> list[dict]:
    """The peers take turns at rank 0 as two asynchronous workers do: in each turn one peer sends to rank 0
    (a push) while rank 0 sends to the other (the reply to its pull), and the next turn starts as soon as
    both are through, the peers' roles swapped. One "turns" trial per turn after a warm-up: flow 0 the push,
    flow 1 the reply, their instants taken by the ranks that saw them."""
    import torch.distributed as dist

    rank = dist.get_rank()
    seen = []
    dist.barrier()
    for turn in range(turns + 1):  # the first is a warm-up
        pusher = 1 + turn % 2
        starts, ends = [math.nan, math.nan], [math.nan, math.nan]
        if rank == 0:
            arriving = dist.irecv(buffers[0], pusher)  # posted first, as the server's receives are
            starts[1] = time.perf_counter()
            leaving = dist.isend(buffers[1], 3 - pusher)
            _wait_timed([arriving], ends)  # ends[0]
            leaving.wait()
        elif rank == pusher:
            starts[0] = time.perf_counter()
            dist.send(buffers[0], 0)
        else:
            dist.recv(buffers[1], 0)
            ends[1] = time.perf_counter()
        if turn:
            seen.append((starts, ends))
    return [{"pattern": "turns", "fraction": 0.0, "starts": starts, "ends": ends} for starts, ends in _known(seen)]


def _known(seen: list) -> list[tuple[list[float], list[float]]]:
    """Every rank's (starts, ends) of each trial in ``seen`` gathered into one (starts, ends) per trial: each
    instant was taken by one rank, the one whose value is not NaN."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, seen)
    return [tuple([next(v[i] for v in values if not math.isnan(v[i])) for i in range(2)] for values in zip(*trial))
            for trial in zip(*gathered)]
