"""The testbed's links in syncsim's terms: α, B and a collective's launch L fitted to the link probe's
timings on a token-bucket link (no torch, no I/O)."""

from __future__ import annotations

import statistics

import numpy as np

from real.calibration.fits import fit_linear, fit_theil_sen
from real.calibration.messages import gather_bytes, wire_bytes

__all__ = ["fit_links", "at_size_time", "BURSTS_FOR_RATE", "RATE_WINDOW", "AT_TRIM"]

BURSTS_FOR_RATE = 2  # messages this many tbf buckets long or more time the link's sustained rate
RATE_WINDOW = 4.0  # given the run's message size, the line is fitted through probe messages within this factor of it
# The runs' own all-reduce sizes are timed after a busy rest each (real.calibration.timing); their mean with
# AT_TRIM of each end cut off is the time at that size. The tail is the collective's own: a two-host 407 kB
# all-reduce at 1 Gbit/s timed 290 times ran a median 2.77 ms, p90 5.57 ms and a mean 3.45 ms, where 20
# timings with 10 % of each end trimmed made 3.12 ms on average (sd 0.27 ms over resamples): a one-signed
# 10 % short, which every all-reducing row's prediction carried. 1 % still drops a lone stall of the shared
# machine among the hundred-odd timings of a fast collective.
AT_TRIM = 0.01


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


def fit_links(probe: dict, burst: float, message_bytes: float | None = None, sizes: tuple[float, ...] = (),
              gather: int | None = None) -> dict:
    """α, B (and the bucket they imply) of the probe's ping-pong and all-reduces on a token-bucket link.

    Every timed message met a full bucket of ``burst`` bytes, so a message of n bytes takes
    α + max(0, n - burst)/B per hop (one hop for ping-pong, the ring's 2(p-1) messages and
    2(p-1)/p·n bytes per link for the all-reduce), and a collective also its launch cost L. B is fitted
    to the slope over messages of at least BURSTS_FOR_RATE buckets (fit_linear, weights 1/t). α is the
    ping-pong's one-way time of the messages of at most half a bucket, which pass at once (the median
    of all their timings), and a collective's hops each cost that α, as the user calibration
    (link_fits) splits them. The fitted intercept tells the bucket, a check on the model:
    ``burst_fitted`` = (L + messages·α - intercept)·B.
    The all-reduce is fitted at each wire precision the probe timed: its rate includes the
    reduction arithmetic, which on CPUs costs as much per byte as the link for fp16.

    Given ``message_bytes`` (what a run sends at once: the gradient at the wire precision), each line is
    fitted through every timing of the probe's messages of at least BURSTS_FOR_RATE buckets within a
    factor RATE_WINDOW of it, as nccl-tests' bus bandwidth is read at the size of interest: TCP through a
    shaper need not reach one rate at every size (at 50 Mbit/s a two-host all-reduce ran at 5.1 MB/s at
    407 kB and 4.4 MB/s at 4 MiB). That line is Theil-Sen's (fit_theil_sen), not a
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
    p = probe["world"]
    fits = {}
    curves = [("pingpong", 1, 1.0)] + [(key, 2 * (p - 1), 2 * (p - 1) / p) for key in probe
                                       if key.startswith("allreduce_")]
    for name, messages, scale in curves:  # scale: bytes each rank sends per byte of input
        hop = fits["pingpong"]["alpha"] if name != "pingpong" else None
        fits[name] = _fit_curve(probe, name, messages, scale, burst, message_bytes, sizes, hop)
    for values, precision, times in probe.get("at_gather", []):
        if gather is not None and values == gather:
            fits[f"allgather_{precision}"] = _fit_gather(fits["pingpong"], values, precision, times, burst, p)
    return fits


def _fit_curve(probe: dict, name: str, messages: int, scale: float, burst: float, message_bytes: float | None,
               sizes: tuple[float, ...], hop: float | None) -> dict:
    """fit_links' entry for one curve: the ping-pong (``hop`` None) or an all-reduce whose hops each
    cost the ping-pong's α ``hop`` (the same veths)."""
    rows = probe[name]
    n, t = (np.array([row[i] for row in rows], dtype=float) for i in (0, 1))
    timings = [row[2] if len(row) > 2 else [row[1]] for row in rows]  # every timing of each size
    large = n * scale >= BURSTS_FOR_RATE * burst
    (intercept, slope, r2, residuals), large, at_size = _rate_line(n, t, timings, large, message_bytes)
    small = n * scale <= max(burst / 2, (n * scale).min())
    # the median of every timing of the small messages: a stall of the shared machine moves a mean
    small_time = float(np.median([x for times, keep in zip(timings, small) if keep for x in times]))
    bandwidth = scale / slope
    alpha = small_time if hop is None else hop
    launch, launch_from = max(small_time - messages * alpha, 0.0), "small messages"
    at_size, timed = _time_at_run_size(probe, name, message_bytes, n, t, at_size)
    if hop is not None and at_size is not None:
        alpha, launch, bandwidth = _launch_at_size(at_size, messages, alpha, bandwidth,
                                                   max(0.0, scale * message_bytes - burst))
        launch_from = "run's size, timed" if timed else "run's size"
    each = [(size, times) for size in sizes for at, precision, times in probe.get("at_size", [])
            if name == f"allreduce_{precision}" and at == wire_bytes(size, precision)]
    if hop is not None and sizes and len(each) == len(sizes):
        # several all-reduces a step: one launch, with which the forms' total passes through the timed total
        alpha, launch = _through(sum(at_size_time(times) for _, times in each), messages * len(each),
                                 sum(max(0.0, scale * size - burst) for size, _ in each) / bandwidth, len(each), hop)
        launch_from = "run's sizes, timed"
    return {"alpha": alpha, "launch": launch, "launch_from": launch_from, "bandwidth": bandwidth,
            "r2": r2, "burst_fitted": (launch + messages * alpha - intercept) * bandwidth,
            "relative_residuals": residuals, "rate_sizes": n[large].tolist(),
            "alpha_sizes": n[small].tolist(), "ranks": probe["world"]}


def _rate_line(n, t, timings: list[list[float]], large, message_bytes: float | None):
    """(the rate's line (intercept, slope, R², residuals), the sizes it was fitted through, the line's time
    at ``message_bytes`` or None): least squares over every ``large`` size's median, or Theil-Sen through
    every timing within RATE_WINDOW of ``message_bytes`` where that holds two sizes and a rising line."""
    line = fit_linear(n[large], t[large])
    if message_bytes is None:
        return line, large, None
    near = large & (n >= message_bytes / RATE_WINDOW) & (n <= message_bytes * RATE_WINDOW)
    if near.sum() < 2:
        return line, large, None
    each_n = np.array([size for size, keep, times in zip(n, near, timings) if keep for _ in times])
    each_t = np.array([x for keep, times in zip(near, timings) if keep for x in times], dtype=float)
    fit = fit_theil_sen(each_n, each_t)
    if fit[1] <= 0:
        return line, large, None
    inside = n.min() <= message_bytes <= n.max()
    return fit, near, (fit[0] + fit[1] * message_bytes if inside else None)


def _time_at_run_size(probe: dict, name: str, message_bytes: float | None, n, t,
                      at_size: float | None) -> tuple[float | None, bool]:
    """(the time at the run's size, whether the probe timed that size): the run's own all-reduce timed
    after busy rests (its mean, at_size_time, stands for the run's), else the line's time there, else the
    medians interpolated when the probe's sizes span it."""
    timed = [times for size, precision, times in probe.get("at_size", [])
             if message_bytes is not None and name == f"allreduce_{precision}"
             and size == wire_bytes(message_bytes, precision)]
    if timed:
        return at_size_time(timed[0]), True
    if at_size is None and message_bytes is not None and n.min() <= message_bytes <= n.max():
        return float(np.interp(message_bytes, n, t)), False
    return at_size, False


def _launch_at_size(at_size: float, messages: int, alpha: float, bandwidth: float,
                    wire: float) -> tuple[float, float, float]:
    """(α, L, B) with which a collective's closed form passes through its time at the run's size, ``wire``
    its bytes beyond the bucket. What the form leaves of that time is the launch; where the line's rate
    leaves less than nothing, that rate contradicts the time at the run's size (two sizes' timings can
    make a steep slope), and the rate is the one that time implies, with no launch."""
    launch = at_size - messages * alpha - wire / bandwidth
    if launch < 0 and wire > 0 and at_size > messages * alpha:
        bandwidth, launch = wire / (at_size - messages * alpha), 0.0
    alpha, launch = _through(at_size, messages, wire / bandwidth, 1, alpha)
    return alpha, launch, bandwidth


def _fit_gather(point: dict, values: int, precision: str, times: list[float], burst: float, p: int) -> dict:
    """fit_links' ``allgather_<precision>``: the ring all-gather's form on the ping-pong's α and B
    (``point``), its launch what that form leaves of the timed round's mean."""
    sent = (p - 1) * gather_bytes(values, precision)  # what each rank's link carries in the ring
    at = at_size_time(times)
    alpha, launch = _through(at, p - 1, max(0.0, sent - burst) / point["bandwidth"], 1, point["alpha"])
    return {"alpha": alpha, "bandwidth": point["bandwidth"], "launch": launch, "launch_from": "run's size, timed",
            "values": values, "at_size": at, "ranks": p}


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
