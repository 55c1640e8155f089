"""How the probes' ranks time a transfer or a collective on a shared machine: together, after the links
rested, in turns across sizes, and as often as a collective's tail needs."""

from __future__ import annotations

import math
import time

__all__ = ["AT_REPEATS", "AT_SECONDS", "AT_MAX_REPEATS", "SMALL", "SMALL_REPEATS", "timed_once", "interleaved",
           "at_repeats", "busy", "work", "refill_idle"]

SMALL, SMALL_REPEATS = 64 * 2**10, 4  # messages up to SMALL are timed SMALL_REPEATS times as often
# The runs' own all-reduce sizes are timed after a busy rest each, as a step's compute precedes its
# collective: AT_REPEATS times at least, and as often as AT_SECONDS of them take (at most AT_MAX_REPEATS);
# real.calibration.link_fit.at_size_time takes their trimmed mean (AT_TRIM says why so many).
AT_REPEATS, AT_SECONDS, AT_MAX_REPEATS = 20, 1.0, 200


def refill_idle(config) -> float:
    """Seconds the links rest before each timed transfer: twice a bucket's refill time, so every message
    meets a full bucket, as one after a step's compute does (config: the testbed's TestbedConfig)."""
    return 2 * config.burst / config.bandwidth


def timed_once(action, idle: float, from_last: bool = False, rest=None, after: float = 0.0,
               exits: list | None = None) -> float:
    """One round of ``action()``: every rank starts it together, after the links rested ``idle`` seconds
    (a tbf bucket refills while its link rests) while the rank ran ``rest(idle)``: busy, or by default a sleep.
    With ``after`` > 0 each rank computes that many seconds of its own core's time once its own part is over,
    as a run's rank starts its next step's compute when it leaves a collective (work), before the ranks
    compare instants.

    The round's time is its slowest rank's, or with ``from_last`` (collectives) the time from the last
    rank's start to the last rank's end, as syncsim starts a collective once every rank has arrived:
    ranks leave the barrier and the sleep apart (by milliseconds when four ranks wake on two cores),
    and the rank that started first would count the others' lateness as the collective's. The ranks
    share this machine's monotonic clock, so their instants compare directly. Given ``exits`` (a list),
    a ``from_last`` round also appends how long before the last rank each rank left (seconds, in
    increasing order, the last's 0): ranks leave a gloo ring apart, and whoever leaves first starts the
    next step first."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    (rest or time.sleep)(idle)
    t0 = time.perf_counter()
    action()
    t1 = time.perf_counter()
    if after > 0:
        work(after)
    # float64: perf_counter is seconds since boot, which float32 would round to milliseconds
    instants = torch.tensor([t0, t1] if from_last else [t1 - t0], dtype=torch.float64)
    if from_last and exits is not None:
        every = [torch.empty_like(instants) for _ in range(dist.get_world_size())]
        dist.all_gather(every, instants)
        ends = [float(t[1]) for t in every]
        exits.append(sorted(max(ends) - end for end in ends))
        return max(ends) - max(float(t[0]) for t in every)
    dist.all_reduce(instants, op=dist.ReduceOp.MAX)
    return float(instants[-1] - instants[0]) if from_last else float(instants[0])


def interleaved(rounds: list[int], time_once) -> list[list[float]]:
    """``rounds[k]`` timings of each item k, taken in turns: one warm-up of every item, then passes over
    the items, each timing every item that still needs one, so that a stall of the shared machine
    lasting a few timings falls on one timing of several sizes, which their medians discard, rather than
    on every timing of one size, as when each size's repeats ran back to back. ``time_once(k)`` times
    item k once."""
    for k in range(len(rounds)):
        time_once(k)  # warm-up: connections, buffers, the first touch of each size
    times: list[list[float]] = [[] for _ in rounds]
    for r in range(max(rounds, default=0)):
        for k, wanted in enumerate(rounds):
            if r < wanted:
                times[k].append(time_once(k))
    return times


def at_repeats(first: float) -> int:
    """How many times to time a run's own collective whose first timing took ``first`` seconds: as many as
    AT_SECONDS hold, within [AT_REPEATS, AT_MAX_REPEATS] (a fast collective's tail needs many timings to
    weigh in its mean; a slow one's thirty seconds would stretch the grid)."""
    if not first > 0:
        return AT_REPEATS
    return int(min(AT_MAX_REPEATS, max(AT_REPEATS, math.ceil(AT_SECONDS / first))))


def work(cpu_seconds: float) -> None:
    """Compute ``cpu_seconds`` of this thread's own CPU time (time.thread_time), as a step's compute does
    after a collective: alone on a core it takes that long, and longer when other ranks' compute, or
    their threads finishing a collective, share the core. A wall-clock spin (busy) would instead hold
    the cores for a set time whatever else runs: four small-model ranks spinning the all-at-once probe's
    step (2.5 ms) after each timing timed their 407 kB all-reduce at 1 Gbit/s at 14.9 ms, where the run,
    whose ranks computed 0.96 ms each, took 11.1 ms (the 2026-12-06 grid)."""
    import torch

    a = torch.ones(96, 96)
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        a @ a


def busy(seconds: float) -> None:
    """Keep this rank's core busy with arithmetic for ``seconds``, as a step's compute does before its
    collective (a sleeping rank's threads wake slower: see at_size_time and the idle cost)."""
    import torch

    a = torch.ones(96, 96)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a
