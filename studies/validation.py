"""``python -m studies.validation``: every scheme predicted by syncsim against measured on the emulated network.

For each configuration (scheme, workers, link rate, model, one slowed worker or none):

1. calibrate here, under the configuration's own contention (real.testbed.calibration): link α, β and
   a collective's launch cost fitted on a testbed at that rate (an all-reduce over as many hosts as
   the run has workers, a ping-pong between two); compute time, its jitter and the backward's share timed
   with as many processes computing at once as the configuration has ranks; for a parameter server
   with several workers, how two colliding transfers of the gradient split a host's shaper, timed
   on a 3-host testbed (the server NIC's newcomer weight and sharing spread, syncsim.network); and for
   any parameter server, its own time per push and pull beyond its link, timed with one worker and no
   model (real.testbed.server_probe, Cluster.server_service);
2. predict: ``simulate`` on that Cluster and Workload, the slowed worker as its speed factor, every
   all-reduce a ring as gloo runs it (as_run_on_gloo);
3. measure: the executor runs the scheme for real on a testbed of world + servers hosts (a slowed worker
   sizing its sleep from the forward its compute probe timed, so both sleep alike);
4. compare, by one definition of every figure (syncsim.metrics) on both sides, and record how much the
   measured run's own step time wandered (measured_spread, syncsim.metrics.step_time_spread): the
   floor under the row's error on a machine whose speed drifts;
5. replay (a diagnostic, not a prediction): ``simulate`` once more with the run's own compute phases
   (``replayed_compute``) in place of the calibrated compute model, so that ``replayed_error`` is
   what the rest of the model (links, sharing, scheduling) misses once compute is exactly as it ran;
6. loss curves: the run's update log replayed on its model and data (real.replay, syncsim.convergence)
   predicts each worker's loss at each of its first LOSS_STEPS steps, compared with the losses the
   executor logged (``loss_rel_median``, ``loss_rel_max``: |replayed / logged - 1|).

The compressing schemes (PowerSGD, top-k, DiLoCo) are calibrated by the same rules: the compute probe
times the executor's step, their compressor's arithmetic and DiLoCo's outer step inside it, so the
workload leaves syncsim's compressor rates unset; the link probe times what the run sends (PowerSGD's
two all-reduces, top-k's all-gathers of indices and values, DiLoCo's pseudo-gradient); the workload has
the model's tensor shapes, so PowerSGD's rounds are the run's sizes. The sharded schemes (ZeRO, FSDP: not in
the default grid; name them with --schemes, two workers or more) are calibrated the same way, their compute
probe timing the executor's step under ZeroRedundancyOptimizer or FSDP2, and the all-reduce of their
gradient standing for their reduce-scatters and all-gathers (timed_size).

Writes ``OUT/validation.csv`` (one row per configuration; a failed one is a row with its reason),
``OUT/parity.png`` (drawn from the CSV alone), each run's real and simulated traces under
``OUT/runs/<configuration>/``, the calibrations under ``OUT/calibration/`` and, timed before the
first run, the machine's own steadiness (real.testbed.steadiness) as ``OUT/steadiness.json``. A rerun keeps the
finished rows and measures only the rest. Needs root and iproute2 (the testbed).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from studies.verdict import abs_stats, error_table, failed, loss_table, verdict_lines

__all__ = ["Config", "grid", "quick_grid", "main", "summary_lines", "plot", "COLUMNS", "loss_agreement"]

SCHEMES = ("allreduce", "allreduce:precision=fp16", "ps", "ps:mode=async", "ps:staleness=2", "localsgd:period=4")
WORLDS = (1, 2, 4)
BANDWIDTHS = ("50Mbit/s", "200Mbit/s", "1Gbit/s")
MODELS = ("mlp", "lenet")
# The schemes that trade bytes for steps (PowerSGD, top-k, DiLoCo) join the default grid as a few rows of
# their own, (schemes, worlds, bandwidths) for every model, without straggler rows: two workers at 200 Mbit/s,
# six rows. Each costs the grid about 10 s (a compute probe of its own, its collectives timed, a run), and the
# grid's 112 other rows take 25-27 of its 30 minutes; the compressed messages (2.7-34 kB) pass within a tbf
# bucket at every rate, so another rate adds time, not information. Both rates and stragglers are measured by
# naming them (--schemes, docs/real.md). A command line that names --schemes, --worlds or --bandwidths runs
# what it names.
COMPRESSED = ("allreduce:compression=powersgd,rank=4", "topk:ratio=0.01", "diloco:period=4")
EXTRA = ((COMPRESSED, (2,), ("200Mbit/s",)),)
# Each run's per-step loss is compared with its update log replayed (real.replay) over its first LOSS_STEPS
# steps (--loss-steps). The replay computes every gradient again, as long as the run's compute: 40 steps of
# two LeNet workers took 1.4 s here, four 2.8 s, one 0.6 s, the small model's 0.1-0.2 s, about 1.8 minutes
# over the default grid's rows, whose 25-27 minutes leave 3 of the half hour. 20 steps, half that, still
# cover where the compressing schemes' float32 drift shows (PowerSGD's from step 12, five DiLoCo outer steps).
LOSS_STEPS = 20
SLOW = 3.0  # the straggler rows' slowed worker computes this many times as long
STEPS = 40  # a multiple of every local-SGD period here, warm-up (a tenth) included: whole periods are timed
LONG_RUN, MIN_STEPS = 30.0, 20  # a run predicted to take longer than LONG_RUN seconds runs fewer steps
SHORT_RUN, MAX_STEPS = 2.0, 4000  # one predicted shorter than SHORT_RUN seconds runs more (at most MAX_STEPS)
# A measured run's step time is also timed over this many consecutive windows of its steps; their
# coefficient of variation (measured_spread) is how much this machine's speed wandered during the run.
SPREAD_WINDOWS = 4
# A prediction pools this many simulations of its configuration, each with its own seed: the draws of
# how colliding flows split a server's shaper (syncsim.network's sharing spread) and of compute jitter
# make one simulation a sample, whose step time varied by up to 13 % from seed to seed on the default
# grid (two SSP or asynchronous workers). The measured run is one sample; the prediction is the model's
# expectation.
PREDICTION_SEEDS = 8
BATCH = 32
QUICK_BATCH = 256
"""The quick preset's batch: every step milliseconds long. At 32 the one-worker step of the small model
is under a millisecond, where one burst of a shared machine decides the row (-16 % to -23 %, and 37 %
once, over CI runs, when the compute calibration still left out the executor's own bookkeeping)."""
# Seconds of real.testbed.steadiness at the study's start: how much this machine's own speed moves from
# one window to the next, quoted in the summary beside the errors (a minute of a 26-minute grid).
STEADINESS, QUICK_STEADINESS, MAX_STEADINESS = 60.0, 10.0, 600.0
KEY = ("scheme", "world", "servers", "bandwidth", "model", "slow")
COLUMNS = (*KEY, "steps", "run_steps", "batch_size", "predicted_step_time", "measured_step_time", "rel_error",
           "measured_spread", "dropped", "predicted_seed_cv", "predicted_speedup", "measured_speedup", "speedup_error",
           "predicted_staleness_mean", "measured_staleness_mean", "staleness_mean_error", "predicted_staleness_max",
           "measured_staleness_max", "staleness_distance", "compute_time", "jitter", "link_bandwidth", "link_alpha",
           "link_launch", "server_bandwidth", "server_alpha", "server_newcomer_weight", "server_sharing_spread",
           "server_service", "slow_forward", "link_at_size", "replayed_step_time", "replayed_error", "loss_steps",
           "loss_rel_median", "loss_rel_max", "wall_time", "error")


def is_baseline(scheme, world, slow):
    """Whether a configuration is the speedup baseline, one worker all-reducing at full speed; of a
    Config's fields or, elementwise, of a table's columns."""
    return (scheme == "allreduce") & (world == 1) & (slow == 1)


@dataclass(frozen=True)
class Config:
    """One configuration of the study; ``slow`` > 1 slows the last worker by that factor."""

    scheme: str
    world: int
    bandwidth: str
    model: str
    slow: float = 1.0

    def __post_init__(self) -> None:
        from real.config import MODELS as REAL_MODELS
        from real.testbed import TestbedConfig
        from syncsim.config import check_choice, check_float, check_int
        from syncsim.schemes import parse

        try:
            object.__setattr__(self, "scheme", str(parse(self.scheme)))
        except ValueError as err:
            raise ValueError(f"Config.scheme: {err}") from None
        object.__setattr__(self, "world", check_int("Config", "world", self.world, 1))
        try:  # a rate the testbed can shape
            TestbedConfig(bandwidth=self.bandwidth)
        except ValueError as err:
            raise ValueError(f"Config.bandwidth: {err}") from None
        check_choice("Config", "model", self.model, REAL_MODELS)
        object.__setattr__(self, "slow", check_float("Config", "slow", self.slow, low=1.0))

    @property
    def servers(self) -> int:
        """One parameter-server host for a scheme that pushes, none otherwise (read off its plan)."""
        from real.config import needs_servers

        return int(needs_servers(self.scheme))

    @property
    def ranks(self) -> int:
        return self.world + self.servers

    @property
    def link_hosts(self) -> int:
        """Hosts of this configuration's link probe: all-reduces run over the run's own workers (their
        chunks and their contention for the cores); pushes and pulls are point to point, which two time."""
        return 2 if self.servers else max(2, self.world)

    @property
    def baseline(self) -> bool:
        """One worker all-reducing at full speed: what every speedup of its model is measured against."""
        return bool(is_baseline(self.scheme, self.world, self.slow))

    @property
    def key(self) -> tuple:
        return (self.scheme, self.world, self.servers, self.bandwidth, self.model, float(self.slow))

    @property
    def name(self) -> str:
        from real.testbed.calibration import slug

        slow = f"-slow{self.slow:g}" if self.slow > 1 else ""
        return f"{slug(self.scheme)}-w{self.world}-{slug(self.bandwidth)}-{self.model}{slow}"


def grid(schemes=SCHEMES, worlds=WORLDS, bandwidths=BANDWIDTHS, models=MODELS, slow=SLOW, extra=EXTRA) -> list[Config]:
    """Every scheme × workers × rate × model, plus one straggler row per scheme and model (at the fewest
    workers from two up, and the middle rate) and the one-worker all-reduce each speedup is measured against;
    then, for every model, the rows of ``extra``: each (schemes, worlds, bandwidths) block's product, without
    straggler rows (EXTRA: the compressing schemes' few rows of the default grid).

    A one-worker run that sends nothing (no parameter server) is the same run at every rate, so it is
    run once, at the first rate; except the speedup baseline, which is run at every rate as repeats of
    one measurement, spread over its model's rows (the first before them, the last after them): every
    speedup of the model divides by it, and one 2-second run or compute probe that a slow spell of this
    machine catches decides them all (run 22: its small model's baseline ran 65 % slower than its probe,
    and the speedups' median error was 30.4 %). The speedups divide by the repeats' median (derive).
    """
    configs: list[Config] = []
    for model in models:
        rows: list[Config] = []
        for scheme in schemes:
            for world in worlds:
                for bandwidth in bandwidths:
                    config = Config(scheme, world, bandwidth, model)
                    if world == 1 and config.servers == 0:
                        config = dataclasses.replace(config, bandwidth=bandwidths[0])
                    if not config.baseline:
                        rows.append(config)
            several = [w for w in worlds if w >= 2]  # a straggler needs a peer to hold up
            if slow > 1 and several:
                rows.append(Config(scheme, min(several), bandwidths[len(bandwidths) // 2], model, slow))
        rows += [Config(scheme, world, bandwidth, model) for block_schemes, block_worlds, block_rates in extra
                 for scheme in block_schemes for world in block_worlds for bandwidth in block_rates]
        repeats = [Config("allreduce", 1, bandwidth, model) for bandwidth in bandwidths]
        spacing = len(rows) / max(1, len(repeats) - 1)
        for k, repeat in reversed(list(enumerate(repeats))):  # from the back: earlier positions stay put
            rows.insert(round(k * spacing), repeat)
        configs.extend(rows)
    unique = {c.key: c for c in configs}
    return list(unique.values())


@functools.cache
def model_bytes(model: str) -> float:
    """fp32 bytes of the parameters of real.models' ``model`` (the compute probe's ``layers``, summed)."""
    from real.models import build, param_layers

    return sum(param_layers(build(model, 0)))


@functools.cache
def model_shapes(model: str) -> tuple[tuple[int, ...], ...]:
    """real.models' ``model``'s parameter tensors' shapes (real.models.param_shapes): what the executor
    builds its plan with (PowerSGD views them as matrices), and so the simulator's Workload.shapes."""
    from real.models import build, param_shapes

    return param_shapes(build(model, 0))


@functools.cache
def _sync_action(scheme: str, model: str):
    from real.models import build, param_layers
    from syncsim.schemes import parse
    from syncsim.schemes.actions import (
        AllReduceGradients,
        AverageParameters,
        LowRankAllReduce,
        OuterStep,
        ReduceScatterGradients,
        SparseAllGather,
    )

    layers = param_layers(build(model, 0))
    policy = parse(scheme).policy(sum(layers), layers=layers, shapes=model_shapes(model))
    counts: dict = {}
    for step in range(STEPS):
        for action in policy.plan(step, STEPS):
            if isinstance(action, (AllReduceGradients, AverageParameters, LowRankAllReduce, SparseAllGather,
                                   OuterStep, ReduceScatterGradients)):
                counts[action] = counts.get(action, 0) + 1
    return max(counts, key=counts.get) if counts else None  # the first of the most frequent


def sync_action(config: Config):
    """The collective a run of ``config`` synchronises by, as real.executor plans it for the model's layers
    and tensor shapes (the most frequent over STEPS steps: a DiLoCo run's outer step at its own period, a
    streaming one's single fragment; a sharded run's reduce-scatter of the gradient); None for a run that
    sends nothing over the links between workers (a parameter server's traffic is point to point; one worker
    has no peer)."""
    if config.servers or config.world < 2:
        return None
    return _sync_action(config.scheme, config.model)


def message_bytes(config: Config) -> float:
    """What a run of ``config`` sends at once, the size its links' rate is read at: its gradient (or local SGD's
    parameters, a push, DiLoCo's pseudo-gradient, a sharded run's reduce-scatter and its all-gathers, each the
    whole gradient or parameters) at the scheme's wire precision; PowerSGD's larger round; the bytes each
    worker contributes to top-k's all-gather (indices and values)."""
    from syncsim.schemes import parse
    from syncsim.schemes.actions import LowRankAllReduce, OuterStep, SparseAllGather

    action = sync_action(config)
    if isinstance(action, LowRankAllReduce):
        return max(action.p_bytes, action.q_bytes)
    if isinstance(action, (SparseAllGather, OuterStep)):  # an outer step: its fragments' pseudo-gradients
        return action.nbytes
    return model_bytes(config.model) * parse(config.scheme).wire_ratio


def timed_size(config: Config) -> tuple[tuple[int, str], ...]:
    """((bytes, precision), ...) of the all-reduces a run of ``config`` sends a step, as its link probe times
    them (real.testbed.calibration.wire_bytes): its gradient's, local SGD's or DiLoCo's parameters', or
    PowerSGD's two rounds (P with the uncompressed values, then Q); () for a run that all-reduces nothing
    over the links (a parameter server's, one worker's, top-k's: timed_gather).

    A sharded run (ZeRO, FSDP) sends no all-reduce: the all-reduce of its gradient stands for its
    collectives, as a ring all-reduce is a reduce-scatter and an all-gather of the same size (each (p-1)
    hops of n/p), and the simulator prices its reduce-scatters and all-gathers on that fit, each with the
    fit's launch. A proxy: gloo does not run its reduce-scatter as half an all-reduce (on loopback here, two
    ranks, 4 MiB: reduce_scatter_single 7.3 ms, all_reduce 3.6 ms, all_gather_single 3.0 ms, medians of 15),
    so these rows' predictions read low until the link probe times a run's own reduce-scatter and
    all-gather (docs/memory.md, "Running sharded schemes for real")."""
    from real.testbed.calibration import wire_bytes
    from syncsim.schemes import parse
    from syncsim.schemes.actions import LowRankAllReduce, SparseAllGather

    action = sync_action(config)
    if action is None or isinstance(action, SparseAllGather):
        return ()
    precision = parse(config.scheme).precision
    if isinstance(action, LowRankAllReduce):
        rounds = [action.p_bytes] + ([action.q_bytes] if action.q_bytes else [])
        return tuple((wire_bytes(size, precision), precision) for size in rounds)
    return ((wire_bytes(message_bytes(config), precision), precision),)


def timed_gather(config: Config) -> tuple[tuple[int, str], ...]:
    """((values k, precision),) of the top-k exchange a run of ``config`` sends a step (an all-gather of k
    int32 indices, then one of k values), as its link probe times it; () for every other run."""
    from syncsim.schemes import parse
    from syncsim.schemes.actions import SparseAllGather

    action = sync_action(config)
    return ((action.values, parse(config.scheme).precision),) if isinstance(action, SparseAllGather) else ()


def sent_precisions(configs: list[Config]) -> tuple[str, ...]:
    """The wire precisions the schemes of ``configs`` send: the link probe's sweep times only these."""
    from syncsim.schemes import parse

    return tuple(sorted({parse(config.scheme).precision for config in configs}))


def quick_grid(slow: float = SLOW) -> list[Config]:
    """About 100 s with its calibration: the small model at one rate, two workers; synchronous and
    asynchronous PS, all-reduce."""
    return [Config("allreduce", 1, "200Mbit/s", "mlp"), Config("allreduce", 2, "200Mbit/s", "mlp"),
            Config("ps", 2, "200Mbit/s", "mlp"), Config("ps:mode=async", 2, "200Mbit/s", "mlp", slow)]


# -- one configuration ---------------------------------------------------------------
def calibrate(config: Config, args: argparse.Namespace):
    """The Cluster and Workload that describe ``config`` on this machine, and the measured values."""
    from real.testbed.calibration import (
        at_size_time,
        measure_compute,
        measure_link,
        measure_sharing,
        slug,
        wire_bytes,
    )
    from real.testbed.server_probe import fit_service, measure_server
    from syncsim import Cluster, Link, Workload
    from syncsim.schemes import parse

    folder = args.out / "calibration"
    spec = parse(config.scheme)
    # the executor's own step of this scheme without its communication (under autocast where amp=true),
    # with the last rank slowed as the run's last worker is in a straggler row
    compute = measure_compute(config.model, args.batch_size, config.world, folder, scheme=config.scheme,
                              slow=config.slow, repeat=slug(config.bandwidth) if config.baseline else "")
    # the links' rates around the size of what the run sends at once: the gradient at the wire precision
    message = message_bytes(config)
    # an all-reducing run's own all-reduces (PowerSGD's two rounds) and a top-k run's exchange are timed at
    # their sizes in the minute before it runs (measure_link's ``now`` and ``gathers``): the sweep is cached
    # from the study's start, and a collective that the cores rather than the shaper pace drifts with the
    # machine's load over the half hour a grid takes
    own, gathers = timed_size(config), timed_gather(config)
    measured = measure_link(config.bandwidth, folder, args.prefix, args.repeats, message_bytes=message,
                            hosts=config.link_hosts, now=own, precisions=sent_precisions(args.configs),
                            gathers=gathers)
    fits, burst = measured["fits"], measured["burst"]  # the testbed's links are tbf shapers with this bucket
    # The workers' link as the traffic they send sees it: a collective's rate (at the scheme's wire
    # precision, reduction included) for schemes that all-reduce, a point-to-point rate for pushes
    # and pulls (the same shaped veth; a collective's rate would charge them its reduction and rounds),
    # and for top-k's all-gather (no reduction: the ping-pong's α and B) with its own launch.
    sent = (fits["pingpong"] if config.servers else fits[f"allgather_{spec.precision}"] if gathers
            else fits[f"allreduce_{spec.precision}"])
    # The shaper's bucket refills at the shaper's own rate whatever rate a collective achieves through it
    # (a gloo all-reduce of a small model here: 25-57 MB/s, its reduction and rounds included, through a
    # 1 Gbit/s shaper); the ping-pong, one stream alone on the link, measures that rate in payload bytes
    # (118 MB/s at 1 Gbit/s: a 1514-byte frame carries 1448). A fitted collective rate above it (four
    # hosts' rings overlap their hops) leaves it at that rate.
    refill = max(fits["pingpong"]["bandwidth"], sent["bandwidth"])
    link = Link(bandwidth=sent["bandwidth"], latency=sent["alpha"], burst=burst, refill=refill)
    # A server's NIC carries concurrent pushes (and pulls) of the whole gradient: how two of them split
    # the shaper, measured at that size (real.testbed.calibration.measure_sharing), sets its weights.
    sharing = {"weight": 1.0, "spread": 0.0}
    if config.servers and config.world > 1:
        sharing = measure_sharing(config.bandwidth, folder, fits["pingpong"], burst, message, args.prefix,
                                  args.repeats)
    server_link = Link(bandwidth=fits["pingpong"]["bandwidth"], latency=fits["pingpong"]["alpha"], burst=burst,
                       newcomer_weight=sharing["weight"], sharing_spread=sharing["spread"])
    # What the server's protocol adds to each push and pull beyond that link (real.testbed.server_probe):
    # timed at the run's payload with one worker and no model, and fitted to the simulator's own price.
    service = 0.0
    if config.servers:
        size = wire_bytes(message, spec.precision)
        timed = measure_server(config.bandwidth, folder, size, spec.precision, args.prefix)
        service = fit_service(timed, fits["pingpong"]["alpha"], fits["pingpong"]["bandwidth"], burst, size)
    speed = None
    if config.slow > 1:  # the slowed worker computes for as long as the probe's slowed rank did: slow_speed
        speed = (1.0,) * (config.world - 1) + (slow_speed(compute),)
    cluster = Cluster.homogeneous(gpus=config.world, link=link, servers=config.servers,
                                  server_link=server_link if config.servers else None, server_service=service,
                                  speed=speed, jitter=compute["jitter"], collective_latency=sent["launch"],
                                  name="testbed")
    # The model's own tensor shapes, as the executor plans with them: PowerSGD's P and Q are its matrices'.
    # The compute probe timed the executor's whole step without its communication, a compressor's
    # arithmetic and DiLoCo's outer step included (they run inside the step): the compressors' own rates
    # stay unset (None), or the simulator would charge that work a second time.
    workload = Workload(param_bytes=sum(compute["layers"]), layers=tuple(compute["layers"]),
                        compute_time=compute["compute_time"], batch_size=args.batch_size,
                        backward_fraction=compute["backward_fraction"], idle_cost=compute["idle_cost"],
                        shapes=model_shapes(config.model), compress_flops=None, scan_rate=None, name=config.model)
    values = {"compute_time": workload.compute_time, "jitter": cluster.jitter, "link_bandwidth": link.bandwidth,
              "link_alpha": link.latency, "link_launch": cluster.collective_latency,
              "server_bandwidth": server_link.bandwidth,
              "server_alpha": server_link.latency, "server_newcomer_weight": server_link.newcomer_weight,
              "server_sharing_spread": server_link.sharing_spread, "server_service": service,
              # the forward the probe's slowed rank sized its sleep from, which the run is given (measure)
              "slow_forward": compute["slow_forward"] if config.slow > 1 else math.nan,
              # the run's collectives of a step as timed just before it (the trimmed means their forms pass
              # through, summed: PowerSGD's two rounds, top-k's exchange)
              "link_at_size": (sum(at_size_time(t) for _, _, t in measured["now"] + measured.get("gather_now", []))
                               if own or gathers else math.nan)}
    return cluster, workload, values


def as_run_on_gloo(scheme: str):
    """``scheme`` as the executor carries it out on gloo, which runs every all-reduce as a ring whatever
    algorithm is asked for (gloo/allreduce.cc: an unspecified algorithm is RING, and real.worker hands
    the spec's algorithm to NCCL only). ``auto`` would price NCCL's tuner choosing between ring and
    tree, a choice gloo never makes."""
    from syncsim.schemes import parse

    spec = parse(scheme)
    if getattr(spec, "algorithm", "ring") != "ring":
        spec = dataclasses.replace(spec, algorithm="ring")
    return spec


def slow_speed(compute: dict) -> float:
    """The speed factor of a worker run with ``--slow RANK:factor``: the others' step over the slowed
    rank's, both timed by the compute probe (measure_compute with ``slow``).

    real.executor makes that rank sleep (factor - 1) x COMPUTE_PER_FORWARD x a forward time (timed warm,
    once, by the probe's slowed rank, and given to the run: measure) between forward and backward, and a
    process computes slower right after a sleep than back to back: the small model's slowed step (factor 3)
    took 3.0-5.9 ms in the probe, where compute + that sleep computed from the others' times gives
    1.5-2.8 ms, and 3.8-6.4 ms in the grid's runs. So the slowed step is measured, not derived."""
    return compute["compute_time"] / compute["slowed_time"]


def run_steps(asked: int, predicted_run: float) -> int:
    """Steps to run: ``asked``, fewer when the run would be long, more when it would be short (a multiple
    of 4 either way, which keeps local SGD's averaging periods whole).

    A step of several hundred milliseconds is network-bound and varies little, so MIN_STEPS of them
    time it as well as forty, and the default grid stays within half an hour. A run shorter than
    SHORT_RUN (a one-worker step of the small model is under a millisecond) is lengthened to it: on a
    shared machine one burst of another process can fill a few tens of milliseconds."""
    if predicted_run > LONG_RUN and asked > MIN_STEPS:
        return max(MIN_STEPS, int(asked * LONG_RUN / predicted_run) // 4 * 4)
    if 0 < predicted_run < SHORT_RUN:
        return min(MAX_STEPS, -(-int(math.ceil(asked * SHORT_RUN / predicted_run)) // 4) * 4)
    return asked


def measure(config: Config, args: argparse.Namespace, folder: Path, steps: int, slow_forward: float | None = None):
    """Run ``config`` for real on a testbed of world + servers hosts; its steady state (syncsim.metrics),
    how much its step time wandered while it ran (syncsim.metrics.step_time_spread), how many packets
    the testbed's shapers dropped (Testbed.dropped: none, unless its queue is made shallower than QUEUE)
    and its trace (OUT/trace.csv, read once: the replay takes it too).

    A straggler row's slowed worker sizes its sleep from ``slow_forward``, the forward its compute probe
    timed (measure_compute's ``slow_forward``), so that it sleeps as long as the probe's slowed rank,
    whose step the simulator's speed factor is: each timing its own warm forward, a run's slowed worker of
    the larger model slept 25 ms a step where its probe's had slept 31-34 ms, and the local-SGD and fp16
    straggler rows were predicted 15.5 % and 11.4 % slow."""
    from real.config import RunConfig
    from real.interrupt import Interrupted
    from real.testbed import Testbed, run
    from syncsim.metrics import steady_state

    slow = ()
    if config.slow > 1:
        slow = ((config.world - 1, config.slow) + ((slow_forward,) if slow_forward is not None else ()),)
    cfg = RunConfig(scheme=config.scheme, world=config.world, servers=config.servers, model=config.model,
                    steps=steps, batch_size=args.batch_size, out=str(folder), slow=slow, timeout=120)
    with Testbed(hosts=cfg.ranks, bandwidth=config.bandwidth, prefix=args.prefix) as bed:
        # Started without torchrun's agents: half the processes on this machine's two cores, same ranks.
        code, message = run(bed, cfg, timeout=args.run_timeout, agent=False)
        dropped = None if code else bed.dropped()  # packets its shapers lost (none with the default QUEUE)
    if code > 128:  # interrupted (the launcher stopped the nodes and kept the record): the study stops too
        raise Interrupted(code - 128)
    if code:
        raise RuntimeError(message)
    trace = pd.read_csv(folder / "trace.csv")
    return (steady_state(trace, pd.read_csv(folder / "updates.csv"), args.batch_size, steps=steps,
                         workers=config.world),
            run_spread(trace, steps, config.world), dropped, trace)


def run_spread(trace: pd.DataFrame, steps: int, world: int) -> float:
    """A measured run's measured_spread: how much its step time wandered over SPREAD_WINDOWS windows."""
    from syncsim.metrics import step_time_spread

    return step_time_spread(trace, SPREAD_WINDOWS, steps=steps, workers=world)


def replayed_compute(trace: pd.DataFrame, steps: int, world: int) -> np.ndarray | None:
    """A measured run's compute as ``simulate(compute_times=)`` replays it: per (step, worker), seconds,
    the worker's time outside its communication — its compute phase, the gap since its previous phase
    ended (taking the pulled or averaged parameters in, the optimizer, the executor's bookkeeping: work
    the compute probe times as part of the step) — plus how much longer than that worker's median its
    push took to hand its bytes over (real.worker's push returns once the bytes are queued; a longer
    one is the process held up before they left, which the simulator's push does not know of). None
    when the trace lacks a compute phase."""
    phases = trace.sort_values(["worker", "start", "end"], kind="stable")
    ended = phases.groupby("worker")["end"].transform(lambda end: end.cummax().shift())
    gap = (phases["start"] - ended).clip(lower=0).fillna(0.0)
    computes = phases.assign(busy=phases["end"] - phases["start"] + gap)[phases["kind"] == "compute"]
    table = computes.pivot_table(index="step", columns="worker", values="busy", aggfunc="sum")
    table = table.reindex(index=range(steps), columns=range(world))
    if table.isna().to_numpy().any():
        return None
    pushes = trace[trace["kind"] == "push"]
    if len(pushes):
        held = (pushes["end"] - pushes["start"]).groupby([pushes["step"], pushes["worker"]]).sum().unstack()
        held = held.reindex(index=range(steps), columns=range(world))
        table = table + (held - held.median()).clip(lower=0).fillna(0.0)
    return table.to_numpy()


def replay(cluster, workload, scheme, trace: pd.DataFrame, steps: int, world: int) -> float:
    """The step time the simulator gives ``cluster`` and ``workload`` running ``scheme`` with the measured
    run's own compute (replayed_compute), PREDICTION_SEEDS seeds pooled as a prediction is; NaN when the
    trace lacks a compute phase, and for a run that communicates nothing (one worker, no server): its
    "collective" is local work the trace times apart, and there is no rest of the model to isolate."""
    from syncsim import simulate
    from syncsim.metrics import pooled_steady_state

    table = replayed_compute(trace, steps, world) if world > 1 or cluster.servers else None
    if table is None:
        return math.nan
    # with compute given, the seed draws only how colliding flows split a server's NIC: one seed does
    # when there are no servers or they split evenly (every seed would make the same run)
    drawn = cluster.servers and cluster.server_net.sharing_spread > 0
    runs = [simulate(cluster, workload, scheme, steps=steps, seed=seed, compute_times=table)
            for seed in range(PREDICTION_SEEDS if drawn else 1)]
    return pooled_steady_state([run.steady for run in runs]).step_time


def measured_losses(folder: Path) -> np.ndarray:
    """A real run's per-step losses, (steps, workers): each worker's minibatch loss at each step, as
    real.executor logs it (``losses`` in OUT/ranks/result-rank<r>.json; worker w is rank w)."""
    results = [json.loads(path.read_text()) for path in sorted((folder / "ranks").glob("result-rank*.json"))]
    workers = sorted((r for r in results if r.get("role") == "worker"), key=lambda r: r["rank"])
    if not workers or len({len(r["losses"]) for r in workers}) != 1:
        raise ValueError(f"measured_losses: {folder} holds no workers' losses, or losses of unequal lengths")
    return np.array([r["losses"] for r in workers], dtype=float).T


def replayed_losses(folder: Path, steps: int) -> np.ndarray:
    """The same losses predicted from the run's own schedule, (steps, workers) for its first ``steps`` steps:
    its update log (real.replay.load_log: which version each gradient read and was applied to, the plan
    built for the model's layers and shapes) replayed by syncsim.convergence on the run's model, initial
    weights, data order and learning rate (real.replay.TorchProblem), each worker's minibatch loss taken
    at the parameters its gradient is computed on (the replay's ``on_compute``: its replica, or the
    server version it read), rounded to float32 as the ranks hold them. The replay stops once every
    worker's first ``steps`` losses are taken."""
    import torch
    import torch.nn.functional as F

    from real.models import build
    from real.replay import TorchProblem, load_log
    from syncsim.convergence import Replayer

    config = json.loads((folder / "summary.json").read_text())["config"]
    problem = TorchProblem(model=config["model"], data=config["data"], seed=config["seed"])
    replayer = Replayer(load_log(folder), problem, lr=config["lr"], seed=config["seed"])
    net, dataset = build(config["model"], config["seed"]), problem.dataset
    steps = min(steps, config["steps"])
    losses = np.full((steps, config["world"]), np.nan)
    taken = [0]

    def on_compute(worker: int, step: int, x: np.ndarray) -> None:
        if step >= steps:
            return
        flat, offset = torch.from_numpy(np.asarray(x, dtype=np.float32)), 0
        with torch.no_grad():
            for param in net.parameters():
                param.copy_(flat[offset:offset + param.numel()].view_as(param))
                offset += param.numel()
            index = torch.as_tensor(replayer.sampler.indices(worker, step))
            losses[step, worker] = float(F.cross_entropy(net(dataset.x[index]), dataset.y[index]))
        taken[0] += 1

    replayer.run(on_version=lambda *_: taken[0] >= losses.size, on_compute=on_compute)
    return losses


def loss_agreement(measured: np.ndarray, replayed: np.ndarray) -> tuple[int, float, float]:
    """(steps compared, median, max) of |replayed / measured - 1| over every (step, worker) of ``replayed``'s
    steps: how closely the replay of a run's schedule predicts the losses the run logged. A pair where both
    are not finite (a diverged run, and its replay with it) is left out; one where only one is counts as
    infinitely apart. NaNs when nothing is left to compare."""
    steps = min(len(measured), len(replayed))
    real, predicted = measured[:steps], replayed[:steps]
    both = np.isfinite(real) & np.isfinite(predicted)
    kept = both | (np.isfinite(real) != np.isfinite(predicted))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(both, np.abs(predicted / real - 1), np.inf)[kept]
    if not len(rel):
        return steps, math.nan, math.nan
    return steps, float(np.median(rel)), float(rel.max())


def loss_figures(folder: Path, steps: int = LOSS_STEPS) -> dict:
    """A run's loss-curve columns: loss_steps, loss_rel_median, loss_rel_max (loss_agreement over its first
    ``steps`` steps; none compared, NaNs, when ``steps`` is 0)."""
    if steps <= 0:
        return {"loss_steps": 0, "loss_rel_median": math.nan, "loss_rel_max": math.nan}
    compared, median, top = loss_agreement(measured_losses(folder), replayed_losses(folder, steps))
    return {"loss_steps": compared, "loss_rel_median": median, "loss_rel_max": top}


def predict(first) -> tuple:
    """The prediction of a configuration whose simulation ``first`` (a SimResult, seed 0) is: the steady
    state of PREDICTION_SEEDS simulations of it pooled (syncsim.metrics.pooled_steady_state), and the
    coefficient of variation of their step times (how much the model itself varies from seed to seed)."""
    from syncsim import simulate
    from syncsim.metrics import pooled_steady_state

    runs = [first] + [simulate(first.cluster, first.workload, first.scheme, steps=first.steps, seed=seed)
                      for seed in range(first.seed + 1, first.seed + PREDICTION_SEEDS)]
    states = [run.steady for run in runs]
    times = np.array([state.step_time for state in states])
    return pooled_steady_state(states), float(times.std() / times.mean())


def evaluate(config: Config, args: argparse.Namespace) -> dict:
    """One row: calibrate, predict, measure, compare; a failure is a row with its reason."""
    from syncsim import simulate
    from syncsim.metrics import staleness_distance

    started = time.perf_counter()
    row: dict = dict(zip(KEY, config.key)) | {"steps": args.steps, "batch_size": args.batch_size}
    folder = args.out / "runs" / config.name
    try:
        cluster, workload, values = calibrate(config, args)
        row.update(values)
        scheme = as_run_on_gloo(config.scheme)
        result = simulate(cluster, workload, scheme, steps=args.steps, seed=0)
        steps = row["run_steps"] = run_steps(args.steps, result.makespan)
        if steps != args.steps:
            result = simulate(cluster, workload, scheme, steps=steps, seed=0)
        folder.mkdir(parents=True, exist_ok=True)
        result.trace.to_csv(folder / "sim-trace.csv", index=False)  # beside the real trace.csv, to compare
        result.updates.to_csv(folder / "sim-updates.csv", index=False)
        predicted, row["predicted_seed_cv"] = predict(result)
        forward = values.get("slow_forward", math.nan)  # what the probe's slowed rank sized its sleep from
        measured, row["measured_spread"], row["dropped"], trace = measure(
            config, args, folder, steps, slow_forward=None if math.isnan(forward) else forward)
        row.update(predicted_step_time=predicted.step_time, measured_step_time=measured.step_time,
                   predicted_throughput=predicted.throughput, measured_throughput=measured.throughput,
                   predicted_staleness_mean=predicted.staleness_mean,
                   measured_staleness_mean=measured.staleness_mean,
                   predicted_staleness_max=predicted.staleness_max, measured_staleness_max=measured.staleness_max,
                   staleness_distance=staleness_distance(predicted.staleness, measured.staleness), error="")
        row["replayed_step_time"] = replay(cluster, workload, scheme, trace, steps, config.world)
        # the run's own schedule replayed on its model and data: its logged losses, predicted step by step
        row.update(loss_figures(folder, args.loss_steps))
    except Exception as err:  # the study goes on; the row says why this configuration has no figures
        row["error"] = f"{type(err).__name__}: {err}".replace("\n", " ")[:500]
    row["wall_time"] = time.perf_counter() - started
    return row


def backfill_spread(rows: list[dict], configs: dict, out: Path, loss_steps: int = 0) -> list[dict]:
    """Finished rows measured before ``measured_spread`` existed get it from their run's kept trace
    (``OUT/runs/<configuration>/trace.csv``), and, with ``loss_steps``, rows measured before the loss
    curves were compared get that comparison from the run's kept outputs (loss_figures), so a resumed
    study reports every row's drift and losses without running anything again; a row whose run's files
    are gone keeps NaN."""
    for row in rows:
        config = configs.get(tuple(row[k] for k in KEY))
        if config is None:
            continue
        folder = out / "runs" / config.name
        trace = folder / "trace.csv"
        if pd.isna(row.get("measured_spread")) and trace.exists():
            row["measured_spread"] = run_spread(pd.read_csv(trace), int(row["run_steps"]), config.world)
        if loss_steps and pd.isna(row.get("loss_rel_max")) and (folder / "summary.json").exists():
            row.update(loss_figures(folder, loss_steps))
    return rows


# -- the table, its summary and its figure -------------------------------------------
def derive(frame: pd.DataFrame) -> pd.DataFrame:
    """Relative errors, and speedups over each model's one-worker all-reduce (measured and predicted alike):
    over the median of its repeats' throughputs (grid), each side's own."""
    frame = frame.copy()
    frame["rel_error"] = frame["predicted_step_time"] / frame["measured_step_time"] - 1
    baseline = is_baseline(frame["scheme"], frame["world"], frame["slow"])
    base = frame[baseline & ~failed(frame)].groupby("model")[["predicted_throughput", "measured_throughput"]].median()
    for side in ("predicted", "measured"):
        frame[f"{side}_speedup"] = frame[f"{side}_throughput"] / frame["model"].map(base[f"{side}_throughput"])
    # the baseline's repeats measure the denominator, not the model's speedup: no error to report
    frame["speedup_error"] = (frame["predicted_speedup"] / frame["measured_speedup"] - 1).where(~baseline)
    if "replayed_step_time" in frame:  # a table written before the study replayed its runs has none
        frame["replayed_error"] = frame["replayed_step_time"] / frame["measured_step_time"] - 1
    stale = frame["measured_staleness_mean"] > 0
    frame["staleness_mean_error"] = np.where(
        stale, frame["predicted_staleness_mean"] / frame["measured_staleness_mean"].where(stale) - 1, np.nan)
    return frame


def _recorded(frame: pd.DataFrame, column: str) -> pd.Series:
    """``column``'s values where rows have one; empty for a table written before the study recorded it."""
    return frame[column].dropna() if column in frame else pd.Series(dtype=float)


def repeatability(frame: pd.DataFrame) -> list[tuple[str, int, tuple[float, float], tuple[float, float]]]:
    """(model, runs, (fastest, slowest) measured step time, (fastest, slowest) compute probe) of each
    model's speedup baseline over its repeats (grid), where it has two or more: the same configuration
    measured and probed again minutes apart, identical but for the time it ran. How far apart they lie
    is how far apart two measurements of one compute-bound configuration can lie on this machine, what
    no prediction made before a run can do better than: a 2-core virtual machine whose processes run
    faster and slower by spells (7 repeats of the small model's baseline at 200 Mbit/s, run back to back:
    1.44-2.03 ms measured, 1.34-2.15 ms probed, with every phase of a slow run slow alike: docs/log.md)."""
    rows = frame[is_baseline(frame["scheme"], frame["world"], frame["slow"])]
    found = []
    for model, runs in rows.groupby("model", sort=False):
        measured, probed = runs["measured_step_time"].dropna(), _recorded(runs, "compute_time")
        if len(measured) >= 2 and len(probed) >= 2:
            found.append((str(model), len(measured), (float(measured.min()), float(measured.max())),
                          (float(probed.min()), float(probed.max()))))
    return found


def summary_lines(frame: pd.DataFrame, steadiness=None, default_keys: set | None = None,
                  wall_seconds: float | None = None) -> list[str]:
    """The study's figures: step time, speedup and staleness errors, and the three worst configurations;
    with ``steadiness`` (real.testbed.steadiness.Steadiness, timed at the study's start), how steady the
    machine's own speed was: the floor under every row's error that no model removes. Then the verdict on
    the targets (studies.verdict), which ``steadiness``, ``default_keys`` (the full default grid's
    configurations) and ``wall_seconds`` (the grid's wall time) decide whether the run can give, and
    the errors by scheme and link rate."""
    from syncsim.units import parse_bandwidth

    ok = frame[~failed(frame)]
    lines = []
    med, top, n = abs_stats(ok["rel_error"])
    lines.append(f"step time: median |error| {med:.1%}, max {top:.1%} over {n} configurations")
    if n:  # how many meet the targets' bounds, and where the misses are: by link rate, slowest first
        errors = ok["rel_error"].abs()
        by_link = sorted((parse_bandwidth(rate), rate, float(e.median()))
                         for rate, e in errors.groupby(ok["bandwidth"]))
        lines.append(f"step time: {int((errors <= 0.10).sum())} configurations within 10%, "
                     f"{int((errors <= 0.15).sum())} within 15%; median |error| by link "
                     + ", ".join(f"{rate} {median:.1%}" for _, rate, median in by_link))
    med, top, n = abs_stats(ok["speedup_error"])
    lines.append(f"speedup: median |error| {med:.1%}, max {top:.1%} over {n} configurations "
                 "(the one-worker baselines, the denominator, left out)")
    med, top, n = abs_stats(ok["staleness_mean_error"])
    if n:
        distance = ok.loc[ok["staleness_mean_error"].notna(), "staleness_distance"].median()
        within = int((ok["staleness_mean_error"].abs() <= 0.20).sum())
        lines.append(f"staleness mean: median |error| {med:.1%}, max {top:.1%} over {n} asynchronous or SSP "
                     f"configurations ({within} within 20%); median KS distance between the distributions "
                     f"{distance:.2f}")
    spread = _recorded(ok, "measured_spread")
    if len(spread):
        lines.append(f"measured step time wandered within its own run by a median {spread.median():.1%}, max "
                     f"{spread.max():.1%} (coefficient of variation over {SPREAD_WINDOWS} windows): the floor "
                     "below which a row's error is this machine's drift, not the model's")
    for model, runs, measured, probed in repeatability(ok):
        lines.append(f"repeatability: {model}'s one-worker baseline, run {runs} times, measured "
                     f"{measured[0] * 1e3:.2f}-{measured[1] * 1e3:.2f} ms ({measured[1] / measured[0] - 1:.0%} apart), "
                     f"its compute probes {probed[0] * 1e3:.2f}-{probed[1] * 1e3:.2f} ms "
                     f"({probed[1] / probed[0] - 1:.0%} apart): one configuration measured again on this machine")
    if steadiness is not None:
        lines.append(f"machine steadiness: {steadiness.line()}")
    dropped = _recorded(ok, "dropped")
    if len(dropped):  # a lost packet costs TCP a retransmission, up to a 200 ms timeout: not in the model
        lossy = dropped[dropped > 0]
        lines.append(f"the testbed's shapers dropped no packet in any of {len(dropped)} runs" if lossy.empty else
                     f"the testbed's shapers dropped packets in {len(lossy)} of {len(dropped)} runs "
                     f"(at most {int(lossy.max())} in one): steps there include TCP's recoveries")
    replayed = _recorded(ok, "replayed_error")
    if len(replayed):
        med, top, n = abs_stats(replayed)
        lines.append(f"replayed (each run's own compute phases in the simulator, a diagnostic, not a prediction): "
                     f"median |error| {med:.1%}, max {top:.1%} over {n} configurations: what the model "
                     "misses besides compute")
    compared = _recorded(ok, "loss_rel_max")
    if len(compared):  # the run's own losses against its schedule replayed (loss_figures)
        steps = int(ok.loc[compared.index, "loss_steps"].max())
        lines.append(f"loss curves: each run's logged per-step losses against its update log replayed on its model "
                     f"and data (real.replay), up to its first {steps} steps: |relative difference| median "
                     f"{ok.loc[compared.index, 'loss_rel_median'].median():.2g} (of the rows' medians), max "
                     f"{compared.max():.2g} over {len(compared)} configurations; by scheme below")
    seeds = _recorded(ok, "predicted_seed_cv")
    if len(seeds):
        lines.append(f"predicted step time varied from seed to seed by a median {seeds.median():.1%}, max "
                     f"{seeds.max():.1%} ({PREDICTION_SEEDS} simulations pooled per configuration)")
    worst = ok.reindex(ok["rel_error"].abs().sort_values(ascending=False).index).head(3)
    for _, r in worst.iterrows():
        lines.append(f"  worst: {r['scheme']} on {r['world']} workers, {r['bandwidth']}, {r['model']}"
                     + (f", slow {r['slow']:g}" if r["slow"] > 1 else "")
                     + f": predicted {r['predicted_step_time'] * 1e3:.1f} ms, measured "
                       f"{r['measured_step_time'] * 1e3:.1f} ms ({r['rel_error']:+.1%})")
    if failed(frame).any():
        lines.append(f"{int(failed(frame).sum())} configurations failed (their rows say why)")
    lines += verdict_lines(frame, steadiness, default_keys, KEY, wall_seconds)
    table = error_table(frame)
    if table:
        lines += ["step time |error| by scheme and link rate (median / max (rows)):"] + table
    table = loss_table(frame)
    if table:
        lines += ["loss curves, |replayed / logged loss - 1| by scheme (median of the rows' medians / max of their "
                  "maxima):"] + table
    return lines


def plot(csv: Path, out: Path) -> Path:
    """Predicted against measured step time, log axes, ±10 % band, one marker per scheme; from the CSV alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    data = data[~failed(data) & data["measured_step_time"].notna()]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    markers = "osD^v<>phX*"
    for i, (scheme, rows) in enumerate(data.groupby("scheme", sort=True)):
        ax.scatter(rows["measured_step_time"] * 1e3, rows["predicted_step_time"] * 1e3, label=scheme,
                   marker=markers[i % len(markers)], s=28, alpha=0.8)
    if len(data):
        low = min(data["measured_step_time"].min(), data["predicted_step_time"].min()) * 1e3 / 1.5
        high = max(data["measured_step_time"].max(), data["predicted_step_time"].max()) * 1e3 * 1.5
        line = np.geomspace(low, high, 50)
        ax.plot(line, line, color="black", lw=0.8)
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="±10 %")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title("syncsim against the emulated network")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = out / "parity.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -- the command line ----------------------------------------------------------------
FLAGS = {"scheme": "--schemes", "world": "--worlds", "bandwidth": "--bandwidths", "model": "--models",
         "slow": "--slow"}


def _items(flag: str, text: str, kind=str) -> tuple:
    """A comma-separated option's values, or ValueError naming the option. In ``--schemes`` a comma also
    separates a scheme's own options: an item ``key=value`` continues the scheme before it
    (``allreduce:amp=true,precision=fp16,ps`` is two schemes)."""
    items = [item.strip() for item in text.split(",")]
    if flag == "--schemes":
        joined: list[str] = []
        for item in items:
            if joined and "=" in item and ":" not in item:
                joined[-1] += "," + item
            else:
                joined.append(item)
        items = joined
    if not all(items):
        raise ValueError(f"{flag} must be a comma-separated list without empty items, got {text!r}")
    if kind is int:
        bad = [item for item in items if not item.isascii() or not item.isdigit()]
        if bad:
            raise ValueError(f"{flag} takes positive integers, got {bad[0]!r}")
        return tuple(int(item) for item in items)
    return tuple(items)


def configurations(args: argparse.Namespace) -> list[Config]:
    """The study's configurations, each checked (a bad value is refused naming its option)."""
    from real.config import RunConfig
    from syncsim.config import check_float

    try:
        check_float("Config", "slow", args.slow, low=1.0)  # also when no straggler row is made
        # the compressing schemes' own rows (EXTRA) belong to the default grid: a command line that names
        # its schemes, workers or rates runs what it names
        default = (args.schemes, args.worlds, args.bandwidths) == (SCHEMES, WORLDS, BANDWIDTHS)
        configs = quick_grid(args.slow) if args.quick else grid(args.schemes, args.worlds, args.bandwidths,
                                                                 args.models, args.slow, EXTRA if default else ())
    except ValueError as err:
        field = str(err).split(" ", 1)[0].removeprefix("Config.").split(":")[0]
        raise ValueError(f"{FLAGS.get(field, '--' + field)}: {err}") from None
    for config in configs:  # what the runs will be given, checked before any is started
        RunConfig(scheme=config.scheme, world=config.world, servers=config.servers, model=config.model,
                  steps=args.steps, batch_size=args.batch_size)
    return configs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from real.calibrate import MAX_REPEATS
    from real.testbed import TestbedConfig
    from real.testbed.launcher import MAX_RUN_TIMEOUT
    from syncsim.arguments import ArgumentParser, check_count, integer, number
    from syncsim.files import check_out_dir

    ap = ArgumentParser(prog="python -m studies.validation", description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default=",".join(SCHEMES),
                    help="comma-separated scheme specs; a scheme's own options continue it "
                         "(allreduce:compression=powersgd,rank=4,topk:ratio=0.01 is two schemes)")
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)), help="comma-separated worker counts")
    ap.add_argument("--bandwidths", default=",".join(BANDWIDTHS), help="comma-separated link rates")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated real.models names")
    ap.add_argument("--slow", type=number, default=SLOW, help="straggler rows' slowdown (1: no straggler rows)")
    ap.add_argument("--steps", type=integer, default=STEPS, help="steps per worker of a run (fewer for long runs)")
    ap.add_argument("--batch-size", type=integer, default=None,
                    help=f"per worker (default {BATCH}; {QUICK_BATCH} with --quick)")
    ap.add_argument("--repeats", type=integer, default=5, help="repeats per message size in the link probe")
    ap.add_argument("--loss-steps", type=integer, default=LOSS_STEPS,
                    help="compare each run's logged losses with its replayed schedule over this many first steps "
                         "(0: not compared)")
    ap.add_argument("--out", default="results/validation", help="output folder")
    ap.add_argument("--quick", action="store_true", help="four configurations of the small model (about 100 s)")
    ap.add_argument("--prefix", default="sstb", help="testbed namespace prefix")
    ap.add_argument("--run-timeout", type=number, default=300.0, help="seconds before a run is stopped")
    ap.add_argument("--steadiness", type=number, default=None,
                    help=f"seconds to time the machine's own steadiness first (default {STEADINESS:g}; "
                         f"{QUICK_STEADINESS:g} with --quick; 0: not timed)")
    args = ap.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = QUICK_BATCH if args.quick else BATCH
    if args.steadiness is None:
        args.steadiness = QUICK_STEADINESS if args.quick else STEADINESS
    try:
        args.out = check_out_dir(args.out)
        check_count("--steps", args.steps, 2)
        check_count("--repeats", args.repeats, 1, MAX_REPEATS)
        check_count("--loss-steps", args.loss_steps, 0, MAX_STEPS)
        if args.steadiness != 0 and not 2 <= args.steadiness <= MAX_STEADINESS:
            raise ValueError(f"--steadiness must be 0 (not timed) or 2 to {MAX_STEADINESS:g} seconds, "
                             f"got {args.steadiness:g}")
        if not 0 < args.run_timeout <= MAX_RUN_TIMEOUT:
            raise ValueError(f"--run-timeout must be in (0, {MAX_RUN_TIMEOUT:g}] seconds, got {args.run_timeout:g}")
        TestbedConfig(prefix=args.prefix)
        args.schemes, args.bandwidths, args.models = (_items(flag, getattr(args, flag[2:]))
                                                      for flag in ("--schemes", "--bandwidths", "--models"))
        args.worlds = _items("--worlds", args.worlds, int)
        args.configs = configurations(args)
    except ValueError as err:
        ap.error(str(err))
    return args


def measured_steadiness(args: argparse.Namespace, timed_now: bool):
    """The machine's steadiness (real.testbed.steadiness) timed now, on the study's smallest model at its
    batch, and kept as OUT/steadiness.json; when nothing is to run (a finished study resumed) or
    ``--steadiness 0``, the one kept, or None."""
    from real.testbed.steadiness import Steadiness, measure_steadiness
    from syncsim.files import write_atomic

    path = args.out / "steadiness.json"
    if timed_now and args.steadiness > 0:
        model = min({c.model for c in args.configs}, key=model_bytes)
        print(f"studies.validation: timing this machine's own steadiness for {args.steadiness:g} s "
              f"({model}, batch {args.batch_size})", file=sys.stderr)
        result = measure_steadiness(model, args.batch_size, args.steadiness)
        write_atomic(path, result.to_json())
        return result
    return Steadiness.from_json(path.read_text()) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from real.interrupt import Interrupted, raise_on_signals
    from real.testbed import unavailable
    from studies.common import write_csv
    from syncsim.arguments import fail

    args = parse_args(argv)
    reason = unavailable()
    if reason:
        return fail("studies.validation", reason)
    raise_on_signals()  # SIGINT/SIGTERM unwind through each Testbed's __exit__, which removes the namespaces
    configs = args.configs
    csv = args.out / "validation.csv"
    rows = []
    if csv.exists():  # resume: finished rows stay, failed ones are tried again
        old = pd.read_csv(csv, keep_default_na=False, na_values=[""])
        old = old[~failed(old) & (old["steps"] == args.steps) & (old["batch_size"] == args.batch_size)]
        rows = backfill_spread(old.to_dict("records"), {c.key: c for c in configs}, args.out, args.loss_steps)
    done = {tuple(r[k] for k in KEY) for r in rows}
    todo = [c for c in configs if c.key not in done]
    started = time.perf_counter()

    def save() -> None:
        write_csv(derive(pd.DataFrame(rows)).reindex(columns=[*COLUMNS, "predicted_throughput",
                                                              "measured_throughput"]), csv)

    if rows and not todo:
        save()  # nothing to run: the resumed rows, with any drift filled in from their traces
    try:
        steadiness = measured_steadiness(args, timed_now=bool(todo))
        for config in tqdm(todo, desc="validation", unit="run", dynamic_ncols=True):
            rows.append(evaluate(config, args))
            save()
    except Interrupted as err:
        print(f"studies.validation: interrupted by {err.name}; finished rows are in {csv}, a rerun resumes",
              file=sys.stderr)
        return err.exit_code
    wanted = {c.key for c in configs}
    frame = pd.read_csv(csv, keep_default_na=False, na_values=[""]) if rows else pd.DataFrame(columns=COLUMNS)
    frame = frame[[tuple(r) in wanted for r in frame[list(KEY)].itertuples(index=False, name=None)]]
    figure = plot(csv, args.out)
    # the grid's own wall time: every row's (calibration, prediction, run) and the steadiness timing
    wall = float(frame["wall_time"].sum()) + (len(steadiness.step_times) * steadiness.window if steadiness else 0.0)
    for line in summary_lines(frame, steadiness, default_keys={c.key for c in grid()}, wall_seconds=wall):
        print(f"studies.validation: {line}")
    print(f"studies.validation: wrote {csv} and {figure} ({len(todo)} runs in "
          f"{time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
