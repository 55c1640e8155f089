"""The simulator carrying out ZeRO and FSDP: reduce-scatter's closed form, the bytes each stage moves per
step, the unit-by-unit schedule with and without prefetch, and the invariants every run keeps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.collectives import allgather_inter_hops, reducescatter_time, ring_time, sharded_allgather_time
from syncsim.metrics import step_ends
from syncsim.schemes import parse
from tests.property.collective_reference import critical_hops, ring_pattern
from tests.property.test_collectives import _cluster, bandwidths, latencies, shapes, sizes, with_edge_cases

SHARDED = ["zero", "zero:stage=2", "zero:stage=3", "zero:overlap=false", "zero:stage=3,bucket_bytes=1MiB",
           "fsdp", "fsdp:reshard=false", "fsdp:prefetch=false", "fsdp:reshard=false,prefetch=false",
           "fsdp:unit_bytes=256KiB", "zero:stage=3,precision=bf16", "fsdp:precision=fp16,unit_bytes=1MiB"]
# Rajbhandari et al. 2020, section 7: gathers per step of the whole parameters besides the reduce-scatter
GATHERS = {"zero": 1, "zero:stage=2": 1, "zero:stage=3": 2, "zero:overlap=false": 1,
           "zero:stage=3,bucket_bytes=1MiB": 2, "fsdp": 2, "fsdp:reshard=false": 1, "fsdp:prefetch=false": 2,
           "fsdp:reshard=false,prefetch=false": 1, "fsdp:unit_bytes=256KiB": 2, "zero:stage=3,precision=bf16": 2,
           "fsdp:precision=fp16,unit_bytes=1MiB": 2}
layer_lists = st.one_of(st.none(), st.lists(st.floats(1e4, 1e7), min_size=1, max_size=6))


# -- reduce-scatter's closed form ------------------------------------------------------------------
# Basis: ring reduce-scatter, p - 1 steps each passing one shard of n/p bytes to the next GPU, which adds its
# own (Thakur, Rabenseifner & Gropp 2005): (p-1)·alpha + (p-1)/p·n/B on single-GPU nodes with one NIC; NCCL
# counts it p - 1 steps, as all-gather (src/graph/tuning.cc, nsteps = nRanks-1 for ReduceScatter/AllGather).
@given(st.integers(1, 64), sizes, latencies, bandwidths)
def test_reducescatter_is_the_textbook_ring_on_single_gpu_nodes(p, n, alpha, bandwidth):
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha))
    expected = (p - 1) * alpha + (p - 1) / p * n / bandwidth if p > 1 else 0.0
    assert reducescatter_time(cluster, n) == pytest.approx(expected, rel=1e-12)
    assert sharded_allgather_time(cluster, n) == pytest.approx(expected, rel=1e-12)  # the same pass, run forwards


# Basis: Cluster.reducescatter_traffic and allgather_traffic are defined as multipliers of the ring's byte term
# alone: (p-1)·alpha + k·(p-1)/p·n/B; the latencies a backend pays are its launches and hops, not its bytes.
@given(st.integers(2, 64), sizes, latencies, bandwidths, st.floats(0.5, 4.0), st.floats(0.5, 4.0))
def test_traffic_factors_scale_the_byte_term_alone(p, n, alpha, bandwidth, scatter, gather):
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha), reducescatter_traffic=scatter, allgather_traffic=gather)
    assert reducescatter_time(cluster, n) == pytest.approx((p - 1) * alpha + scatter * (p - 1) / p * n / bandwidth,
                                                           rel=1e-12)
    assert sharded_allgather_time(cluster, n) == pytest.approx((p - 1) * alpha + gather * (p - 1) / p * n / bandwidth,
                                                               rel=1e-12)


# Basis: NCCL's rings built channel by channel (tests/property/collective_reference.py): a reduce-scatter of n is
# one pass of p - 1 steps in which each channel's ring edge carries (p-1)/p·n over its 1/r share, and a shard
# crosses p - 1 consecutive hops.
@with_edge_cases(launch=7e-6)
@given(shapes, sizes, latencies, bandwidths, latencies, bandwidths, st.floats(0.0, 1e-4))
def test_reducescatter_matches_the_channels_built_rank_by_rank(shape, n, a_i, b_i, a_n, b_n, launch):
    m, g, r = shape
    p = m * g
    pattern = ring_pattern(m, g, r, channels=r)
    per_edge = (p - 1) / p * n / r
    busiest = max(max(pattern["intra_edges"]) * per_edge / b_i if g > 1 else 0.0,
                  max(pattern["nic_edges"]) * per_edge / b_n if m > 1 else 0.0)
    hops = critical_hops(pattern["turn"], p - 1) if p > 1 else {"intra": 0, "inter": 0}
    expected = launch + hops["intra"] * a_i + hops["inter"] * a_n + busiest if p > 1 else 0.0
    assert reducescatter_time(_cluster(shape, a_i, b_i, a_n, b_n, launch), n) == pytest.approx(expected, rel=1e-12)
    assert allgather_inter_hops(m, g) == hops["inter"]


# Basis: ring all-reduce is a reduce-scatter followed by an all-gather (Patarasuk & Yuan 2009), so on bandwidth
# alone the two together take the ring all-reduce's time: 2(p-1)/p·n per GPU on the same resources.
@given(shapes, sizes, bandwidths, bandwidths)
def test_reducescatter_and_allgather_move_a_ring_allreduce_s_bytes(shape, n, b_i, b_n):
    cluster = _cluster(shape, 0.0, b_i, 0.0, b_n)
    both = reducescatter_time(cluster, n) + sharded_allgather_time(cluster, n)
    assert both == pytest.approx(ring_time(cluster, n), rel=1e-12)


# -- communication volume per step ------------------------------------------------------------------
@given(shapes, bandwidths, bandwidths, layer_lists, st.sampled_from(SHARDED), st.integers(1, 4))
def test_bytes_per_step_are_zero_s_counts(shape, b_i, b_n, layers, scheme, steps):
    # Basis: Rajbhandari et al. 2020 (ZeRO), section 7: stages 1 and 2 reduce-scatter the gradients (Ψ) and
    # all-gather the updated parameters (Ψ), each moving (p-1)/p of it per GPU: 2Ψ, what an all-reduce moves;
    # stage 3 all-gathers the parameters before forward and again before backward: 3Ψ. FSDP's FULL_SHARD is
    # stage 3's, SHARD_GRAD_OP stage 2's (Zhao et al. 2023). On a latency-free cluster every collective's time
    # is its bytes per GPU over the ring's per-byte rate, so a step's collective time is k/2 ring all-reduces
    # of Ψ (k = 2 or 3), however units and buckets cut Ψ.
    cluster = _cluster(shape, 0.0, b_i, 0.0, b_n)
    work = Workload(param_bytes=None if layers else 3e6, layers=layers, compute_time="1ms")
    spec = parse(scheme)
    psi = work.param_bytes * spec.wire_ratio
    res = simulate(cluster, work, spec, steps=steps)
    frame = res.collectives
    k = 1 + GATHERS[scheme]
    if cluster.gpus == 1:
        assert (frame["end"] == frame["start"]).all()
        return
    per_step = frame.groupby(["step", "algorithm"])["bytes"].sum().unstack()
    assert np.allclose(per_step["reducescatter"], psi, rtol=1e-9)
    assert np.allclose(per_step["allgather"], (k - 1) * psi, rtol=1e-9)
    busy = (frame["end"] - frame["start"]).groupby(frame["step"]).sum()
    assert np.allclose(busy, k / 2 * ring_time(cluster, psi), rtol=1e-9)


# -- the schedule ----------------------------------------------------------------------------------
def _units_case(p, units, unit, alpha, bandwidth, compute, backward):
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha))
    work = Workload(param_bytes=None, layers=(unit,) * units, compute_time=compute, backward_fraction=backward)
    g, r = sharded_allgather_time(cluster, unit), reducescatter_time(cluster, unit)
    return cluster, work, g, r


cases = dict(p=st.integers(2, 16), units=st.integers(1, 6), unit=st.floats(1e4, 1e7), alpha=latencies,
             bandwidth=st.floats(1e9, 1e11), compute=st.floats(1e-3, 0.5), backward=st.floats(0.2, 0.8))


@given(**cases)
def test_fsdp_with_prefetch_exposes_one_gather_each_way_and_the_last_scatter(p, units, unit, alpha, bandwidth,
                                                                              compute, backward):
    # Basis: FSDP's prefetch (forward_prefetch, BACKWARD_PRE) issues each unit's gather when the previous unit's
    # compute begins, so when a gather (g) fits in a unit's forward and a gather plus a reduce-scatter (r) in a
    # unit's backward, only the first gather of each pass and the last reduce-scatter are exposed:
    # step = g + forward + g + backward + r.
    cluster, work, g, r = _units_case(p, units, unit, alpha, bandwidth, compute, backward)
    assume(g <= (1 - backward) * compute / units and g + r <= backward * compute / units)
    res = simulate(cluster, work, "fsdp:unit_bytes=1", steps=4)
    assert res.step_time == pytest.approx(2 * g + compute + r, rel=1e-9)
    # without resharding the backward needs no gather
    res = simulate(cluster, work, "fsdp:unit_bytes=1,reshard=false", steps=4)
    assert res.step_time == pytest.approx(g + compute + r, rel=1e-9)


@given(**cases)
def test_fsdp_without_prefetch_exposes_every_gather(p, units, unit, alpha, bandwidth, compute, backward):
    # Basis: without prefetch a unit's gather is issued only when its compute is reached, so every gather is
    # exposed (2K of them); a unit's reduce-scatter runs during the next unit's backward when it fits (r), and
    # the last is exposed: step = 2K·g + compute + r.
    cluster, work, g, r = _units_case(p, units, unit, alpha, bandwidth, compute, backward)
    assume(r <= backward * compute / units)
    res = simulate(cluster, work, "fsdp:unit_bytes=1,prefetch=false", steps=4)
    assert res.step_time == pytest.approx(2 * units * g + compute + r, rel=1e-9)


@given(**cases)
def test_zero_1_exposes_its_gather_after_the_step(p, units, unit, alpha, bandwidth, compute, backward):
    # Basis: ZeRO-1 and -2 gather the updated parameters after the optimiser step, before the next forward
    # (DeepSpeed's allgather_partitions): with one bucket each way, step = compute + r(Ψ) + g(Ψ).
    cluster, work, _, _ = _units_case(p, units, unit, alpha, bandwidth, compute, backward)
    psi = units * unit
    res = simulate(cluster, work, f"zero:bucket_bytes={int(psi * 2)}", steps=4)
    expected = compute + reducescatter_time(cluster, psi) + sharded_allgather_time(cluster, psi)
    assert res.step_time == pytest.approx(expected, rel=1e-9)


@given(**cases, scheme=st.sampled_from(SHARDED))
def test_without_compute_a_step_is_its_collectives_end_to_end(p, units, unit, alpha, bandwidth, compute, backward,
                                                              scheme):
    # Basis: with nothing to overlap, the communicator runs a step's collectives one after another.
    cluster, work, _, _ = _units_case(p, units, unit, alpha, bandwidth, compute, backward)
    res = simulate(cluster, work.replace(compute_time=1e-12), scheme, steps=3)
    frame = res.collectives
    busy = float((frame["end"] - frame["start"])[frame["step"] == 2].sum())
    assert res.step_time == pytest.approx(busy + 1e-12, rel=1e-6)


@given(p=st.integers(2, 8), layers=st.lists(st.floats(1e4, 1e7), min_size=1, max_size=6), alpha=latencies,
       bandwidth=st.floats(1e8, 1e11), compute=st.floats(1e-3, 0.2), backward=st.floats(0.0, 1.0),
       reshard=st.booleans(), jitter=st.floats(0.0, 0.3), seed=st.integers(0, 2**16))
def test_prefetch_never_makes_a_step_slower(p, layers, alpha, bandwidth, compute, backward, reshard, jitter, seed):
    # Basis: prefetch issues every gather no later and in the same order on the communicator (gathers before
    # the reduce-scatter issued where they meet), and a schedule of max and + is monotone in its inputs.
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha), jitter=jitter)
    work = Workload(param_bytes=None, layers=layers, compute_time=compute, backward_fraction=backward)
    ahead = simulate(cluster, work, f"fsdp:unit_bytes=1,reshard={str(reshard).lower()}", steps=5, seed=seed)
    lazy = simulate(cluster, work, f"fsdp:unit_bytes=1,reshard={str(reshard).lower()},prefetch=false", steps=5,
                    seed=seed)
    assert (ahead.step_end <= lazy.step_end * (1 + 1e-12)).all()


@given(p=st.integers(1, 6), b=bandwidths, compute=st.floats(1e-3, 0.1))
def test_sharding_costs_nothing_on_an_infinitely_fast_network(p, b, compute):
    # Basis: with collectives free (latency 0, bandwidth far above the bytes) a sharded step is its compute.
    cluster = Cluster.homogeneous(p, Link(1e30))
    work = Workload(param_bytes=1e6, compute_time=compute)
    for scheme in SHARDED:
        assert simulate(cluster, work, scheme, steps=3).step_time == pytest.approx(compute, rel=1e-9)


# -- invariants ------------------------------------------------------------------------------------
links = st.builds(Link, bandwidth=st.floats(1e8, 1e12), latency=st.floats(0, 1e-4),
                  burst=st.sampled_from([0.0, 0.0, 1e5, 1e7]))


@st.composite
def configs(draw):
    cluster = Cluster(nodes=draw(st.integers(1, 4)), gpus_per_node=draw(st.integers(1, 4)),
                      nics_per_node=draw(st.integers(1, 4)), intra=draw(links), inter=draw(links),
                      collective_latency=draw(st.floats(0, 2e-5)), jitter=draw(st.floats(0, 0.5)),
                      straggler_prob=draw(st.floats(0, 0.3)), straggler_slowdown=draw(st.floats(1, 5)))
    layers = draw(layer_lists)
    workload = Workload(param_bytes=None if layers else draw(st.floats(1e3, 1e8)), layers=layers,
                        compute_time=draw(st.floats(1e-3, 0.2)), batch_size=draw(st.integers(1, 64)),
                        backward_fraction=draw(st.floats(0.0, 1.0)))
    return cluster, workload, draw(st.sampled_from(SHARDED)), draw(st.integers(1, 8)), draw(st.integers(0, 2**31))


@given(configs())
def test_sharded_runs_keep_the_engine_s_invariants(config):
    cluster, workload, scheme, steps, seed = config
    res = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    trace, updates, frame = res.trace, res.updates, res.collectives
    assert res.step_time > 0 and np.isfinite(res.throughput) and res.versions == steps
    assert (trace["end"] >= trace["start"]).all() and (trace["start"] >= 0).all()
    # every worker computes every step exactly once, and each compute follows the previous one
    computes = trace[trace["kind"] == "compute"]
    assert len(computes) == steps * cluster.gpus
    for _, rows in computes.groupby("worker"):
        rows = rows.sort_values("step")
        assert (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1] - 1e-12).all()
    # the communicator runs one collective at a time
    ordered = frame.sort_values(["start", "end"], kind="stable")
    slack = 1e-12 * (1 + ordered["end"].max())
    assert (ordered["start"].to_numpy()[1:] >= ordered["end"].to_numpy()[:-1] - slack).all()
    # a step's compute begins once the first unit it needs is gathered, and ends before the last reduce-scatter
    plan = parse(scheme).policy(workload.param_bytes, workload.layers, workload.backward_fraction).plan(0, 1)
    first_gather = type(plan[0]).__name__ == "AllGatherParameters"
    for step in range(steps):
        rows = frame[frame["step"] == step]
        started = computes[computes["step"] == step]
        if first_gather and cluster.gpus > 1:
            gathered = rows[rows["algorithm"] == "allgather"]["end"].iloc[0]
            assert (started["start"] >= gathered - 1e-12 * gathered).all()
        assert (started["end"] <= rows[rows["algorithm"] == "reducescatter"]["end"].max() * (1 + 1e-12)).all()
    # one update per worker-step, synchronous: staleness 0, one version per step
    assert len(updates) == steps * cluster.gpus and (updates["staleness"] == 0).all()
    assert not updates.duplicated(["worker", "step"]).any()
    assert sorted(updates["version_applied"].unique()) == list(range(steps))
    np.testing.assert_allclose(step_ends(trace, cluster.gpus, steps), res.step_end, rtol=1e-12, atol=0)


def test_a_plan_mixing_sharded_and_other_actions_is_refused():
    from dataclasses import dataclass

    from syncsim.schemes import LocalUpdate, Policy, ShardedOptimizerStep
    from syncsim.schemes.spec import Scheme

    @dataclass(frozen=True)
    class Mixed(Scheme):
        name = "mixed-test"

        def policy(self, param_bytes, layers=None, backward_fraction=2 / 3, shapes=None):
            return Policy.constant(self, param_bytes, layers, (LocalUpdate(), ShardedOptimizerStep()))

    with pytest.raises(ValueError, match="sharded actions only with the step's Compute"):
        simulate(Cluster.homogeneous(2, Link("1GB/s")), Workload(1e6, 1e-3), Mixed(), steps=2)
