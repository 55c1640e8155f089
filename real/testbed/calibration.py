"""Calibrate syncsim for runs on the testbed: the links' α and β, and compute under the run's contention.

Every number the simulator is given is measured here, on this machine, and has a physical meaning:

- **links**: a probe on a testbed at the configuration's rate times a ping-pong between two hosts and
  an all-reduce over every host at fp32 and each wire precision asked for, over message sizes SWEEP, each message after
  the links rested long enough to refill their tbf buckets, the sizes timed in turns (interleaved) so
  that a stall of the machine cannot take all of one size's timings; an all-reducing run is probed on as many
  hosts as it has workers. fit_links gives α, B and a collective's launch cost L of each closed form
  on a token-bucket link. The all-reduce fit at the scheme's precision is the link of workers that
  all-reduce (what collectives see, reduction arithmetic included), the ping-pong fit that of workers
  that push and pull and of the parameter servers (point-to-point traffic); all carry the testbed's
  bucket as their burst. A run's own all-reduce (``now``) is also timed at its size, in the minute before
  the run (the sweep is cached; a collective the cores pace drifts with the machine's load), each after
  a busy rest, and a collective's closed form passes through their trimmed mean (at_size_time: small gloo
  all-reduces here are bimodal, and a step time is a mean). A run that all-reduces twice a step
  (PowerSGD's P and Q rounds) has both timed, and one launch makes the forms' total pass through their
  timed total; top-k's exchange (an all-gather of k int32 indices, then one of k values) is timed the
  same way at the run's k (``gathers``) and priced as syncsim's ring all-gather on the ping-pong's α and
  B with a launch of its own (``allgather_<precision>``).
- **compute**: ``processes`` local ranks each time the executor's step of the configuration's scheme at
  once, as the configuration's workers do when they share this machine's cores: real.executor's own loop
  (the batch, forward and backward through DDP and its hooks, the optimizer step or the push's and
  pull's tensor work, the trace) with collectives over a group of one rank and a parameter-server client
  that sends nothing (FreeNetwork), so everything but the communication the link fits price: a
  compressor's arithmetic (PowerSGD's products and Gram-Schmidt, top-k's selection and scatter-add,
  DiLoCo's pseudo-gradient and outer step), which the executor runs inside its step, is in the compute
  time, and the workload leaves syncsim's compressor rates unset. The
  ranks meet after each step whose plan synchronises (all-reduces, averages, all-gathers or takes an
  outer step), as a run's workers leave each collective together and then compute at once. The mean
  over ranks and steps is the workload's compute time, its coefficient of variation the cluster's
  jitter, and the backward's share of the step the workload's backward_fraction (when DDP's buckets
  become ready). For a scheme with parameter servers the ranks then time steps that each follow an
  idle gap of IDLE_GAPS: how much longer those take is the workload's idle_cost, which the simulator
  adds to a step whose worker idled before it (waiting for the servers). On this machine it is most
  of a small step: the small model's 0.45 ms step took 1.04 ms after 5 ms idle, so one worker of a
  parameter server computed 1.1 ms a step in runs where the back-to-back probe said 0.67 ms. Workers
  that wait for a collective are not idle (gloo's threads reduce in their process): in a grid that
  charged them the sleep-measured cost, two all-reducing workers of the small model were simulated at
  2.7-2.9 ms a step's compute where their runs computed 1.1-1.2 ms. For a run with a straggler the probe's last rank
  is slowed as ``--slow RANK:F`` slows the run's last worker (real.executor: a sleep of (F-1) x 3 x its
  forward time, timed warm once, between forward and backward), and its step is reported apart
  (``slowed_time``), with the forward its sleep was sized from (``slow_forward``), which the run is
  given so that it sleeps as long: the slowed step sets that worker's speed factor in the simulator,
  measured rather than derived, since compute right after a sleep is slower than back to back (the same
  effect as the idle cost's).
  Schemes whose workers do the same work (the parameter servers' synchronous, asynchronous and SSP
  modes) share one compute probe (worker_work).

Results are cached as JSON under the calibration folder, so a resumed study measures nothing twice.
``python -m real.testbed.calibration --probe|--compute ...`` is what the ranks run.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

from syncsim.files import write_atomic

__all__ = ["SWEEP", "FreeNetwork", "measure_link", "measure_sharing", "fit_sharing", "measure_compute", "slug",
           "worker_work"]

SWEEP = tuple(2**k for k in range(12, 23))  # 4 KiB .. 4 MiB, ×2 apart
WIRE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # all-reduce precisions timed (torch dtypes)
# Each rank times at least COMPUTE_STEPS steps and COMPUTE_SECONDS of them (after COMPUTE_WARMUP): on a shared
# machine a 0.5 ms step timed 40 times is 20 ms of measurement, which one burst of another process can fill.
COMPUTE_STEPS, COMPUTE_SECONDS, COMPUTE_WARMUP, MAX_COMPUTE_STEPS = 40, 2.0, 5, 20_000
# After the back-to-back steps the probe times IDLE_STEPS steps after each of IDLE_GAPS seconds idle: a run's
# worker waits for the network between steps, and on this machine a step after an idle gap computes longer
# (the small model: 0.45 ms back to back, 0.63 ms after 2 ms idle, 1.04 ms after 5 ms, 1.56 ms after 20 ms).
IDLE_GAPS, IDLE_STEPS = (2e-3, 8e-3, 30e-3), 15
SMALL, SMALL_REPEATS = 64 * 2**10, 4  # messages up to SMALL are timed SMALL_REPEATS times as often
BURSTS_FOR_RATE = 2  # messages this many tbf buckets long or more time the link's sustained rate
RATE_WINDOW = 4.0  # given the run's message size, the line is fitted through probe messages within this factor of it
# The runs' own all-reduce sizes are timed after a busy rest each, as a step's compute precedes its
# collective: AT_REPEATS times at least, and as often as AT_SECONDS of them take (at most AT_MAX_REPEATS);
# their mean with AT_TRIM of each end cut off is the time at that size. The tail is the collective's own:
# a two-host 407 kB all-reduce at 1 Gbit/s timed 290 times ran a median 2.77 ms, p90 5.57 ms and a mean
# 3.45 ms, where the 20 timings and 10 % trim of each end this probe took before made 3.12 ms on average
# (sd 0.27 ms over resamples): a one-signed 10 % short, which every all-reducing row's prediction carried.
# 1 % still drops a lone stall of the shared machine among the hundred-odd timings of a fast collective.
AT_REPEATS, AT_SECONDS, AT_MAX_REPEATS, AT_TRIM = 20, 1.0, 200, 0.01
# The sharing probe's second transfer starts these fractions of a lone transfer after the first: at once (a
# synchronous round's pulls) and part-way through (a push arriving while another is on the link).
SHARING_OFFSETS = (0.0, 0.25, 0.5)
WEIGHT_RANGE = 64.0  # newcomer weights are fitted within [1/64, 64]


def slug(text: str) -> str:
    """A file-name-safe form of a bandwidth or scheme string."""
    return "".join(c if c.isalnum() else "-" for c in str(text)).strip("-")


def _cached(path: Path, measure, needs: tuple[str, ...] = ()) -> dict:
    """The result cached at ``path``, or ``measure()``'s, cached; a cached result without any of ``needs``
    (measured before this project recorded them) is measured again."""
    if path.exists():
        cached = json.loads(path.read_text())
        if all(key in cached for key in needs):
            return cached
    result = measure()
    write_atomic(path, json.dumps(result, indent=1))
    return result


def wire_bytes(message_bytes: float, precision: str) -> int:
    """The bytes of a tensor of ``precision`` elements holding ``message_bytes``: the size the probe times."""
    import torch

    itemsize = getattr(torch, WIRE[precision]).itemsize
    return max(1, round(message_bytes / itemsize)) * itemsize


def at_size_time(timings: list[float]) -> float:
    """The time a run's collective of a timed size adds to its step: the mean of ``timings`` with
    AT_TRIM of each end cut off. A step time is a mean, and so is what a collective adds to it, tail
    included: on this machine gloo's small all-reduces are bimodal (over loopback a 200 kB fp16
    all-reduce between two ranks took about 0.5-1 ms, or 4-6 ms in a quarter to a third of them, with
    no shaper), which a median leaves out, and a trim of a tenth of each end cut a sixth of the mean
    (see AT_TRIM); the 1 % trim drops a lone stall of the shared machine (one 72 ms timing among a
    hundred 2 ms ones)."""
    if not timings:
        raise ValueError("at_size_time needs at least one timing")
    cut = int(AT_TRIM * len(timings))  # timings cut off each end
    kept = sorted(timings)[cut:len(timings) - cut]
    return statistics.fmean(kept)


def _refill_idle(config) -> float:
    """Seconds the links rest before each timed transfer: twice a bucket's refill time, so every message
    meets a full bucket, as one after a step's compute does (config: the testbed's TestbedConfig)."""
    return 2 * config.burst / config.bandwidth


def measure_link(bandwidth: str, folder: Path, prefix: str = "sstb", repeats: int = 5,
                 message_bytes: float | None = None, hosts: int = 2, now: tuple[tuple[int, str], ...] = (),
                 precisions: tuple[str, ...] = ("fp32",), gathers: tuple[tuple[int, str], ...] = ()) -> dict:
    """Probe a testbed of ``hosts`` hosts at ``bandwidth``; {"probe": raw sweeps, "burst": tbf bucket,
    "fits": fit_links, "now": the timings of ``now``}, the rates fitted around ``message_bytes`` when given
    (see fit_links). The sweep is cached; the fit is made from it each time. It times all-reduces at each
    of ``precisions`` (fp32 always), a quarter of its time each: a study sweeps only the precisions its
    schemes send, and a cached sweep that lacks one asked for is measured again.

    ``now`` are a run's own all-reduces, (bytes, precision) as wire_bytes gives them, timed at every call
    and never cached, at_repeats times each after busy rests; fit_links takes a collective's time at the
    run's size from those timings. Called in the minute before the run, they time its collective as the
    machine is then: on this 2-core machine a collective that the cores rather than the shaper pace
    drifts with the machine's load by more than any model's error (at 1 Gbit/s the same two-host 407 kB
    all-reduce, timed this way in launches a minute apart, took a median 3.9, 8.4, 13.5 and 6.0 ms on
    2026-12-03), and a grid's rows run up to half an hour after its link probes.

    The all-reduces run over every host, so a run's collectives are timed with its own number of ranks:
    gloo's ring moves 2(p-1) chunks of n/p through each link, and how TCP paces those through a shaper
    and how long the ranks' threads wait for this machine's two cores depend on p (measured at 1 Gbit/s,
    a 407 kB all-reduce took 4-6 ms over two hosts and 6-9 ms over four). The ping-pong always runs
    between hosts 0 and 1.

    A run with several all-reduces a step (PowerSGD's P and Q rounds) gives them all in ``now``: the
    launch is then fitted so that the closed forms' total passes through their timed total (fit_links'
    ``sizes``). ``gathers`` are a run's all-gathers, (values k, precision): top-k's k int32 indices and
    then its k values at the precision, the two all-gathers real.executor sends a step, timed together
    as one round like ``now`` (never cached; ``gather_now`` in the result) and fitted as
    ``allgather_<precision>`` (fit_links' ``gather``)."""

    if unknown := set(precisions) - set(WIRE):
        raise ValueError(f"measure_link: precisions must be among {sorted(WIRE)}, got {sorted(unknown)}")
    swept = sorted(set(precisions) | {"fp32"}, key=list(WIRE).index)  # fp32: the plain "allreduce" curve
    fresh = sorted({(int(size), str(precision)) for size, precision in now})
    for size, precision in fresh:
        if not _valid_at(size, precision):
            raise ValueError(f"measure_link: now entry ({size!r}, {precision!r}) must be a precision of "
                             f"{sorted(WIRE)} and a positive whole number of its elements' bytes")
    gathered = sorted({(int(values), str(precision)) for values, precision in gathers})
    for values, precision in gathered:
        if not _valid_gather(values, precision):
            raise ValueError(f"measure_link: gathers entry ({values!r}, {precision!r}) must be a positive number "
                             f"of values and a precision of {sorted(WIRE)}")

    def measure(at: list, sweep_sizes: bool = True, tag: str = "", swept: list[str] = swept,
                gather: list = ()) -> dict:
        from real.testbed.launcher import torchrun_on
        from real.testbed.namespaces import Testbed

        probe_file = folder / f"probe-{name}{tag}.json"
        argv = ["--probe", str(probe_file), "--repeats", str(repeats), "--at", encode_at(at),
                "--precisions", ",".join(swept)] + (["--gather", encode_at(gather)] if gather else [])
        with Testbed(hosts=hosts, bandwidth=bandwidth, prefix=prefix) as bed:
            argv += ["--idle", str(_refill_idle(bed.config))] + ([] if sweep_sizes else ["--no-sweep"])
            codes = torchrun_on(bed, "real.testbed.calibration", argv, folder / "logs", timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"link probe at {bandwidth} on {hosts} hosts failed (node exit codes {codes}); "
                               f"logs in {folder}/logs")
        probe = json.loads(probe_file.read_text())
        return {"bandwidth": bandwidth, "hosts": hosts, "burst": bed.config.burst, "probe": probe}

    name = f"{slug(bandwidth)}-h{hosts}"
    path = folder / f"link-{name}.json"
    measured = _cached(path, lambda: measure([]))
    had = [precision for precision in WIRE if f"allreduce_{precision}" in measured["probe"]]
    if set(swept) - set(had):  # a precision asked for now was not swept: sweep it and those the cache had
        measured = measure([], swept=sorted(set(swept) | set(had), key=list(WIRE).index))
        write_atomic(path, json.dumps(measured, indent=1))
    timed = measure(fresh, sweep_sizes=False, tag="-now", gather=gathered)["probe"] if fresh or gathered else {}
    timed_now, gather_now = timed.get("at_size", []), timed.get("at_gather", [])
    probe = measured["probe"] | {"at_size": timed_now, "at_gather": gather_now}
    # every all-reduce the run sends a step, when it sends several (PowerSGD's two rounds)
    sizes = tuple(size for size, _ in fresh) if len(fresh) > 1 else ()
    fits = fit_links(probe, measured["burst"], message_bytes, sizes=sizes,
                     gather=gathered[0][0] if gathered else None)
    return measured | {"fits": fits, "now": timed_now, "gather_now": gather_now}


def encode_at(at) -> str:
    """``--at``'s text for (bytes, precision) entries: BYTES:PRECISION, comma-separated."""
    return ",".join(f"{size}:{precision}" for size, precision in at)


def _valid_at(size: int, precision: str) -> bool:
    return precision in WIRE and size >= 1 and size == wire_bytes(size, precision)


def _valid_gather(values: int, precision: str) -> bool:
    return precision in WIRE and 1 <= values <= 2**31 - 1  # int32 indices


def gather_bytes(values: int, precision: str) -> int:
    """Bytes one rank contributes to a top-k exchange of ``values`` entries: as many int32 indices
    (syncsim.schemes.actions.INDEX_BYTES) and values at ``precision`` (SparseAllGather.nbytes)."""
    import torch

    from syncsim.schemes.actions import INDEX_BYTES

    return int(values) * (INDEX_BYTES + getattr(torch, WIRE[precision]).itemsize)


def _parse_entries(text: str, digits: int, valid, message: str) -> list[tuple[int, str]]:
    """Comma-separated NUMBER:PRECISION entries, each checked by ``valid(number, precision)``; ValueError
    ``message`` (formatted with the entry) for the first that is malformed."""
    entries = []
    for item in filter(None, text.split(",")):
        number, _, precision = item.partition(":")
        if not re.fullmatch(f"[0-9]{{1,{digits}}}", number) or not valid(int(number), precision):
            raise ValueError(message.format(item=repr(item)))
        entries.append((int(number), precision))
    return entries


def parse_gather(text: str) -> list[tuple[int, str]]:
    """``--gather``'s entries, VALUES:PRECISION; ValueError naming the option and the entry when one is
    malformed."""
    return _parse_entries(text, 10, _valid_gather,
                          f"--gather: each entry must be VALUES:PRECISION with PRECISION one of {sorted(WIRE)} "
                          f"and VALUES a positive number of int32-indexed values, got {{item}}")


def parse_at(text: str) -> list[tuple[int, str]]:
    """``--at``'s entries; ValueError naming the option and the entry when one is malformed."""
    return _parse_entries(text, 12, _valid_at,
                          f"--at: each entry must be BYTES:PRECISION with PRECISION one of {sorted(WIRE)} "
                          f"and BYTES a positive multiple of its element size, got {{item}}")


def fit_links(probe: dict, burst: float, message_bytes: float | None = None, sizes: tuple[float, ...] = (),
              gather: int | None = None) -> dict:
    """α, B (and the bucket they imply) of the probe's ping-pong and all-reduces on a token-bucket link.

    Every timed message met a full bucket of ``burst`` bytes, so a message of n bytes takes
    α + max(0, n - burst)/B per hop (one hop for ping-pong, the ring's 2(p-1) messages and
    2(p-1)/p·n bytes per link for the all-reduce), and a collective also its launch cost L. B is fitted
    to the slope over messages of at least BURSTS_FOR_RATE buckets (real.calibrate.fit_linear, weights
    1/t). α is the ping-pong's one-way time of the messages of at most half a bucket, which pass at
    once (the median of all their timings), and a collective's hops each cost that α, as
    real.calibrate splits them. The fitted intercept tells the bucket, a check on the model:
    ``burst_fitted`` = (L + messages·α - intercept)·B.
    The all-reduce is fitted at each wire precision the probe timed: its rate includes the
    reduction arithmetic, which on CPUs costs as much per byte as the link for fp16.

    Given ``message_bytes`` (what a run sends at once: the gradient at the wire precision), each line is
    fitted through every timing of the probe's messages of at least BURSTS_FOR_RATE buckets within a
    factor RATE_WINDOW of it, as nccl-tests' bus bandwidth is read at the size of interest: TCP through a
    shaper need not reach one rate at every size (at 50 Mbit/s a two-host all-reduce ran at 5.1 MB/s at
    407 kB and 4.4 MB/s at 4 MiB). That line is Theil-Sen's (real.calibrate.fit_theil_sen), not a
    least-squares one through the sizes' medians: on this machine single timings stall, and a median of
    five did not hold when a stall took three (a four-host all-reduce at 1 Gbit/s timed 512 KiB at 7.3,
    12.0, 23.5, 23.9 and 26.0 ms, and 1 MiB at 13.5-16.7 ms; the medians' slope over a factor 2 made it a
    23 MB/s link, and the run's 407 kB all-reduces took 11 ms where that fit said 23 ms). The window spans
    a factor 4 each way so that it holds three or four of the probe's sizes. Fewer than two sizes in the
    window, or a slope there that is not positive, and the rate is fitted over every large message
    and the time at the run's size interpolated between the medians of the sizes around it.
    A collective's L is then what the closed form leaves of the line's time at the run's size, so that
    the form passes through it. Without a size, or beyond the probe's, L is what its hops leave of the
    small messages' time. On this machine a gloo all-reduce of up to half a megabyte over four hosts
    costs about the same 6-9 ms whatever its size (its ranks' threads wait for two cores), and its time
    rises by the link's rate only beyond: no single α and B fit every size, and the run's own size is the
    one that matters. The probe's all-reduces run over the run's own number of hosts (measure_link).

    ``sizes``: every all-reduce a run sends a step when it sends more than one (PowerSGD's P round, with
    the uncompressed values, and its Q round), each timed at its size (the probe's ``at_size``). The
    simulator prices them all with one launch, so L is the mean of what each closed form leaves of its
    timed mean: the forms' total passes through the timed total, a step's communication; ``launch_from``
    reads "run's sizes, timed". Without all of them timed, L is fitted at ``message_bytes`` as above.
    Where the ping-pong's α leaves a negative launch (a collective's messages within the bucket cost only
    their hops and launch, and the ping-pong's small messages can take longer one way than such a whole
    all-reduce), the collective's α is the one its timed time implies, with no launch (_through), so the
    forms pass through the timed times whatever the messages' sizes.

    ``gather``: a run's top-k k, whose all-gathers the probe timed (``at_gather``: k int32 indices, then
    k values at the precision, one round, as real.executor sends them): ``allgather_<precision>`` is the
    ring all-gather's closed form (syncsim.collectives.allgather_time: L + (p-1)·α + max(0, (p-1)·n -
    burst)/B, n = gather_bytes per rank) on the ping-pong's α and B (an all-gather passes each piece on
    as it came, with no reduction: the same point-to-point hops), and L what that form leaves of the
    round's timed mean. An all-reduce's launch would not do: it is another collective (and here two).
    """
    import numpy as np

    from real.calibrate import fit_linear, fit_theil_sen

    p = probe["world"]
    fits = {}
    curves = [("pingpong", 1, 1.0)] + [(key, 2 * (p - 1), 2 * (p - 1) / p) for key in probe
                                       if key.startswith("allreduce_")]
    for name, messages, scale in curves:  # scale: bytes each rank sends per byte of input
        rows = probe[name]
        n, t = (np.array([row[i] for row in rows], dtype=float) for i in (0, 1))
        timings = [row[2] if len(row) > 2 else [row[1]] for row in rows]  # every timing of each size
        large = n * scale >= BURSTS_FOR_RATE * burst
        intercept, slope, r2, residuals = fit_linear(n[large], t[large])
        at_size = None  # the time at the run's size, when the probe's sizes span it
        inside = message_bytes is not None and n.min() <= message_bytes <= n.max()
        if message_bytes is not None:
            near = large & (n >= message_bytes / RATE_WINDOW) & (n <= message_bytes * RATE_WINDOW)
            if near.sum() >= 2:
                each_n = np.array([size for size, keep, times in zip(n, near, timings) if keep for _ in times])
                each_t = np.array([x for keep, times in zip(near, timings) if keep for x in times], dtype=float)
                fit = fit_theil_sen(each_n, each_t)
                if fit[1] > 0:
                    large, (intercept, slope, r2, residuals) = near, fit
                    if inside:
                        at_size = intercept + slope * message_bytes
        small = n * scale <= max(burst / 2, (n * scale).min())
        # the median of every timing of the small messages: a stall of the shared machine moves a mean
        samples = [x for times, keep in zip(timings, small) if keep for x in times]
        small_time = float(np.median(samples))
        bandwidth = scale / slope
        # a collective's hops are small messages' one-way latencies (the ping-pong's α: the same veths)
        alpha = small_time if name == "pingpong" else fits["pingpong"]["alpha"]
        launch, launch_from = max(small_time - messages * alpha, 0.0), "small messages"
        timed = [times for size, precision, times in probe.get("at_size", [])
                 if message_bytes is not None and name == f"allreduce_{precision}"
                 and size == wire_bytes(message_bytes, precision)]
        if timed:  # the run's own size, timed after busy rests: its mean (at_size_time) stands for the run's
            at_size, inside = at_size_time(timed[0]), True
        if at_size is None and inside:
            at_size = float(np.interp(message_bytes, n, t))
        if name != "pingpong" and at_size is not None:
            # what the closed form leaves of the time at the run's size is the launch, so that the
            # form passes through it; where the line's rate leaves less than nothing, that rate
            # contradicts the time at the run's size (two sizes' timings can make a steep slope), and
            # the rate is the one that time implies, with no launch
            wire = max(0.0, scale * message_bytes - burst)
            launch = at_size - messages * alpha - wire / bandwidth
            if launch < 0 and wire > 0 and at_size > messages * alpha:
                bandwidth, launch = wire / (at_size - messages * alpha), 0.0
            alpha, launch = _through(at_size, messages, wire / bandwidth, 1, alpha)
            launch_from = "run's size, timed" if timed else "run's size"
        each = [(size, times) for size in sizes for at, precision, times in probe.get("at_size", [])
                if name == f"allreduce_{precision}" and at == wire_bytes(size, precision)]
        if name != "pingpong" and sizes and len(each) == len(sizes):
            # several all-reduces a step: one launch, with which the forms' total passes through the timed total
            alpha, launch = _through(sum(at_size_time(times) for _, times in each), messages * len(each),
                                     sum(max(0.0, scale * size - burst) for size, _ in each) / bandwidth, len(each),
                                     fits["pingpong"]["alpha"])
            launch_from = "run's sizes, timed"
        fits[name] = {"alpha": alpha, "launch": launch, "launch_from": launch_from, "bandwidth": bandwidth,
                      "r2": r2, "burst_fitted": (launch + messages * alpha - intercept) * bandwidth,
                      "relative_residuals": residuals, "rate_sizes": n[large].tolist(),
                      "alpha_sizes": n[small].tolist(), "ranks": p}
    for values, precision, times in probe.get("at_gather", []):
        if gather is None or values != gather:
            continue
        point = fits["pingpong"]
        sent = (p - 1) * gather_bytes(values, precision)  # what each rank's link carries in the ring
        at = at_size_time(times)
        alpha, launch = _through(at, p - 1, max(0.0, sent - burst) / point["bandwidth"], 1, point["alpha"])
        fits[f"allgather_{precision}"] = {"alpha": alpha, "bandwidth": point["bandwidth"], "launch": launch,
                                          "launch_from": "run's size, timed", "values": values, "at_size": at,
                                          "ranks": p}
    return fits


def _through(timed: float, hops: int, wire: float, collectives: int, alpha: float) -> tuple[float, float]:
    """(α, L) with which ``collectives`` closed forms of ``hops`` hop latencies α and ``wire`` seconds on the
    link in all (their bytes beyond the bucket at the fitted rate), each with the launch L, take ``timed``
    seconds together: L = (timed - hops·α - wire) / collectives with the ping-pong's ``alpha``. Where that
    leaves less than nothing, the ping-pong's α contradicts the collectives' own time (messages within a
    bucket cost only their hops and launch, and the ping-pong's small messages, each after its ranks
    slept, can take longer one way than a whole 4 kB all-reduce: at 200 Mbit/s here a median 1.2 ms
    against 0.5 ms), and the hops' α is the one that time implies, with no launch; the form passes
    through the timed time either way. Nothing left for the hops either: the ping-pong's α, no launch."""
    launch = (timed - hops * alpha - wire) / collectives
    if launch >= 0:
        return alpha, launch
    if timed > wire and hops:
        return (timed - wire) / hops, 0.0
    return alpha, 0.0


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
            idle = _refill_idle(bed.config)
            lone = size / bed.config.bandwidth
            codes = torchrun_on(bed, "real.testbed.calibration",
                                ["--sharing", str(probe_file), "--size", str(size), "--repeats", str(repeats),
                                 "--idle", str(idle), "--lone", str(lone)], folder / "logs", timeout=900, agent=False)
        if any(codes):
            raise RuntimeError(f"sharing probe at {bandwidth} failed (node exit codes {codes}); logs in {folder}/logs")
        return {"bandwidth": bandwidth, "size": size, "trials": json.loads(probe_file.read_text())}

    measured = _cached(folder / f"sharing-{slug(bandwidth)}-{size}.json", measure)
    return measured | fit_sharing(measured["trials"], link["bandwidth"], link["alpha"], burst, size)


def simulate_collision(starts: list[float], size: float, bandwidth: float, alpha: float, burst: float,
                       weight: float) -> list[float]:
    """When each of the transfers of ``size`` bytes started at ``starts`` ends on one syncsim link."""
    import simpy

    from syncsim.network import SharedLink

    env = simpy.Environment()
    link = SharedLink(env, bandwidth, burst=burst, newcomer_weight=weight)
    ends = [math.nan] * len(starts)
    first = min(starts)

    def flow(i: int, start: float):
        yield env.timeout(start - first)
        yield link.transfer(size)
        ends[i] = env.now + first + alpha

    for i in sorted(range(len(starts)), key=starts.__getitem__):
        env.process(flow(i, starts[i]))
    env.run()
    return ends


def fit_sharing(trials: list[dict], bandwidth: float, alpha: float, burst: float, size: float) -> dict:
    """How the measured collisions split the link, in syncsim.network's terms (Link.newcomer_weight and
    Link.sharing_spread).

    Each trial started two transfers of ``size`` bytes at measured instants (the second a fraction of a
    lone transfer later, or at once) through one shaper, and timed when each ended. The link's rate
    fixes when the pair is done; how the two ends split that is what the newer flow's weight w sets.
    Each trial's w minimises the squared error of its two ends relative to each transfer's duration,
    searched on a log grid from 1/WEIGHT_RANGE to WEIGHT_RANGE and refined around the best point.
    ``weight`` is the geometric mean of the trials' w (the newer flow's mean preference),
    ``spread`` the standard deviation of their log (how widely collisions scatter), ``weights`` the
    geometric mean per pattern, ``residual`` the root-mean-square relative error of the ends with each
    trial's own w (how well the form fits) and ``residual_fair`` the same with w = 1 (equal sharing)."""
    import numpy as np

    def errors(weight: float, trial: dict) -> list[float]:
        ends = simulate_collision(trial["starts"], size, bandwidth, alpha, burst, weight)
        return [(e - m) / (m - s) for e, m, s in zip(ends, trial["ends"], trial["starts"])]

    def cost(weight: float, trial: dict) -> float:
        return float(np.mean(np.square(errors(weight, trial))))

    def best(trial: dict) -> float:
        grid = np.geomspace(1 / WEIGHT_RANGE, WEIGHT_RANGE, 61)
        i = int(np.argmin([cost(w, trial) for w in grid]))
        fine = np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 41)
        return float(min(fine, key=lambda w: cost(w, trial)))

    if len(trials) < 2:
        raise ValueError(f"fit_sharing needs at least 2 trials to tell a spread, got {len(trials)}")
    logs = np.log([best(trial) for trial in trials])
    patterns = [trial["pattern"] for trial in trials]

    def rms(weights) -> float:
        return float(np.sqrt(np.mean([e * e for w, t in zip(weights, trials) for e in errors(w, t)])))

    return {"weight": float(np.exp(logs.mean())), "spread": float(logs.std(ddof=1)),
            "weights": {p: float(np.exp(np.mean([x for x, q in zip(logs, patterns) if q == p])))
                        for p in sorted(set(patterns))},
            "trial_weights": [float(w) for w in np.exp(logs)],
            "residual": rms(np.exp(logs)), "residual_fair": rms([1.0] * len(trials))}


def measure_compute(model: str, batch_size: int, processes: int, folder: Path, scheme: str = "allreduce",
                    slow: float = 1.0, repeat: str = "") -> dict:
    """``processes`` ranks timing the executor's step of ``scheme`` without its communication at once;
    compute_time, jitter, backward_fraction, forward_time, layers, meets (how often the ranks met where
    the scheme's collectives are), and idle_cost (how much longer steps
    take after each of IDLE_GAPS idle, syncsim's Workload.idle_cost). With ``slow`` > 1 the last rank is
    slowed as ``--slow`` slows a run's last worker, and ``slowed_time`` is its step (the others make the
    rest), ``slow_forward`` the forward it timed warm and sized its sleep from, ``slow_wait`` that sleep: a
    run given ``--slow RANK:F:slow_forward`` sleeps as long. A ``repeat`` label (letters, digits, dashes)
    makes the probe one of its own, cached under that label: a repeated measurement takes its own probe
    rather than the one the same work was timed with before."""
    from real.config import MAX_SLOW
    from syncsim.schemes import parse

    try:
        scheme = str(parse(scheme))
    except ValueError as err:
        raise ValueError(f"measure_compute: scheme: {err}") from None
    if not 1.0 <= slow <= MAX_SLOW or (slow > 1 and processes < 2):
        raise ValueError(f"measure_compute: slow must be 1 or, with 2 processes or more, up to {MAX_SLOW:g}; "
                         f"got {slow!r} with {processes} processes")
    if repeat and not all(ch.isalnum() or ch == "-" for ch in repeat):
        raise ValueError(f"measure_compute: repeat must be letters, digits and dashes (a file name's part); "
                         f"got {repeat!r}")
    name = f"compute-{model}-b{batch_size}-p{processes}-{worker_work(scheme)}" + (f"-slow{slow:g}" if slow > 1 else "")
    name += f"-{repeat}" if repeat else ""

    def measure() -> dict:
        from real.testbed.launcher import fork_local

        out = folder / f"{name}.raw.json"
        # Forked as the runs' ranks are (real.testbed.forkserver): no rank spends seconds importing torch.
        codes = fork_local(processes, "real.testbed.calibration",
                           ["--compute", str(out), "--model", model, "--batch-size", str(batch_size),
                            "--scheme", scheme, "--slow", str(slow)], folder / "logs" / name, timeout=900)
        if any(codes):
            raise RuntimeError(f"compute probe {name} failed (rank exit codes {codes}); logs in {folder}/logs/{name}")
        return json.loads(out.read_text())

    # probes from before the ranks met at their scheme's collectives lack "meets", slowed ones from before a
    # run was given the forward its straggler's sleep is sized from lack "slow_forward": measured again
    needs = ("idle_cost", "meets") + (("slow_forward",) if slow > 1 else ())
    return _cached(folder / f"{name}.json", measure, needs=needs)


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


# -- what the ranks run -------------------------------------------------------------
def _timed_once(action, idle: float, from_last: bool = False, rest=None) -> float:
    """One round of ``action()``: every rank starts it together, after the links rested ``idle`` seconds
    (a tbf bucket refills while its link rests) while the rank ran ``rest(idle)``: _busy, or by default a sleep.

    The round's time is its slowest rank's, or with ``from_last`` (collectives) the time from the last
    rank's start to the last rank's end, as syncsim starts a collective once every rank has arrived:
    ranks leave the barrier and the sleep apart (by milliseconds when four ranks wake on two cores),
    and the rank that started first would count the others' lateness as the collective's. The ranks
    share this machine's monotonic clock, so their instants compare directly."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    (rest or time.sleep)(idle)
    t0 = time.perf_counter()
    action()
    t1 = time.perf_counter()
    # float64: perf_counter is seconds since boot, which float32 would round to milliseconds
    instants = torch.tensor([t0, t1] if from_last else [t1 - t0], dtype=torch.float64)
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


def _busy(seconds: float) -> None:
    """Keep this rank's core busy with arithmetic for ``seconds``, as a step's compute does before its
    collective (a sleeping rank's threads wake slower: see at_size_time and the idle cost)."""
    import torch

    a = torch.ones(96, 96)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a


def _probe_rank(out: str, repeats: int, idle: float, at: list[tuple[int, str]], sweep_sizes: bool = True,
                precisions: tuple[str, ...] = tuple(WIRE), gather: list[tuple[int, str]] = ()) -> None:
    """Ping-pong (ranks 0 and 1, fp32) and all-reduce (every rank, at each of ``precisions``) over SWEEP,
    then the all-reduces of ``at`` ((bytes, precision): the runs' own sizes) and the top-k exchanges of
    ``gather`` ((values k, precision): an all-gather of k int32 indices, then one of k values, as
    real.executor sends them) at_repeats times each, in turns, each after ``idle`` seconds of _busy;
    ``sweep_sizes`` False times only those."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict = {"world": dist.get_world_size(), "idle": idle}

    def pingpong(buf):
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    def sweep(actions: list, per: float = 1.0, from_last: bool = False) -> list[tuple]:
        # small messages are quick and their times noisy on a shared machine: time them more often
        rounds = [repeats * (SMALL_REPEATS if size <= SMALL else 1) for size in SWEEP]
        times = interleaved(rounds, lambda k: _timed_once(actions[k], idle, from_last) / per)
        return [(size, statistics.median(t), t) for size, t in zip(SWEEP, times)]

    if sweep_sizes:
        bufs = [torch.zeros(size // 4) for size in SWEEP]
        result["pingpong"] = sweep([lambda buf=buf: pingpong(buf) for buf in bufs], per=2.0)  # one way
        for precision in precisions:
            dtype = getattr(torch, WIRE[precision])
            bufs = [torch.zeros(size // dtype.itemsize, dtype=dtype) for size in SWEEP]
            result[f"allreduce_{precision}"] = sweep([lambda buf=buf: dist.all_reduce(buf) for buf in bufs],
                                                     from_last=True)
        result["allreduce"] = result["allreduce_fp32"]
    bufs = [torch.zeros(size // getattr(torch, WIRE[precision]).itemsize, dtype=getattr(torch, WIRE[precision]))
            for size, precision in at]
    world = dist.get_world_size()
    exchanges = []  # top-k's: its indices and values, and the lists every rank's are gathered into
    for values, precision in gather:
        dtype = getattr(torch, WIRE[precision])
        index, value = torch.zeros(values, dtype=torch.int32), torch.zeros(values, dtype=dtype)
        exchanges.append((index, value, [torch.empty_like(index) for _ in range(world)],
                          [torch.empty_like(value) for _ in range(world)]))

    def exchange(j: int) -> None:
        index, value, indices, every = exchanges[j]
        dist.all_gather(indices, index)
        dist.all_gather(every, value)

    def at_once(k: int) -> float:
        action = (lambda: dist.all_reduce(bufs[k])) if k < len(at) else (lambda: exchange(k - len(at)))
        return _timed_once(action, idle, from_last=True, rest=_busy)

    # one round of each sets how many it gets (at_repeats): the ranks agree, as every round's time is their max
    items = len(at) + len(exchanges)
    times = interleaved([at_repeats(at_once(k)) for k in range(items)], at_once)
    result["at_size"] = [[size, precision, t] for (size, precision), t in zip(at, times)]
    result["at_gather"] = [[values, precision, t] for (values, precision), t in zip(gather, times[len(at):])]
    if rank == 0:
        write_atomic(out, json.dumps(result))
    dist.destroy_process_group()


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


def _sharing_rank(out: str, size: int, repeats: int, idle: float, lone: float) -> None:
    """Rank 0 is the shared host; ranks 1 and 2 its peers. "into": both peers send to rank 0 (pushes meeting
    in the shaper in front of a server); "out": rank 0 sends to both (pulls leaving through the server's
    own shaper). The second transfer starts SHARING_OFFSETS of a lone transfer after the first. Every
    namespace of the testbed reads one CLOCK_MONOTONIC (time.perf_counter), so the instants compare."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buffers = [torch.zeros(size // 4) for _ in range(2)]
    trials = []
    for pattern in ("into", "out"):
        for fraction in SHARING_OFFSETS:
            for repeat in range(repeats + 1):  # the first is a warm-up (connections, buffers)
                dist.barrier()
                start = torch.tensor([time.perf_counter() + idle + 0.02], dtype=torch.float64)
                dist.broadcast(start, 0)  # one instant for all; the links then rest ``idle`` (refilling buckets)
                at = (float(start), float(start) + fraction * lone)  # when flow 0 (peer 1) and flow 1 (peer 2) start
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
                gathered = [None] * dist.get_world_size()
                dist.all_gather_object(gathered, (starts, ends))
                if repeat:  # each instant was taken by one rank: the one that is not NaN
                    known = [[next(v[i] for v in values if not math.isnan(v[i])) for i in range(2)]
                             for values in zip(*gathered)]
                    trials.append({"pattern": pattern, "fraction": fraction, "starts": known[0], "ends": known[1]})
    if rank == 0:
        write_atomic(out, json.dumps(trials))
    dist.destroy_process_group()


class FreeNetwork:
    """A parameter-server client whose network costs nothing: a worker's own tensor work around a push
    and a pull (the gradient cast to the wire format; the pulled parameters cast back to fp32) without
    a byte sent. What the link fits price is left out, everything else the executor does is timed."""

    def __init__(self, flat_params, wire_dtype) -> None:
        self.wire_dtype = wire_dtype
        self.params = flat_params.to(wire_dtype)
        self.nbytes = self.params.numel() * self.params.element_size()

    def push(self, flat_grad, step: int, aggregate: bool) -> int:
        flat_grad.to(self.wire_dtype)
        return self.nbytes

    def wait(self, step: int, threshold: int) -> None:
        pass

    def pull(self, step: int):
        return self.params.float(), self.nbytes

    def stop(self) -> None:
        pass


def _time_worker_steps(model_name: str, batch_size: int, scheme: str, folder: str, slow: float = 1.0) -> dict:
    """One rank: the executor's steps of ``scheme`` on one worker whose peers cost nothing, timed as
    COMPUTE_STEPS says.

    The executor runs its own loop (real.executor.Executor.run_step): the batch, the forward and
    backward (through DDP and the executor's byte-counting hook where the plan all-reduces), the
    optimizer step or the push's and pull's tensor work, its trace records; for PowerSGD, top-k and
    DiLoCo also the compressor's arithmetic (syncsim.compression: error feedback, P = ΔQ, Gram-Schmidt,
    Q = ΔᵀP̂, P̂Qᵀ; the top-k selection and scatter-add) and the outer optimiser's step, which the executor
    runs inside its step between its collectives. Its collectives run over a process group of this rank
    alone and its parameter-server client is FreeNetwork, so what is timed is the step without its
    communication, which the link fits price, and with everything else: a workload calibrated from
    it leaves syncsim's compressor rates (Workload.compress_flops, scan_rate) unset, or that work
    would be counted twice.

    After a step whose plan ends in a collective (an all-reduce, a model average, PowerSGD's two rounds,
    top-k's all-gather, DiLoCo's outer step, a sharded step's reduce-scatter) the ranks meet at a
    barrier, untimed, as a run's workers leave each collective together and compute at once: the cores
    are then shared as in the run. Ranks that never met were a poor stand-in for all-reducing workers
    of the small model: four of them computing back to back on two cores took 1.3-2.2 ms a step with a
    coefficient of variation of 1.3-6.3 (a step ran whole, or waited out another rank's time slice),
    where the runs' workers computed 0.5-1.2 ms, varying by 0.8-1.2, and the simulator's slowest of
    four such draws made a local-SGD step 61 % longer than measured."""
    import gc

    import torch
    import torch.distributed as dist

    from real.config import RunConfig, needs_servers
    from real.data import load
    from real.executor import Executor, flat_params
    from real.hooks import WIRE_DTYPES
    from real.models import build, param_layers
    from real.trace import Recorder
    from syncsim.schemes.actions import (
        AllReduceGradients,
        AverageParameters,
        LowRankAllReduce,
        OuterStep,
        ReduceScatterGradients,
        SparseAllGather,
    )

    # the actions after which a run's workers leave a collective together: every synchronising one (a sharded
    # step's reduce-scatter, which its gathers accompany)
    meeting = (AllReduceGradients, AverageParameters, LowRankAllReduce, SparseAllGather, OuterStep,
               ReduceScatterGradients)
    pushes = needs_servers(scheme)
    cfg = RunConfig(scheme=scheme, world=1, servers=int(pushes), model=model_name, batch_size=batch_size,
                    steps=COMPUTE_WARMUP + MAX_COMPUTE_STEPS + len(IDLE_GAPS) * IDLE_STEPS, out=folder,
                    slow=((0, slow),) if slow > 1 else ())
    rank, world = dist.get_rank(), dist.get_world_size()
    own = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group, in order
    model, data = build(cfg.model, cfg.seed), load(cfg.data, cfg.seed)  # as real.worker builds them
    client = FreeNetwork(flat_params(model), WIRE_DTYPES[cfg.spec.precision]) if pushes else None
    executor = Executor(cfg, 0, model, data, torch.device("cpu"), own, Recorder(time.time()), client=client)
    steps, forward, backward = [], [], []
    dist.barrier()  # every rank starts at once: they share the cores as a run's ranks do
    timed, meetings = 0.0, 0
    alone = dist.get_world_size() == 1  # a lone rank has no one to meet

    def enough(step: int) -> bool:  # this rank has timed what COMPUTE_STEPS and COMPUTE_SECONDS ask
        return step >= COMPUTE_WARMUP + COMPUTE_STEPS and timed >= COMPUTE_SECONDS

    for step in range(COMPUTE_WARMUP + MAX_COMPUTE_STEPS):
        if (pushes or alone) and enough(step):  # ranks that never meet stop on their own
            break
        t0 = time.perf_counter()
        executor.run_step(step)
        elapsed = time.perf_counter() - t0
        if step >= COMPUTE_WARMUP:
            timed += elapsed
            steps.append(elapsed)
            forward.append(executor.forward_time)  # what real.executor times to size a --slow rank's extra wait
            backward.append(executor.backward_time)
        if not alone and any(isinstance(action, meeting) for action in executor.policy.plan(step, cfg.steps)):
            # the workers leave the step's collective together (untimed); they stop together, once every
            # rank has timed enough, or the others would wait at this meeting for a rank that left
            every_rank_done = torch.tensor([float(enough(step + 1))])
            dist.all_reduce(every_rank_done, op=dist.ReduceOp.MIN)
            meetings += 1
            if every_rank_done.item():
                break
    # Then, for a worker of parameter servers, steps that each follow an idle gap, as its steps follow
    # its wait for the servers (the ranks idle together, as they computed together). A worker waiting for
    # a collective is not idle (its own threads reduce), and syncsim charges it no idle cost.
    after_idle = []
    if pushes:
        dist.barrier()
        for gap in IDLE_GAPS:
            timings = []
            for _ in range(IDLE_STEPS):
                step += 1
                time.sleep(gap)
                t0 = time.perf_counter()
                executor.run_step(step)
                timings.append(time.perf_counter() - t0)
            after_idle.append(timings)
    layers = list(param_layers(model))
    slow_wait = executor.slow_wait  # a slowed rank's sleep per step (real.executor; 0 when not slowed)
    slow_forward = executor.slow_forward  # the forward that sleep was sized from (None: not slowed)
    # The executor refers to itself (its handlers), so only the collector frees it and the DDP module and
    # averager holding this rank's group: now, before the groups are destroyed. Left to the interpreter's
    # exit, a gloo group outliving its process group's teardown aborts the process ("terminate called
    # without an active exception": 4 of 36 probes of a grid).
    del executor, client
    gc.collect()
    return {"steps": steps, "forward": forward, "backward": backward, "layers": layers, "after_idle": after_idle,
            "meetings": meetings, "slow_wait": slow_wait, "slow_forward": slow_forward}


def idle_cost(back_to_back: float, after_idle: list[list[float]]) -> list[tuple[float, float]]:
    """syncsim's Workload.idle_cost from the compute probe: for each of IDLE_GAPS, how much longer the
    steps that followed that gap took than the ``back_to_back`` mean (none shorter); none without
    timings after idle gaps (a scheme without servers)."""
    if not after_idle:  # the probe of a scheme without servers, whose workers never idle
        return []
    if len(after_idle) != len(IDLE_GAPS) or not all(after_idle):
        raise ValueError(f"idle_cost needs timings after each of {len(IDLE_GAPS)} gaps, got {len(after_idle)} lists "
                         f"of {[len(t) for t in after_idle]}")
    return [(gap, max(0.0, statistics.fmean(times) - back_to_back)) for gap, times in zip(IDLE_GAPS, after_idle)]


def _compute_rank(out: str, model: str, batch_size: int, scheme: str, slow: float = 1.0) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    last = dist.get_rank() == dist.get_world_size() - 1
    mine = _time_worker_steps(model, batch_size, scheme, str(Path(out).parent), slow if last else 1.0)
    processes = dist.get_world_size()
    gathered = [None] * processes
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() == 0:
        slowed = gathered.pop() if slow > 1 else None  # the last rank's, as --slow slows a run's last worker
        steps = [t for g in gathered for t in g["steps"]]
        mean = statistics.fmean(steps)
        result = {"model": model, "batch_size": batch_size, "processes": processes, "scheme": scheme,
                  "compute_time": mean, "jitter": statistics.pstdev(steps) / mean,
                  "backward_fraction": statistics.fmean(t for g in gathered for t in g["backward"]) / mean,
                  "forward_time": statistics.fmean(t for g in gathered for t in g["forward"]),
                  "per_rank": [statistics.fmean(g["steps"]) for g in gathered], "layers": gathered[0]["layers"],
                  "idle_cost": idle_cost(mean, [[t for g in gathered for t in g["after_idle"][i]]
                                                for i in range(len(gathered[0]["after_idle"]))]),
                  "meets": gathered[0]["meetings"]}  # how often the ranks met at their scheme's collectives
        if slowed is not None:
            result |= {"slow": slow, "slowed_time": statistics.fmean(slowed["steps"]),
                       "slow_forward": slowed["slow_forward"], "slow_wait": slowed["slow_wait"]}
        write_atomic(out, json.dumps(result, indent=1))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from real.calibrate import MAX_REPEATS
    from real.config import MAX_SLOW, MODELS, SAMPLE_BYTES
    from syncsim.arguments import ArgumentParser, check_count, integer, number
    from syncsim.files import check_out_file
    from syncsim.limits import check_memory
    from syncsim.schemes import parse

    ap = ArgumentParser(prog="python -m real.testbed.calibration", description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--probe", help="(a rank of) the link probe: write the sweeps here")
    what.add_argument("--compute", help="(a rank of) the compute probe: write the timings here")
    what.add_argument("--sharing", help="(a rank of) the sharing probe: write the collisions here")
    ap.add_argument("--size", type=integer, default=2**20, help="bytes of each transfer of the sharing probe")
    ap.add_argument("--lone", type=number, default=0.0, help="seconds a lone transfer of --size takes (offsets)")
    ap.add_argument("--repeats", type=integer, default=5)
    ap.add_argument("--idle", type=number, default=0.0, help="seconds each link rests before a timed transfer")
    ap.add_argument("--at", default="", help="the link probe also times these all-reduces, BYTES:PRECISION,... "
                                             "(the runs' own sizes)")
    ap.add_argument("--gather", default="", help="the link probe also times these top-k exchanges, VALUES:PRECISION,"
                                                 "... (an all-gather of VALUES int32 indices, then of VALUES values)")
    ap.add_argument("--no-sweep", action="store_true", help="the link probe times only --at and --gather")
    ap.add_argument("--precisions", default=",".join(WIRE),
                    help="the link probe's sweep times all-reduces at these wire precisions (fp32 always)")
    ap.add_argument("--model", default="lenet", choices=MODELS)
    ap.add_argument("--batch-size", type=integer, default=32)
    ap.add_argument("--scheme", default="allreduce", help="the scheme whose worker step the compute probe times")
    ap.add_argument("--slow", type=number, default=1.0, help="the compute probe's last rank is this many times slower")
    args = ap.parse_args(argv)
    try:
        out, flag = next((v, f) for v, f in ((args.probe, "--probe"), (args.compute, "--compute"),
                                             (args.sharing, "--sharing")) if v is not None)
        check_out_file(out, flag)
        check_count("--size", args.size, 4, 2**30)
        if not 0 <= args.lone <= 60:
            raise ValueError(f"--lone must be between 0 and 60 seconds, got {args.lone:g}")
        check_count("--repeats", args.repeats, 1, MAX_REPEATS)
        check_count("--batch-size", args.batch_size, 1)
        try:
            parse(args.scheme)
        except ValueError as err:
            raise ValueError(f"--scheme: {err}") from None
        check_memory("--batch-size", args.batch_size, "samples of a batch", SAMPLE_BYTES, "lower --batch-size")
        if not 1 <= args.slow <= MAX_SLOW:
            raise ValueError(f"--slow must be between 1 and {MAX_SLOW:g}, got {args.slow:g}")
        if not 0 <= args.idle <= 60:
            raise ValueError(f"--idle must be between 0 and 60 seconds, got {args.idle:g}")
        at = parse_at(args.at)
        gather = parse_gather(args.gather)
        precisions = tuple(dict.fromkeys(["fp32", *filter(None, args.precisions.split(","))]))
        if unknown := [p for p in precisions if p not in WIRE]:
            raise ValueError(f"--precisions: each must be one of {sorted(WIRE)}, got {unknown[0]!r}")
    except ValueError as err:
        ap.error(str(err))
    if args.probe is not None:
        _probe_rank(args.probe, args.repeats, args.idle, at, sweep_sizes=not args.no_sweep, precisions=precisions,
                    gather=gather)
    elif args.sharing is not None:
        _sharing_rank(args.sharing, args.size, args.repeats, args.idle, args.lone)
    else:
        _compute_rank(args.compute, args.model, args.batch_size, args.scheme, args.slow)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # As real.worker: the probe's results are written; leave without running destructors, which gloo's
    # threads can abort at the interpreter's exit and so fail a probe that measured what it should.
    os._exit(code)
