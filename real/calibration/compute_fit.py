"""The compute probe's numbers in syncsim's terms (no torch, no I/O): how long it times, what work a scheme's
worker does (worker_work, which names its probe), its ranks' timings summarised, and the idle cost."""

from __future__ import annotations

import statistics

__all__ = ["COMPUTE_STEPS", "COMPUTE_SECONDS", "COMPUTE_WARMUP", "MAX_COMPUTE_STEPS", "IDLE_GAPS", "IDLE_STEPS",
           "REFERENCE_STEPS", "idle_cost", "worker_work", "summarise_compute", "meeting_excess"]

# Each rank times at least COMPUTE_STEPS steps and COMPUTE_SECONDS of them (after COMPUTE_WARMUP): on a shared
# machine a 0.5 ms step timed 40 times is 20 ms of measurement, which one burst of another process can fill.
COMPUTE_STEPS, COMPUTE_SECONDS, COMPUTE_WARMUP, MAX_COMPUTE_STEPS = 40, 2.0, 5, 20_000
# After the back-to-back steps the probe times IDLE_STEPS steps after each of IDLE_GAPS seconds idle: a run's
# worker waits for the network between steps, and on this machine a step after an idle gap computes longer
# (the small model: 0.45 ms back to back, 0.63 ms after 2 ms idle, 1.04 ms after 5 ms, 1.56 ms after 20 ms).
# Each step after a gap is paired with a back-to-back step just before that gap, the last of
# REFERENCE_STEPS run one after the other, and the idle cost is the pairs' difference: compared with the
# back-to-back phase seconds before, as it once was, the machine's own drift between the two phases became
# idle cost (docs/log.md, "2026-12-07, night").
IDLE_GAPS, IDLE_STEPS, REFERENCE_STEPS = (2e-3, 8e-3, 30e-3), 15, 2


def idle_cost(before_idle: list[list[float]], after_idle: list[list[float]]) -> list[tuple[float, float]]:
    """syncsim's Workload.idle_cost from the compute probe: for each of IDLE_GAPS, how much longer the steps
    that followed that gap took (``after_idle``) than the back-to-back steps each was paired with, run just
    before the gap (``before_idle``): the mean of after less the mean of before (none shorter); none
    without timings after idle gaps (a scheme without servers)."""
    if not after_idle and not before_idle:  # the probe of a scheme without servers, whose workers never idle
        return []
    if (len(after_idle) != len(IDLE_GAPS) or len(before_idle) != len(IDLE_GAPS)
            or not all(after_idle) or [len(t) for t in before_idle] != [len(t) for t in after_idle]):
        raise ValueError(f"idle_cost needs timings after each of {len(IDLE_GAPS)} gaps, each paired with one "
                         f"before it; got {[len(t) for t in before_idle]} before and {[len(t) for t in after_idle]} "
                         "after")
    return [(gap, max(0.0, statistics.fmean(after) - statistics.fmean(before)))
            for gap, before, after in zip(IDLE_GAPS, before_idle, after_idle)]


def summarise_compute(gathered: list[dict], model: str, batch_size: int, scheme: str, slow: float) -> dict:
    """The compute probe's result from every rank's timings (``gathered``, in rank order, as
    real.calibration.compute_probe.time_worker_steps gives them): compute_time (the mean over ranks and
    steps), jitter (its coefficient of variation), backward_fraction, forward_time, per_rank, layers,
    idle_cost, meets and meeting_excess. With ``slow`` > 1 the last rank's steps (slowed as --slow slows a run's last
    worker) are reported apart: slowed_time, slow_forward and slow_wait."""
    processes = len(gathered)
    gathered = list(gathered)
    slowed = gathered.pop() if slow > 1 else None  # the last rank's, as --slow slows a run's last worker
    steps = [t for g in gathered for t in g["steps"]]
    mean = statistics.fmean(steps)

    def pooled(side: str) -> list[list[float]]:  # every rank's timings of each idle gap, gap by gap
        return [[t for g in gathered for t in g[side][i]] for i in range(len(gathered[0][side]))]

    result = {"model": model, "batch_size": batch_size, "processes": processes, "scheme": scheme,
              "compute_time": mean, "jitter": statistics.pstdev(steps) / mean,
              "backward_fraction": statistics.fmean(t for g in gathered for t in g["backward"]) / mean,
              "forward_time": statistics.fmean(t for g in gathered for t in g["forward"]),
              "per_rank": [statistics.fmean(g["steps"]) for g in gathered], "layers": gathered[0]["layers"],
              "idle_cost": idle_cost(pooled("before_idle"), pooled("after_idle")),
              "meets": gathered[0]["meetings"],  # how often the ranks met at their scheme's collectives
              "meeting_excess": meeting_excess([g.get("between", []) for g in gathered])}
    if slowed is not None:
        result |= {"slow": slow, "slowed_time": statistics.fmean(slowed["steps"]),
                   "slow_forward": slowed["slow_forward"], "slow_wait": slowed["slow_wait"]}
    return result


def meeting_excess(between: list[list[float]]) -> float | None:
    """How far the slowest rank's work from one meeting to the next lay above the ranks' mean, over the
    meetings every rank timed whole (``between``: each rank's list, real.calibration.compute_probe):
    sum over meetings of the slowest / sum of the mean - 1. A collective waits for the slowest rank, and
    ranks time-slicing two cores are not independent (one's wait is another's run), so this, not the
    spread of their steps, is what makes a collective's start late. None for fewer than two ranks or a
    rank with no whole window (a scheme whose ranks never meet)."""
    if len(between) < 2 or not all(between):
        return None
    meetings = min(len(b) for b in between)
    slowest = sum(max(b[k] for b in between) for k in range(meetings))
    mean = sum(statistics.fmean(b[k] for b in between) for k in range(meetings))
    return slowest / mean - 1.0


def worker_work(scheme: str) -> str:
    """The name of what a worker of ``scheme`` computes in a step, as its compute probe times it: schemes
    whose workers do the same work share one probe (a synchronous, an asynchronous and an SSP parameter
    server's workers compute, push and pull the same tensors: one probe of each model and worker count
    instead of three, two minutes of the default grid).

    The work is the plan's actions over the probe's steps at the scheme's precision and autocast, less
    what the probe's FreeNetwork does nothing for: a WaitForClock (a wait for peers, which returns at
    once) and a push's ``aggregate`` (how the servers apply it; the worker casts and sends the same
    gradient). Named by the scheme's precision and a digest of that work."""
    import dataclasses
    import hashlib

    from syncsim.schemes import parse
    from syncsim.schemes.actions import Push, WaitForClock

    spec = parse(scheme)
    steps = COMPUTE_WARMUP + COMPUTE_STEPS
    policy = spec.policy(4.0)  # which actions occur does not depend on the model's size (real.config)
    work = [[dataclasses.replace(a, aggregate=True) if isinstance(a, Push) else a
             for a in policy.plan(step, steps) if not isinstance(a, WaitForClock)] for step in range(steps)]
    digest = hashlib.sha1(repr((spec.precision, spec.amp, work)).encode()).hexdigest()[:8]
    return f"{spec.precision}{'-amp' if spec.amp else ''}-{digest}"
