"""The simulator carrying out PowerSGD, top-k and DiLoCo: the all-gather's closed form, the compressors'
own work at the workload's rates, DiLoCo's outer-step schedule, and the invariants every run keeps."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.collectives import allgather_inter_hops, allgather_time, allreduce_time
from syncsim.compression.work import compression_work
from syncsim.metrics import step_ends
from syncsim.schemes import AllReduce, LowRankAllReduce, OuterStep, SparseAllGather, TopK, parse
from tests.property.collective_reference import critical_hops, ring_pattern
from tests.property.test_collectives import _cluster, bandwidths, latencies, shapes, sizes, with_edge_cases

INDEX = 4
rates = st.floats(1e6, 1e13)


# Basis: ring all-gather, p - 1 steps each passing one contribution of n bytes to the next GPU (Thakur,
# Rabenseifner & Gropp 2005, the ring allgather): (p-1)·alpha + (p-1)·n/B, for one GPU and one NIC per node.
# Top-k's contribution is k values and k int32 indices, so its step is compute + that with n = k·(4 + 4).
@given(st.integers(1, 64), st.integers(1, 10**6), st.floats(1e-6, 1.0), latencies, bandwidths, st.floats(1e-3, 1.0))
def test_allgather_is_the_textbook_ring_on_single_gpu_nodes(p, values, ratio, alpha, bandwidth, compute):
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha))
    scheme = TopK(ratio=ratio)
    n = scheme.k(values) * (4 + INDEX)
    expected = ((p - 1) * alpha + (p - 1) * n / bandwidth if p > 1 else 0.0)
    assert allgather_time(cluster, n) == pytest.approx(expected, rel=1e-12)
    res = simulate(cluster, Workload(4 * values, compute), scheme, steps=3)
    assert res.step_time == pytest.approx(compute + expected, rel=1e-12)


# Basis: NCCL's rings (as test_ring_matches_the_channels_built_rank_by_rank builds them): an all-gather is one
# pass of p - 1 steps; each channel's ring edge carries (p-1)/p of the gathered p·n over its 1/r share, and a
# piece of data crosses p - 1 consecutive hops.
@with_edge_cases(launch=7e-6)
@given(shapes, sizes, latencies, bandwidths, latencies, bandwidths, st.floats(0.0, 1e-4))
def test_allgather_matches_the_channels_built_rank_by_rank(shape, n, a_i, b_i, a_n, b_n, launch):
    m, g, r = shape
    p = m * g
    pattern = ring_pattern(m, g, r, channels=r)
    per_edge = (p - 1) * n / r
    busiest = max(max(pattern["intra_edges"]) * per_edge / b_i if g > 1 else 0.0,
                  max(pattern["nic_edges"]) * per_edge / b_n if m > 1 else 0.0)
    hops = critical_hops(pattern["turn"], p - 1) if p > 1 else {"intra": 0, "inter": 0}
    expected = launch + hops["intra"] * a_i + hops["inter"] * a_n + busiest if p > 1 else 0.0
    assert allgather_time(_cluster(shape, a_i, b_i, a_n, b_n, launch), n) == pytest.approx(expected, rel=1e-12)
    assert allgather_inter_hops(m, g) == hops["inter"]


def test_allgather_moves_half_an_allreduce_s_bytes_per_contribution():
    # an all-reduce of p·n moves 2(p-1)/p·(p·n) = 2(p-1)·n per GPU, twice what gathering p contributions of n
    # moves: on bandwidth alone (no latencies) the all-gather of n takes half the ring all-reduce of p·n
    cluster = Cluster.preset("a100-100g", gpus=64).replace(collective_latency=0.0)
    cluster = cluster.replace(intra=Link("240GB/s"), inter=Link("12GB/s"))
    n = 2**20
    assert allgather_time(cluster, n) == pytest.approx(allreduce_time("ring", 64 * n, cluster) / 2, rel=1e-12)


# -- the compressors' own work -----------------------------------------------------------------------
matrix_shapes = st.lists(st.one_of(st.tuples(st.integers(1, 300)), st.tuples(st.integers(1, 200), st.integers(1, 200)),
                                   st.tuples(st.integers(1, 64), st.integers(1, 16), st.integers(1, 3),
                                             st.integers(1, 3))), min_size=1, max_size=6)


@given(matrix_shapes, st.integers(1, 16), st.sampled_from([0.0, 1.0, 2.0]))
def test_powersgd_s_stages_add_up_to_the_action_s_flops(tensors, rank, min_compression):
    action = AllReduce(compression="powersgd", rank=rank, min_compression=min_compression).low_rank(
        4.0 * sum(math.prod(t) for t in tensors), None, tensors)
    stages = compression_work(action, 4)
    assert len(stages) == 3
    assert sum(flops for flops, _ in stages) == pytest.approx(action.flops, rel=1e-12)
    n = sum(math.prod(t) for t in tensors)
    # error feedback: Δ = g + e before round one and e = Δ − applied after round two, one pass over n each,
    # and the uncompressed values copied into round one's buffer and back out
    assert [values for _, values in stages] == [n + action.uncompressed, 0, action.uncompressed + n]


def _times(workers: int, steps: int, seed: int) -> np.ndarray:
    """Measured-style compute times: each worker its own constant, so the slowest one decides."""
    per_worker = np.random.default_rng(seed).uniform(1e-3, 5e-3, workers)
    return np.tile(per_worker, (steps, 1))


@given(st.integers(2, 9), st.integers(1, 10**6), st.floats(1e-4, 1.0), rates, latencies, bandwidths, st.integers(0, 99))
def test_topk_selects_before_the_allgather_and_scatters_after_it(workers, values, ratio, scan, alpha, bandwidth,
                                                                 seed):
    # Counted from syncsim.compression.topk: before, Δ = g + e, |Δ|, the partition, the two comparisons
    # (5 passes over n) and the k sent entries read and taken off the residual (2k); after, every worker's
    # k entries added into a zeroed dense gradient and the sum divided by W (n + W·k + n).
    cluster = Cluster.homogeneous(workers, Link(bandwidth, alpha))
    scheme = TopK(ratio=ratio)
    k = scheme.k(values)
    before, after = (5 * values + 2 * k) / scan, (2 * values + workers * k) / scan
    gather = allgather_time(cluster, k * (4 + INDEX))
    steps = 4
    table = _times(workers, steps, seed)
    res = simulate(cluster, Workload(4 * values, 1e-3, scan_rate=scan), scheme, steps=steps, compute_times=table)
    assert res.step_time == pytest.approx(table[0].max() + before + gather + after, rel=1e-9)
    rows = res.trace[res.trace["kind"] == "allgather"]
    computes = res.trace[res.trace["kind"] == "compute"]
    first = rows[rows["step"] == 0]
    # the gather starts once the slowest worker has selected, and its row ends with the scatter-add
    np.testing.assert_allclose(first["start"], computes[computes["step"] == 0]["end"].max() + before, rtol=1e-12)
    # (a difference of two times: rounded to the ulp of the times themselves)
    np.testing.assert_allclose(first["end"] - first["start"], gather + after, rtol=1e-9, atol=1e-15)
    # the new version lands when every worker has its dense gradient back
    applied = res.updates[res.updates["step"] == 0]["time_applied"]
    assert (applied == first["end"].iloc[0]).all()
    # the flop rate does not touch top-k, which does no dense arithmetic
    again = simulate(cluster, Workload(4 * values, 1e-3, scan_rate=scan, compress_flops=1.0), scheme, steps=steps,
                     compute_times=table)
    pd.testing.assert_frame_equal(again.trace, res.trace)


@given(matrix_shapes, st.integers(1, 8), st.integers(2, 6), rates, rates, latencies, bandwidths, st.integers(0, 99))
def test_powersgd_computes_p_before_round_one_q_between_and_the_product_after(tensors, rank, workers, flop_rate,
                                                                             scan, alpha, bandwidth, seed):
    values = sum(math.prod(t) for t in tensors)
    workload = Workload(4 * values, 1e-3, shapes=tensors, compress_flops=flop_rate, scan_rate=scan)
    scheme = AllReduce(compression="powersgd", rank=rank)
    action = scheme.low_rank(workload.param_bytes, None, tensors)
    ranks, matrices, u = action.ranks(), action.matrices, action.uncompressed
    product = sum(2 * rows * cols * r for r, (rows, cols) in zip(ranks, matrices)) / flop_rate
    gram_schmidt = sum(4 * rows * r * r for r, (rows, _) in zip(ranks, matrices)) / flop_rate
    before = product + (values + u) / scan
    between = gram_schmidt + product
    after = product + (u + values) / scan
    cluster = Cluster.homogeneous(workers, Link(bandwidth, alpha))
    one, two = (allreduce_time("auto", nbytes, cluster) for nbytes in (action.p_bytes, action.q_bytes))
    steps = 3
    table = _times(workers, steps, seed)
    res = simulate(cluster, workload, scheme, steps=steps, compute_times=table)
    assert res.step_time == pytest.approx(table[0].max() + before + one + between + two + after, rel=1e-9)
    rounds = res.collectives.sort_values("start")
    p_round, q_round = rounds.iloc[0], rounds.iloc[1]
    assert q_round["start"] == pytest.approx(p_round["end"] + between, rel=1e-12)
    assert q_round["end"] - q_round["start"] == pytest.approx(two, rel=1e-9, abs=1e-15)
    assert res.updates["time_applied"].min() == pytest.approx(q_round["end"] + after, rel=1e-12)


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 30), st.integers(2, 6), rates, st.booleans(),
       st.integers(0, 99))
def test_diloco_takes_the_pseudo_gradient_before_and_the_outer_step_after_its_allreduce(gap, fragments, steps, workers,
                                                                                       scan, momentum, seed):
    # the fragment's pseudo-gradient (one pass over its f values) before the all-reduce; after it the outer
    # Nesterov step as torch.optim.SGD writes it (4 passes; 1 without momentum) and the replica's copy (1)
    period = gap * fragments
    n = 10_007
    scheme = parse(f"diloco:period={period},fragments={fragments},outer_momentum={0.9 if momentum else 0.0}")
    cluster = Cluster.homogeneous(workers, Link(1e9, 1e-6))
    table = _times(workers, steps, seed)
    res = simulate(cluster, Workload(4 * n, 1e-3, scan_rate=scan), scheme, steps=steps, compute_times=table)
    bounds = [(f * n // fragments, (f + 1) * n // fragments) for f in range(fragments)]
    # walk the run: local steps run apart, each outer step joins them
    clock = np.zeros(workers)
    ends = np.zeros((steps, workers))
    policy = scheme.policy(4.0 * n)
    for t in range(steps):
        clock = clock + table[t]
        for action in policy.plan(t, steps):
            if isinstance(action, OuterStep):
                f = action.values
                assert action.spans == tuple(bounds[i] for i in action.fragments)
                start = clock.max() + f / scan
                clock = np.full(workers, start + allreduce_time("auto", 4 * f, cluster) + (5 if momentum else 2) * f
                                / scan)
        ends[t] = clock
    np.testing.assert_allclose(res.step_end, ends, rtol=1e-9)


# -- DiLoCo's schedule -----------------------------------------------------------------------------------
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 60))
def test_diloco_has_steps_over_h_outer_collectives_and_staggers_its_fragments(gap, fragments, steps):
    period = gap * fragments
    res = simulate(Cluster.homogeneous(2, Link(1e9, 1e-6)), Workload(4e4, 1e-3),
                   f"diloco:period={period},fragments={fragments}", steps=steps)
    outer = res.collectives[res.collectives["kind"] == "outer"]
    # one fragment every H/F steps before the last step, then every fragment at the last, in one all-reduce
    turns = [t for t in range(steps - 1) if (t + 1) % gap == 0]
    assert len(outer) == len(turns) + 1 == res.versions
    assert outer["step"].tolist() == turns + [steps - 1]
    if fragments == 1:  # plain DiLoCo: steps/H outer steps, plus the last when H does not divide the run
        assert len(outer) == steps // period + (steps % period != 0)
    # consecutive turns take the fragments in order, round and round
    nbytes = outer["bytes"].tolist()
    sizes_ = [4 * ((f + 1) * 10_000 // fragments - f * 10_000 // fragments) for f in range(fragments)]
    assert nbytes[:len(turns)] == [sizes_[i % fragments] for i in range(len(turns))]
    assert nbytes[len(turns):] == [sum(sizes_)]
    # every local step is folded into exactly one version: that of the first outer collective at or after it
    updates = res.updates
    assert len(updates) == 2 * steps and not updates.duplicated(["worker", "step"]).any()
    at = outer["step"].to_numpy()
    expected = np.searchsorted(at, updates["step"].to_numpy())  # collective i makes version i + 1 from i
    np.testing.assert_array_equal(updates["version_applied"].to_numpy(), expected)
    assert (updates["staleness"] == 0).all()


# -- invariants ------------------------------------------------------------------------------------------
links = st.builds(Link, bandwidth=st.floats(1e8, 1e12), latency=st.floats(0, 1e-4))
new_schemes = st.sampled_from([
    "allreduce:compression=powersgd", "allreduce:compression=powersgd,rank=4,precision=bf16",
    "allreduce:compression=powersgd,rank=64,min_compression=0", "allreduce:compression=powersgd,algorithm=tree",
    "topk", "topk:ratio=0.3,precision=fp16", "topk:ratio=1",
    "diloco:period=1", "diloco:period=4,fragments=2", "diloco:period=6,fragments=3,inner=sgd,outer_momentum=0",
])


@st.composite
def configs(draw):
    cluster = Cluster(nodes=draw(st.integers(1, 4)), gpus_per_node=draw(st.integers(1, 4)), intra=draw(links),
                      inter=draw(links), nics_per_node=draw(st.integers(1, 4)), jitter=draw(st.floats(0, 0.5)),
                      straggler_prob=draw(st.floats(0, 0.3)), straggler_slowdown=draw(st.floats(1, 5)))
    tensors = draw(st.one_of(st.none(), matrix_shapes))
    param_bytes = draw(st.floats(1e3, 1e7)) if tensors is None else 4.0 * sum(math.prod(t) for t in tensors)
    workload = Workload(param_bytes=param_bytes, compute_time=draw(st.floats(1e-3, 0.2)), shapes=tensors,
                        compress_flops=draw(st.one_of(st.none(), rates)), scan_rate=draw(st.one_of(st.none(), rates)))
    return cluster, workload, draw(new_schemes), draw(st.integers(1, 12)), draw(st.integers(0, 2**31))


@given(configs())
def test_new_schemes_keep_the_engine_s_invariants(config):
    cluster, workload, scheme, steps, seed = config
    res = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    trace, updates = res.trace, res.updates
    assert res.step_time > 0 and np.isfinite(res.throughput)
    assert (trace["end"] >= trace["start"]).all() and (trace["start"] >= 0).all()
    assert ((trace["kind"] == "compute").groupby(trace["worker"], observed=True).sum() == steps).all()
    for _, rows in trace.groupby("worker", observed=True):
        for is_compute in (True, False):
            part = rows[(rows["kind"] == "compute") == is_compute].sort_values(["start", "end"], kind="stable")
            assert (part["start"].to_numpy()[1:] >= part["end"].to_numpy()[:-1] - 1e-12).all()
            assert (np.diff(part["step"].to_numpy()) >= 0).all()
    # every worker-step applied exactly once, fresh (all three are synchronous), versions in order
    assert len(updates) == steps * cluster.gpus and not updates.duplicated(["worker", "step"]).any()
    assert (updates["staleness"] == 0).all()
    assert (np.diff(updates["version_applied"].to_numpy()) >= 0).all()
    np.testing.assert_allclose(step_ends(trace, cluster.gpus, steps), res.step_end, rtol=1e-12, atol=0)
    # a version lands when its collective's rows end (decompression included), never before
    policy = res.scheme.policy(workload.param_bytes, workload.layers, workload.backward_fraction, workload.shapes)
    kinds = {type(a) for t in policy.distinct_steps(steps) for a in policy.plan(t, steps)}
    if OuterStep not in kinds:
        assert res.versions == steps
        last = trace[trace["kind"].isin(["allreduce", "allgather"])].groupby("step", observed=True)["end"].max()
        assert (updates.groupby("step")["time_applied"].max() == last).all()
    # bytes are what the policy says, whatever the rates
    assert trace["bytes"].sum() == pytest.approx(cluster.gpus * policy.wire_bytes(steps), rel=1e-12)
    plain = simulate(cluster, replace(workload, compress_flops=None, scan_rate=None), scheme, steps=steps, seed=seed)
    np.testing.assert_array_equal(np.sort(plain.trace["bytes"].to_numpy()), np.sort(trace["bytes"].to_numpy()))
    assert (plain.step_end <= res.step_end * (1 + 1e-12)).all()  # work costs time, never saves it


@given(configs())
def test_16_bit_wires_halve_values_but_not_indices(config):
    cluster, workload, scheme, steps, seed = config
    scheme = parse(scheme)
    full = simulate(cluster, workload, replace(scheme, precision="fp32"), steps=steps, seed=seed)
    half = simulate(cluster, workload, replace(scheme, precision="bf16"), steps=steps, seed=seed)
    ratio = (2 + INDEX) / (4 + INDEX) if isinstance(scheme, TopK) else 0.5
    assert half.trace["bytes"].sum() == pytest.approx(full.trace["bytes"].sum() * ratio, rel=1e-12)


@pytest.mark.parametrize("scheme", ["allreduce", "allreduce:overlap=false", "ps", "ps:mode=async", "localsgd:period=4",
                                    "ps:staleness=1"])
def test_rates_change_nothing_for_schemes_without_a_compressor(scheme):
    cluster = Cluster(nodes=2, gpus_per_node=2, intra=Link("100GB/s", "2us"), inter=Link("10GB/s", "10us"),
                      servers=1, jitter=0.2)
    workload = Workload("20MB", "5ms")
    plain = simulate(cluster, workload, scheme, steps=8, seed=3)
    rated = simulate(cluster, replace(workload, compress_flops=1e9, scan_rate=1e6), scheme, steps=8, seed=3)
    pd.testing.assert_frame_equal(plain.trace, rated.trace, check_exact=True)
    pd.testing.assert_frame_equal(plain.updates, rated.updates, check_exact=True)


def test_compression_work_of_each_action_kind():
    low = LowRankAllReduce(rank=2, matrices=((10, 20),), uncompressed=7, value_bytes=4, algorithm="auto")
    assert compression_work(low, 3) == ((2 * 10 * 20 * 2, 207 + 7), (4 * 10 * 4 + 2 * 10 * 20 * 2, 0), (800, 214))
    sparse = SparseAllGather(values=5, size=100, value_bytes=4)
    assert compression_work(sparse, 3) == ((0, 510), (0, 215))
    outer = OuterStep(fragments=(1,), count=2, spans=((10, 30),), value_bytes=4, algorithm="auto", lr=0.7,
                      momentum=0.9)
    assert compression_work(outer, 3) == ((0, 20), (0, 100))
    assert compression_work(replace(outer, momentum=0.0), 3) == ((0, 20), (0, 40))
    assert compression_work(AllReduce().action(1e6, None, 2 / 3), 3) == ()


@pytest.mark.parametrize("field", ["compress_flops", "scan_rate"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "1e9", True, [1e9]])
def test_rates_refuse_what_is_not_a_positive_number(field, value):
    with pytest.raises(ValueError, match=f"Workload.{field}"):
        Workload(1e6, 1e-3, **{field: value})
    assert getattr(Workload(1e6, 1e-3, **{field: 2.5e9}), field) == 2.5e9
    assert getattr(Workload.from_dict(Workload(1e6, 1e-3, **{field: 2.5e9}).to_dict()), field) == 2.5e9


def test_calibration_measures_both_rates_on_the_model_s_own_shapes():
    # real.calibrate times what the executor runs (syncsim.compression, numpy): the thin products at the
    # shapes torch's rule compresses, a partition of the gradient's size; the check prices the compressors'
    # whole per-worker work at those rates (compression_work) beside its measured time.
    pytest.importorskip("torch")
    from real.calibrate import measure_compression

    rates = measure_compression("mlp", rank=2, repeats=2, threads=1)
    assert rates["values"] == 101_770 and rates["k"] == 1018  # 784·128 + 128 + 128·10 + 10; 1 %
    assert rates["matrices"] == [[128, 784], [10, 128]]  # both weights compress at rank 2 by torch's rule
    assert rates["product_flops"] == 6 * 2 * (128 * 784 + 10 * 128)
    assert rates["compress_flops"] == pytest.approx(rates["product_flops"] / rates["product_seconds"])
    assert rates["scan_rate"] == pytest.approx(rates["values"] / rates["partition_seconds"])
    for check in rates["check"].values():
        assert check["measured"] > 0 and check["priced"] > 0
    workload = Workload(4 * rates["values"], 1e-3, compress_flops=rates["compress_flops"],
                        scan_rate=rates["scan_rate"])  # what the calibration file's workload holds
    assert simulate(Cluster.homogeneous(2, Link(1e9)), workload, "topk", steps=2).step_time > 1e-3
