"""A configuration predicted: ``simulate`` on its calibrated Cluster and Workload as gloo runs it, pooled
over seeds; how many steps its run takes; and the replay, a diagnostic that simulates the measured run
again with its own compute phases."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from syncsim.schemes.actions import AllGatherParameters, ReduceScatterGradients

if TYPE_CHECKING:
    from syncsim.metrics import SteadyState

__all__ = ["Prediction", "PREDICTION_SEEDS", "LONG_RUN", "MIN_STEPS", "SHORT_RUN", "MAX_STEPS", "as_run_on_gloo",
           "run_steps", "predict", "replayed_compute", "replay", "DRAWN", "untailed", "predict_drawn"]

# A prediction pools this many simulations of its configuration, each with its own seed: the draws of
# how colliding flows split a server's shaper (syncsim.network's sharing spread), of where the pushes
# start in the crossing stretches' sample (syncsim.server) and of compute jitter make one simulation a
# sample, whose step time varied by up to 12 % from seed to seed on the default grid (two asynchronous
# or SSP workers falling in and out of turns). The measured run is one sample; the prediction is the
# model's expectation, which 32 seeds pin to about 2 % where 8 left 4 % (12 %/sqrt(n)): re-predicted
# with 8, one grid's rows of such pairs moved by up to 8 % with nothing but the seeds' offset changed.
PREDICTION_SEEDS = 32
LONG_RUN, MIN_STEPS = 30.0, 20  # a run predicted to take longer than LONG_RUN seconds runs fewer steps
SHORT_RUN, MAX_STEPS = 2.0, 4000  # one predicted shorter than SHORT_RUN seconds runs more (at most MAX_STEPS)


class Prediction(NamedTuple):
    """The pooled steady state of PREDICTION_SEEDS simulations, and the coefficient of variation of their
    step times (how much the model itself varies from seed to seed)."""

    steady: SteadyState
    seed_cv: float


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


def predict(first) -> Prediction:
    """The prediction of a configuration whose simulation ``first`` (a SimResult, seed 0) is: the steady
    state of PREDICTION_SEEDS simulations of it pooled (syncsim.metrics.pooled_steady_state), and the
    coefficient of variation of their step times (how much the model itself varies from seed to seed)."""
    from syncsim import simulate

    runs = [first] + [simulate(first.cluster, first.workload, first.scheme, steps=first.steps, seed=seed)
                      for seed in range(first.seed + 1, first.seed + PREDICTION_SEEDS)]
    return _pooled(runs)


def _pooled(runs) -> Prediction:
    """``runs`` (SimResults of one configuration, one per seed) as a Prediction: their steady states pooled
    and the coefficient of variation of their step times."""
    from syncsim.metrics import pooled_steady_state

    states = [run.steady for run in runs]
    times = np.array([state.step_time for state in states])
    return Prediction(pooled_steady_state(states), float(times.std() / times.mean()))


def replayed_compute(trace: pd.DataFrame, steps: int, world: int) -> np.ndarray | None:
    """A measured run's compute as ``simulate(compute_times=)`` replays it: per (step, worker), seconds,
    the worker's time outside its communication — its compute phase, the gap since its previous phase
    ended (taking the pulled or averaged parameters in, the optimizer, the executor's bookkeeping: work
    the compute probe times as part of the step) — plus how much longer than that worker's median its
    push took to hand its bytes over (real.worker's push returns once the bytes are queued; a longer
    one is the process held up before they left, which the simulator's push does not know of). None
    when the trace lacks a compute phase.

    A compute phase that a sharded step's collectives run inside (FSDP's and ZeRO-3's gathers and
    reduce-scatters are issued from the forward's and backward's hooks, so the executor's compute row
    spans them) counts without the time they cover, as the compute probe times such a step
    (real.calibration.compute_probe: the step less its collectives' spans; docs/log.md, "The compressor's
    work and a sharded step's collectives in the replay"). Only those: an overlapped all-reduce's row
    starts inside the backward's too, but the backward goes on computing beside it, and the probe times
    that backward whole."""
    phases = trace.sort_values(["worker", "start", "end"], kind="stable")
    ended = phases.groupby("worker")["end"].transform(lambda end: end.cummax().shift())
    gap = (phases["start"] - ended).clip(lower=0).fillna(0.0)
    own = (phases["end"] - phases["start"]).where(phases["kind"] != "compute", _outside_nested(phases))
    computes = phases.assign(busy=own + gap)[phases["kind"] == "compute"]
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


SHARDED_KINDS = (AllGatherParameters.kind, ReduceScatterGradients.kind)
"""Trace kinds of the collectives a sharded step issues from within its compute (top-k's all-gather shares
the kind but follows the compute: it never lies inside it)."""


def _outside_nested(phases: pd.DataFrame) -> pd.Series:
    """Each compute row's seconds not covered by its worker's SHARDED_KINDS rows inside it (as the compute
    probe takes a step's collectives off it: compute_probe.within, overlapping rows counted once); NaN for
    the other rows."""
    from real.calibration.compute_probe import within

    own = pd.Series(np.nan, index=phases.index)
    for _, rows in phases.groupby("worker", sort=False):
        starts, ends, kinds = (rows[c].to_numpy() for c in ("start", "end", "kind"))
        sharded = np.flatnonzero(np.isin(kinds, SHARDED_KINDS))
        for i in np.flatnonzero(kinds == "compute"):
            inside = sharded[(ends[sharded] > starts[i]) & (starts[sharded] < ends[i])]
            spans = zip(starts[inside].tolist(), ends[inside].tolist())
            own[rows.index[i]] = ends[i] - starts[i] - within(spans, starts[i], ends[i])
    return own


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


# predict_drawn's diagnostics: the run's own compute phases as a distribution, with or without its tail
# (real.testbed.preemption's: over its TAIL times the median).
DRAWN = ("drawn", "drawn-untailed")
WARMUP_STEPS = 2  # a run's first steps (the first pull, allocations) are not of its distribution


def untailed(sample: np.ndarray) -> np.ndarray:
    """``sample`` with every value in its tail (real.testbed.preemption.in_tail) replaced by its median."""
    from real.testbed.preemption import in_tail

    return np.where(in_tail(sample), float(np.median(sample)), sample)


def predict_drawn(cluster, workload, scheme, trace: pd.DataFrame, steps: int, world: int,
                  mode: str = "drawn") -> Prediction | None:
    """A diagnostic prediction whose compute is each (step, worker)'s time drawn at random, independently,
    from that worker's own compute phases in the measured run (replayed_compute after WARMUP_STEPS; with
    ``mode="drawn-untailed"`` its tail replaced by the median) instead of the probe's lognormal, pooled
    over PREDICTION_SEEDS seeds as predict pools them. Beside replay, which keeps the phases in the order
    they ran, it tells whether a row's miss is in the compute's distribution alone. None when the trace
    lacks a compute phase, and for a run that communicates nothing (as replay)."""
    from syncsim import simulate

    if mode not in DRAWN:
        raise ValueError(f"predict_drawn: mode must be one of {', '.join(DRAWN)}; got {mode!r}")
    table = replayed_compute(trace, steps, world) if world > 1 or cluster.servers else None
    if table is None or steps <= WARMUP_STEPS:
        return None
    samples = [table[WARMUP_STEPS:, worker] for worker in range(world)]  # a straggler stays one
    if mode == "drawn-untailed":
        samples = [untailed(sample) for sample in samples]

    def drawn(seed: int) -> np.ndarray:
        rng = np.random.default_rng([seed, steps])
        return np.column_stack([rng.choice(sample, size=len(table)) for sample in samples])

    return _pooled([simulate(cluster, workload, scheme, steps=steps, seed=seed, compute_times=drawn(seed))
                    for seed in range(PREDICTION_SEEDS)])
