"""A configuration calibrated on this machine, under its own contention: the syncsim Cluster and Workload
that describe it, from real.calibration's probes (compute, links, a server NIC's sharing, a parameter
server's own time per request, how long a sharded step's gloo collectives keep the links busy)."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from real.validation.config import Config, model_shapes
from real.validation.settings import Settings
from real.validation.traffic import message_bytes, steps_per_sync, sync_action, timed_gather, timed_size

if TYPE_CHECKING:
    from syncsim import Cluster, Link, Workload

__all__ = ["Calibration", "Links", "calibrate", "calibrate_links", "shared_host", "slow_speed"]


class Links(NamedTuple):
    """The links a configuration's traffic crosses, as fitted at its sizes: the workers' (``worker``, with
    ``launch``, a collective's own cost), the parameter server's NIC (``server``) and the server's time per
    push or pull beyond it (``service``); ``at_size``, the run's own collectives of a step timed just
    before it (NaN when it sends none over the links); ``duplex``, how much longer a push into the server
    took while the server sent a reply (the mean of the sharing probe's turns, whose sample the server's
    Link.crossing_stretch draws from; NaN without a server's sharing probe); ``exit_spread``, how long
    before the last rank the first left those collectives (the mean over their timings, and over a
    step's collectives' means; NaN with ``at_size``): a rank that leaves first starts its next step
    first (the Cluster's exit_spread)."""

    worker: Link
    launch: float
    server: Link
    service: float
    at_size: float
    duplex: float
    exit_spread: float


class Calibration(NamedTuple):
    """What calibrate gives: the Cluster and Workload to simulate, and the measured values a row records."""

    cluster: Cluster
    workload: Workload
    values: dict


def calibrate(config: Config, settings: Settings) -> Calibration:
    """The Cluster and Workload that describe ``config`` on this machine, and the measured values."""
    from real.calibration.cache import slug
    from real.calibration.compute_probe import measure_scheme_compute

    folder = settings.out / "calibration"
    # the executor's own step of this scheme without its communication (under autocast where amp=true),
    # with the last rank slowed as the run's last worker is in a straggler row
    compute = measure_scheme_compute(config.model, settings.batch_size, config.world, folder, scheme=config.scheme,
                              slow=config.slow, repeat=slug(config.bandwidth) if config.baseline else "")
    # the run's own collectives are timed with each rank computing afterwards what it computes before its
    # next: a lone rank's step (its core's time; sharing the cores slows it in the probe as in the run)
    timed = timed_size(config) or timed_gather(config)  # a run's own collectives, which the link probe times
    alone = lone_compute(config, settings) if timed and config.world > 1 else compute
    links = calibrate_links(config, settings, folder, after=alone["compute_time"] * steps_per_sync(config))
    workload = _workload(config, compute, settings.batch_size)
    cluster = _cluster(config, compute, links, meeting_jitter(config, compute))
    cluster = cluster.replace(**sharded_traffic(config, settings, folder, cluster, workload))
    values = {"compute_time": workload.compute_time, "jitter": cluster.jitter, "probe_jitter": compute["jitter"],
              "meeting_excess": _or_nan(compute.get("meeting_excess")), "link_bandwidth": links.worker.bandwidth,
              "link_alpha": links.worker.latency, "link_launch": cluster.collective_latency,
              "server_bandwidth": links.server.bandwidth,
              "server_alpha": links.server.latency, "server_newcomer_weight": links.server.newcomer_weight,
              "server_sharing_spread": links.server.sharing_spread, "server_service": links.service,
              "server_duplex_stretch": links.duplex,
              "reducescatter_traffic": cluster.reducescatter_traffic, "allgather_traffic": cluster.allgather_traffic,
              # the forward the probe's slowed rank sized its sleep from, which the run is given (measure)
              "slow_forward": compute["slow_forward"] if config.slow > 1 else math.nan,
              "link_at_size": links.at_size, "link_exit_spread": links.exit_spread}
    return Calibration(cluster, workload, values)


def calibrate_links(config: Config, settings: Settings, folder: Path, after: float = 0.0) -> Links:
    """The links' rates around the size of what the run sends at once: the gradient at the wire precision;
    the run's own collectives, timed in the minute before it, are each followed by ``after`` seconds of
    busy ranks (what the run computes between its collectives: measure_link's ``after``)."""
    from real.calibration.link_fit import at_size_time
    from real.calibration.link_probe import measure_link
    from syncsim import Link
    from syncsim.schemes import parse

    message = message_bytes(config)
    # an all-reducing run's own all-reduces (PowerSGD's two rounds) and a top-k run's exchange are timed at
    # their sizes in the minute before it runs (measure_link's ``now`` and ``gathers``): the sweep is cached
    # from the study's start, and a collective that the cores rather than the shaper pace drifts with the
    # machine's load over the half hour a grid takes
    own, gathers = timed_size(config), timed_gather(config)
    measured = measure_link(config.bandwidth, folder, settings.prefix, settings.repeats, message_bytes=message,
                            hosts=config.link_hosts, now=own, precisions=settings.precisions, gathers=gathers,
                            after=after, keep=config.name)
    fits, burst = measured["fits"], measured["burst"]  # the testbed's links are tbf shapers with this bucket
    # The workers' link as the traffic they send sees it: a collective's rate (at the scheme's wire
    # precision, reduction included) for schemes that all-reduce, a point-to-point rate for pushes
    # and pulls (the same shaped veth; a collective's rate would charge them its reduction and rounds),
    # and for top-k's all-gather (no reduction: the ping-pong's α and B) with its own launch.
    precision = parse(config.scheme).precision
    sent = (fits["pingpong"] if config.servers else fits[f"allgather_{precision}"] if gathers
            else fits[f"allreduce_{precision}"])
    # The shaper's bucket refills at the shaper's own rate whatever rate a collective achieves through it
    # (a gloo all-reduce of a small model here: 25-57 MB/s, its reduction and rounds included, through a
    # 1 Gbit/s shaper); the ping-pong, one stream alone on the link, measures that rate in payload bytes
    # (118 MB/s at 1 Gbit/s: a 1514-byte frame carries 1448). A fitted collective rate above it (four
    # hosts' rings overlap their hops) leaves it at that rate.
    refill = max(fits["pingpong"]["bandwidth"], sent["bandwidth"])
    link = Link(bandwidth=sent["bandwidth"], latency=sent["alpha"], burst=burst, refill=refill)
    server, duplex = _server_link(config, settings, folder, fits["pingpong"], burst, message)
    service = _server_service(config, settings, folder, fits["pingpong"], burst, message)
    # the run's collectives of a step as timed just before it (the trimmed means their forms pass through,
    # summed: PowerSGD's two rounds, top-k's exchange)
    at_size = (sum(at_size_time(t) for _, _, t in measured["now"] + measured.get("gather_now", []))
               if own or gathers else math.nan)
    exits = [spreads for _, _, spreads in measured.get("exits_now", [])]
    exit_spread = (statistics.fmean(statistics.fmean(max(s) for s in spreads) for spreads in exits)
                   if (own or gathers) and exits and all(exits) else math.nan)
    return Links(link, sent["launch"], server, service, at_size, duplex, exit_spread)


def _server_link(config: Config, settings: Settings, folder: Path, pingpong: dict, burst: float,
                 message: float) -> tuple[Link, float]:
    """A server's NIC carries concurrent pushes (and pulls) of the whole gradient: how two of them split
    the shaper, measured at that size (real.calibration.sharing_probe.measure_sharing), sets its weights,
    and pushes timed while it replies to another worker its crossing stretch; the flows' congestion window
    at that size, read while three pushes cross a reply (real.testbed.window), its window; the stretches'
    mean beside it (NaN where the probe did not run)."""
    from real.calibration.sharing_probe import measure_sharing
    from real.testbed.window import measure_window
    from syncsim import Link

    sharing = {"weight": 1.0, "spread": 0.0, "duplex_stretch": math.nan, "duplex_stretches": []}
    window = 0.0
    if config.servers and config.world > 1:
        sharing = measure_sharing(config.bandwidth, folder, pingpong, burst, message, settings.prefix,
                                  settings.repeats)
        # a reply's acknowledgements wait behind the pushes coming in: it sends a window per queueing delay
        window = measure_window(config.bandwidth, folder, message, settings.prefix)["window"]
    link = Link(bandwidth=pingpong["bandwidth"], latency=pingpong["alpha"], burst=burst,
                newcomer_weight=sharing["weight"], sharing_spread=sharing["spread"],
                crossing_stretch=tuple(max(1.0, s) for s in sharing["duplex_stretches"]), window=window)
    return link, sharing["duplex_stretch"]


def _server_service(config: Config, settings: Settings, folder: Path, pingpong: dict, burst: float,
                    message: float) -> float:
    """What the server's protocol adds to each push and pull beyond its link (real.calibration.server_probe):
    timed at the run's payload with one worker and no model, and fitted to the simulator's own price; 0
    without a server."""
    from real.calibration.messages import wire_bytes
    from real.calibration.server_fit import fit_service
    from real.calibration.server_probe import measure_server
    from syncsim.schemes import parse

    if not config.servers:
        return 0.0
    precision = parse(config.scheme).precision
    size = wire_bytes(message, precision)
    timed = measure_server(config.bandwidth, folder, size, precision, settings.prefix)
    return fit_service(timed, pingpong["alpha"], pingpong["bandwidth"], burst, size)


def sharded_traffic(config: Config, settings: Settings, folder: Path, cluster: Cluster, workload: Workload) -> dict:
    """The Cluster's ``reducescatter_traffic`` and ``allgather_traffic`` for a sharded run of ``config`` on
    more than one worker: the step's own gloo collectives timed on the testbed (real.calibration.sharded_probe),
    their trimmed means fitted through the simulator's price on the run's link and launch; {} for any other
    run (NCCL's ring, 1, stands)."""
    from real.calibration.link_fit import at_size_time
    from real.calibration.sharded_fit import KINDS, fit_traffic
    from real.calibration.sharded_probe import measure_sharded
    from real.validation.prediction import as_run_on_gloo
    from syncsim.schemes.actions import ReduceScatterGradients

    if config.world < 2 or not isinstance(sync_action(config), ReduceScatterGradients):
        return {}
    timed = measure_sharded(config.bandwidth, folder, config.scheme, config.model, config.world, settings.prefix)
    return fit_traffic({kind: at_size_time(timed[kind]) for kind in KINDS}, cluster.replace(speed=None),
                       workload, str(as_run_on_gloo(config.scheme)))


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def meeting_jitter(config: Config, compute: dict) -> float:
    """The jitter to simulate ``config``'s workers with: where they meet at collectives, the one whose
    slowest draw over a meeting's steps lies as far above the mean as the compute probe's slowest rank did
    (syncsim.compute.jitter_for_slowest of its meeting_excess); the probe's own spread of steps where they
    do not meet, and for a straggler row (its slowed rank is priced by its speed factor, and the ranks left
    are too few to say how late the slowest is). On a grid of 2026-12-07 with the probe's spread, the
    four-worker collective rows at 1 Gbit/s came out +6 … +26 % slow, and -5 … +10 % simulated again with
    no spread at all: the slowest of four independent draws is later than the slowest of four ranks
    taking turns at two cores."""
    from syncsim.compute import jitter_for_slowest

    excess = compute.get("meeting_excess")
    if excess is None or config.slow > 1 or config.world < 2:
        return compute["jitter"]
    return jitter_for_slowest(excess, config.world, max(1, round(steps_per_sync(config))))


def _cluster(config: Config, compute: dict, links: Links, jitter: float) -> Cluster:
    from syncsim import Cluster

    speed = None
    if config.slow > 1:  # the slowed worker computes for as long as the probe's slowed rank did: slow_speed
        speed = (1.0,) * (config.world - 1) + (slow_speed(compute),)
    return Cluster.homogeneous(gpus=config.world, link=links.worker, servers=config.servers,
                               server_link=links.server if config.servers else None, server_service=links.service,
                               speed=speed, jitter=jitter, collective_latency=links.launch,
                               name="testbed")


def shared_host(cluster: Cluster, values: dict, config: Config | None = None,
                settings: Settings | None = None) -> Cluster:
    """``cluster`` (a row's calibrated Cluster, ``values`` its measured values) as one host whose cores the
    ranks share (syncsim.host): this process's cores, and the spread with which the row's own collectives
    let their ranks go (``link_exit_spread``; none where it timed no collective). Given the row's
    ``config`` and ``settings``, also the contention its compute probe measured (host_contention of the
    row's ``compute_time``). A diagnostic (repredict --host), not the study's prediction: see real.md's
    known limits."""
    spread = values.get("link_exit_spread", math.nan)
    cores = len(os.sched_getaffinity(0))
    contention = (host_contention(config, settings, cores, values["compute_time"])
                  if config is not None and settings is not None else None)
    return cluster.replace(host_cores=cores, exit_spread=spread if spread > 0 else 0.0, host_contention=contention)


def host_contention(config: Config, settings: Settings, cores: int, together: float) -> float | None:
    """How many times longer a rank's step of ``config``'s scheme took with all of its workers computing at
    once (``together``: the row's compute probe, its compute_time) than alone (lone_compute), when its
    workers outnumber ``cores``; None otherwise. Never below 1."""
    if config.world <= cores:
        return None
    return max(1.0, together / lone_compute(config, settings)["compute_time"])


def lone_compute(config: Config, settings: Settings) -> dict:
    """The compute probe of one rank alone doing a worker's step of ``config``'s scheme: a step's work in a
    core's time. Never the speedup baseline's repeats (labelled by rate), each of which must be timed just
    before its own run: a row of several workers that took one first left it timed up to a quarter of an
    hour before that run (2026-12-07)."""
    from real.calibration.compute_probe import measure_scheme_compute

    return measure_scheme_compute(config.model, settings.batch_size, 1, settings.out / "calibration",
                                  scheme=config.scheme)


def _workload(config: Config, compute: dict, batch_size: int) -> Workload:
    """The model's own tensor shapes, as the executor plans with them: PowerSGD's P and Q are its matrices'.
    The compute probe timed the executor's whole step without its communication, a compressor's
    arithmetic and DiLoCo's outer step included (they run inside the step): the compressors' own rates
    stay unset (None), or the simulator would charge that work a second time."""
    from syncsim import Workload

    return Workload(param_bytes=sum(compute["layers"]), layers=tuple(compute["layers"]),
                    compute_time=compute["compute_time"], batch_size=batch_size,
                    backward_fraction=compute["backward_fraction"], idle_cost=compute["idle_cost"],
                    shapes=model_shapes(config.model), compress_flops=None, scan_rate=None, name=config.model)


def slow_speed(compute: dict) -> float:
    """The speed factor of a worker run with ``--slow RANK:factor``: the others' step over the slowed
    rank's, both timed by the compute probe (measure_compute with ``slow``).

    real.executor makes that rank sleep (factor - 1) x COMPUTE_PER_FORWARD x a forward time (timed warm,
    once, by the probe's slowed rank, and given to the run: measure) between forward and backward, and a
    process computes slower right after a sleep than back to back: the small model's slowed step (factor 3)
    took 3.0-5.9 ms in the probe, where compute + that sleep computed from the others' times gives
    1.5-2.8 ms, and 3.8-6.4 ms in the grid's runs. So the slowed step is measured, not derived."""
    return compute["compute_time"] / compute["slowed_time"]
