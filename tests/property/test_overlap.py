"""The overlapped, bucketed all-reduce's step time, computed exactly by an independent schedule.

The reference below is a brute-force timeline, written without the simulator's
code: backward walks the layers in reverse order, each taking time in
proportion to its bytes; a DDP bucket is ready when its last layer's gradient
is; buckets are all-reduced one after another on a single stream (NCCL's one
stream per communicator), each starting at the later of its readiness and the
previous bucket's end; the step ends when the last bucket does. Without
overlap every bucket waits for the end of backward. Only the cost of one
bucket's all-reduce comes from the project (``syncsim.collectives.
allreduce_time``: the seconds of the ``choose`` the communicator charges per bucket), so these tests
check the schedule — readiness, serialisation, overlap with backward — and
not the collective's formula, which tests/property/test_collectives.py checks.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.collectives import allreduce_time
from syncsim.schemes import AllReduce, AllReduceGradients

MB = 1e6


def layer_ready_times(layers: list[float], compute: float, backward_fraction: float) -> dict[int, float]:
    """When each layer's gradient exists: forward first, then backward from the last layer, time ∝ bytes."""
    total = sum(layers)
    clock = compute * (1 - backward_fraction)
    ready = {}
    for i in reversed(range(len(layers))):
        clock += compute * backward_fraction * layers[i] / total
        ready[i] = clock
    return ready


def brute_force_step(layers, buckets, compute, backward_fraction, overlap, cost) -> tuple[float, float]:
    """(first bucket's start, step end) of one step that starts at 0; ``buckets`` lists layer indices."""
    ready_at = layer_ready_times(layers, compute, backward_fraction)
    stream_free, first = 0.0, None
    for members in buckets:
        ready = max(ready_at[i] for i in members) if overlap else compute
        start = max(stream_free, ready)
        first = start if first is None else first
        stream_free = start + cost(sum(layers[i] for i in members))
    return first, stream_free


def simulated(cluster, layers, compute, backward_fraction, scheme, steps=4):
    workload = Workload(param_bytes=None, layers=layers, compute_time=compute, backward_fraction=backward_fraction)
    return simulate(cluster, workload, scheme, steps=steps)


# Layouts by hand. DDP fills buckets from the last layer backwards and closes
# one as soon as it reaches the cap (reducer.cpp, compute_bucket_assignment_by_size).
LAYOUTS = {
    # reversed [3, 2, 4, 1] MB, cap 3 MB: {3} closes at 3; {2, 4} at 6; {1} is left over
    "uneven": dict(layers=[1, 4, 2, 3], cap=3, buckets=[[3], [2, 1], [0]]),
    # reversed [0.5, 0.5, 8, 0.5, 1, 1] MB, cap 1 MB: {0.5, 0.5}, {8}, {0.5, 1}, {1}
    "big middle layer": dict(layers=[1, 1, 0.5, 8, 0.5, 0.5], cap=1, buckets=[[5, 4], [3], [2, 1], [0]]),
    # cap above the model: one bucket, ready only at the end of backward
    "one bucket": dict(layers=[2, 3, 5], cap=25, buckets=[[2, 1, 0]]),
    # every layer its own bucket
    "one per layer": dict(layers=[3, 1, 2, 2, 1], cap=0.5, buckets=[[4], [3], [2], [1], [0]]),
}
REGIMES = [  # (GPUs, link, compute seconds, backward fraction, algorithm, precision)
    (4, Link("10GB/s", "5us"), 10e-3, 0.6, "ring", "fp32"),        # buckets hide in backward's gaps
    (8, Link("1GB/s", "20us"), 2e-3, 0.5, "ring", "fp32"),         # communication-bound: buckets queue
    (3, Link("2GB/s", "50us"), 5e-3, 0.9, "tree", "fp16"),         # long backward, 16-bit wire
    (16, Link("4GB/s", "10us"), 4e-3, 2 / 3, "hierarchical", "bf16"),
]


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("regime", range(len(REGIMES)))
@pytest.mark.parametrize("overlap", [True, False])
def test_step_time_equals_the_hand_built_schedule(name, regime, overlap):
    layout = LAYOUTS[name]
    gpus, link, compute, fraction, algorithm, precision = REGIMES[regime]
    cluster = (Cluster(nodes=4, gpus_per_node=gpus // 4, intra=Link("50GB/s", "2us"), inter=link)
               if algorithm == "hierarchical" else Cluster.homogeneous(gpus, link))
    layers = [b * MB for b in layout["layers"]]
    scheme = AllReduce(algorithm=algorithm, precision=precision, bucket_bytes=layout["cap"] * MB, overlap=overlap)
    wire = scheme.wire_ratio

    # the buckets the policy forms are the hand-made ones, in the same order
    action = next(a for a in scheme.policy(sum(layers), layers, fraction).plan(0, 1)
                  if isinstance(a, AllReduceGradients))
    expected_sizes = [sum(layers[i] for i in members) * wire for members in layout["buckets"]]
    assert action.buckets == pytest.approx(expected_sizes, rel=1e-12)

    first, end = brute_force_step(layers, layout["buckets"], compute, fraction, overlap,
                                  lambda fp32_bytes: allreduce_time(algorithm, fp32_bytes * wire, cluster))
    res = simulated(cluster, layers, compute, fraction, scheme)
    assert res.step_time == pytest.approx(end, rel=1e-12)
    # and each step's trace: compute from the step's start for `compute`, all-reduce from the first
    # bucket's start to the last bucket's end
    trace = res.trace[res.trace.worker == 0]
    for step, rows in trace.groupby("step"):
        start = step * end
        comp = rows[rows.kind == "compute"].iloc[0]
        reduce = rows[rows.kind == "allreduce"].iloc[0]
        assert (comp.start, comp.end) == pytest.approx((start, start + compute), rel=1e-12, abs=1e-15)
        assert (reduce.start, reduce.end) == pytest.approx((start + first, start + end), rel=1e-12)


def test_the_regimes_exercise_both_sides_of_the_overlap():
    # Guard on the layouts above: in some of them a bucket waits for backward
    # (readiness decides), in others for the previous bucket (the stream decides).
    waits = set()
    for layout in LAYOUTS.values():
        for gpus, link, compute, fraction, algorithm, _ in REGIMES[:2]:
            cluster = Cluster.homogeneous(gpus, link)
            layers = [b * MB for b in layout["layers"]]
            ready_at = layer_ready_times(layers, compute, fraction)
            free = 0.0
            for members in layout["buckets"]:
                ready = max(ready_at[i] for i in members)
                waits.add("readiness" if ready > free else "stream")
                free = max(free, ready) + allreduce_time(algorithm, sum(layers[i] for i in members), cluster)
    assert waits == {"readiness", "stream"}


@given(layers=st.lists(st.floats(1e3, 5e6), min_size=1, max_size=8), cap=st.floats(1e3, 1e7),
       fraction=st.floats(0.05, 0.95), compute=st.floats(1e-4, 5e-2), gpus=st.integers(2, 16),
       bandwidth=st.floats(1e8, 1e11), latency=st.floats(0, 1e-4), overlap=st.booleans())
def test_step_time_equals_the_brute_force_schedule_on_random_layouts(layers, cap, fraction, compute, gpus, bandwidth,
                                                                     latency, overlap):
    # Bucket membership is read off the policy's sizes (the layouts above check
    # how they are formed); readiness and the stream are the reference's own.
    cluster = Cluster.homogeneous(gpus, Link(bandwidth, latency))
    scheme = AllReduce(bucket_bytes=cap, overlap=overlap)
    action = next(a for a in scheme.policy(sum(layers), layers, fraction).plan(0, 1)
                  if isinstance(a, AllReduceGradients))
    buckets, members, filled = [], [], 0.0
    for i in reversed(range(len(layers))):
        members.append(i)
        filled += layers[i]
        if filled == pytest.approx(action.buckets[len(buckets)], rel=1e-12):
            buckets.append(members)
            members, filled = [], 0.0
    assert not members and len(buckets) == len(action.buckets)
    _, end = brute_force_step(layers, buckets, compute, fraction, overlap,
                              lambda nbytes: allreduce_time(scheme.algorithm, nbytes, cluster))
    assert simulated(cluster, layers, compute, fraction, scheme, steps=2).step_time == pytest.approx(end, rel=1e-12)
