"""The simulator's synchronous steps reduce exactly to the textbook closed forms."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.schemes import AllReduce, LocalSGD

gpus = st.integers(1, 64)
sizes = st.floats(1e3, 1e9)
latencies = st.floats(0.0, 1e-4)
bandwidths = st.floats(1e8, 1e12)


def _one_bucket(n: float) -> dict:
    return dict(bucket_bytes=n * 2, overlap=False)  # one bucket, all-reduce after backward


# Basis: ring all-reduce = reduce-scatter + all-gather, each p-1 steps of n/p bytes
# (Patarasuk & Yuan 2009): 2(p-1)·alpha + 2(p-1)/p · n/B.
@given(gpus, sizes, latencies, bandwidths, st.floats(1e-3, 1.0))
def test_ring_closed_form(p, n, alpha, bandwidth, compute):
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha))
    res = simulate(cluster, Workload(n, compute), AllReduce(**_one_bucket(n)), steps=3)
    expected = compute + (2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth if p > 1 else 0.0)
    assert res.step_time == pytest.approx(expected, rel=1e-12)


# Basis: binomial-tree reduce then broadcast (Thakur et al. 2005): 2·ceil(log2 p)·(alpha + n/B).
@given(gpus, sizes, latencies, bandwidths)
def test_tree_closed_form(p, n, alpha, bandwidth):
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha))
    res = simulate(cluster, Workload(n, 0.01), AllReduce(algorithm="tree", **_one_bucket(n)), steps=2)
    rounds = math.ceil(math.log2(p)) if p > 1 else 0
    assert res.step_time == pytest.approx(0.01 + 2 * rounds * (alpha + n / bandwidth), rel=1e-12)


# Basis: hierarchical = intra reduce (Rabenseifner: 2·lg g·a + 2(g-1)/g·n/B) + inter ring over
# m nodes + intra broadcast (van de Geijn: (lg g + g - 1)·a + 2(g-1)/g·n/B), Thakur et al. 2005.
@given(st.integers(1, 8), st.integers(1, 8), sizes, latencies, bandwidths, latencies, bandwidths)
def test_hierarchical_closed_form(m, g, n, a_intra, b_intra, a_inter, b_inter):
    cluster = Cluster(nodes=m, gpus_per_node=g, intra=Link(b_intra, a_intra), inter=Link(b_inter, a_inter))
    res = simulate(cluster, Workload(n, 0.01), AllReduce(algorithm="hierarchical", **_one_bucket(n)), steps=2)
    lg = math.ceil(math.log2(g)) if g > 1 else 0
    intra = 0.0 if g == 1 else (2 * lg * a_intra + 2 * (g - 1) / g * n / b_intra
                                + (lg + g - 1) * a_intra + 2 * (g - 1) / g * n / b_intra)
    inter = 0.0 if m == 1 else 2 * (m - 1) * a_inter + 2 * (m - 1) / m * n / b_inter
    assert res.step_time == pytest.approx(0.01 + intra + inter, rel=1e-12)


# Basis: a flat ring across nodes moves at its slowest hop (largest alpha, smallest B).
def test_flat_ring_across_nodes_uses_slowest_hop():
    fast, slow = Link("300GB/s", "2us"), Link("100Gbit/s", "5us")
    cluster = Cluster(nodes=4, gpus_per_node=8, intra=fast, inter=slow)
    n = 1e8
    res = simulate(cluster, Workload(n, 0.01), AllReduce(**_one_bucket(n)), steps=2)
    p = 32
    assert res.step_time == pytest.approx(0.01 + 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * n / 12.5e9, rel=1e-12)


# Basis: with overlap, bucket b starts when backward has produced it (and bucket b-1 is done), so
# the step ends max(compute, last-bucket-ready) + cost of what is left; never later than no overlap.
@given(st.integers(2, 32), st.integers(1, 12), st.floats(1e-3, 0.2))
def test_overlap_never_slower_and_bounded(p, layers, compute):
    workload = Workload(param_bytes=None, layers=[4e6] * layers, compute_time=compute)
    cluster = Cluster.homogeneous(p, Link("10GB/s", "5us"))
    overlapped = simulate(cluster, workload, AllReduce(bucket_bytes=4e6), steps=3).step_time
    serial = simulate(cluster, workload, AllReduce(bucket_bytes=4e6, overlap=False), steps=3).step_time
    last_bucket = 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * 4e6 / 10e9
    assert overlapped <= serial * (1 + 1e-12)
    assert overlapped >= compute + last_bucket - 1e-12


def test_local_sgd_communicates_every_period():
    cluster = Cluster.homogeneous(8, Link("1GB/s", "10us"))
    n, compute = 1e8, 0.05
    res = simulate(cluster, Workload(n, compute), LocalSGD(period=4), steps=16)
    average = 2 * 7 * 10e-6 + 2 * 7 / 8 * n / 1e9
    assert res.makespan == pytest.approx(16 * compute + 4 * average, rel=1e-12)
    assert (res.trace["kind"] == "average").sum() == 4 * 8
