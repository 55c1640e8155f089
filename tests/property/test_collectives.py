"""Collectives: the closed forms against textbook formulas and against the patterns built rank by rank."""

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.collectives import (
    allreduce_time,
    binomial_time,
    choose,
    hierarchical_time,
    ring_inter_hops,
    ring_time,
    tree_efficiency,
    tree_node_edges,
    tree_time,
)
from syncsim.schemes import AllReduce, LocalSGD
from tests.property.collective_reference import (
    btree_parents,
    chain_neighbours,
    critical_hops,
    dtree_parents,
    ring_pattern,
    tree_degrees,
    tree_height,
)

gpus = st.integers(1, 64)
sizes = st.floats(1e3, 1e9)
latencies = st.floats(0.0, 1e-4)
bandwidths = st.floats(1e8, 1e12)
shapes = st.tuples(st.integers(1, 24), st.integers(1, 9), st.integers(1, 12))  # nodes, GPUs per node, NICs


# Shapes random draws reach rarely: one node (NICs unused, fewer or more than GPUs), one GPU per node,
# two nodes, NVLink slower and faster than the NICs, sizes that are not whole bytes.
# (shape, n, a_i, b_i, a_n, b_n)
EDGE_CASES = [
    ((1, 8, 8), 1234.5, 3e-6, 240e9, 14e-6, 12e9),
    ((1, 4, 16), 5e6 + 0.5, 3e-6, 20e9, 14e-6, 48e9),
    ((2, 1, 1), 1e6 + 0.25, 3e-6, 1e9, 14e-6, 12e9),
    ((2, 1, 4), 333_333.3, 0.0, 1e12, 1e-5, 5e9),
    ((5, 1, 2), 7e7 + 0.5, 2e-6, 1e8, 1e-5, 25e9),
    ((3, 2, 8), 4e5 + 0.75, 1e-6, 50e9, 5e-6, 12e9),
]


def with_edge_cases(**extra):
    """Run a (shape, n, a_i, b_i, a_n, b_n, ...) property on EDGE_CASES too, each with ``extra`` arguments."""
    def decorate(test):
        for shape, n, a_i, b_i, a_n, b_n in EDGE_CASES:
            test = example(shape=shape, n=n, a_i=a_i, b_i=b_i, a_n=a_n, b_n=b_n, **extra)(test)
        return test
    return decorate


def _one_bucket(n: float, algorithm: str) -> AllReduce:
    return AllReduce(algorithm=algorithm, bucket_bytes=n * 2, overlap=False)  # one bucket, after backward


def _cluster(shape, a_i, b_i, a_n, b_n, launch=0.0):
    m, g, r = shape
    return Cluster(nodes=m, gpus_per_node=g, nics_per_node=r, intra=Link(b_i, a_i), inter=Link(b_n, a_n),
                   collective_latency=launch)


# Basis: ring all-reduce = reduce-scatter + all-gather, each p-1 steps of n/p bytes
# (Patarasuk & Yuan 2009): 2(p-1)·alpha + 2(p-1)/p · n/B, for one GPU and one NIC per node.
@given(gpus, sizes, latencies, bandwidths, st.floats(1e-3, 1.0))
def test_ring_is_the_textbook_ring_on_single_gpu_nodes(p, n, alpha, bandwidth, compute):
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha))
    res = simulate(cluster, Workload(n, compute), _one_bucket(n, "ring"), steps=3)
    expected = compute + (2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth if p > 1 else 0.0)
    assert res.step_time == pytest.approx(expected, rel=1e-12)


# Basis: NCCL's rings (one channel per NIC, each entering and leaving every node once, through a
# NIC of its exit GPU's rail). Built channel by channel, the busiest intra link and the busiest NIC
# carry what the closed form says, and the worst path of 2(p-1) hops crosses what it says.
@with_edge_cases(launch=7e-6)
@given(shapes, sizes, latencies, bandwidths, latencies, bandwidths, st.floats(0.0, 1e-4))
def test_ring_matches_the_channels_built_rank_by_rank(shape, n, a_i, b_i, a_n, b_n, launch):
    m, g, r = shape
    p = m * g
    pattern = ring_pattern(m, g, r, channels=r)
    per_edge = 2 * (p - 1) / p * n / r  # bytes one channel's ring edge carries
    busiest = max(max(pattern["intra_edges"]) * per_edge / b_i if g > 1 else 0.0,
                  max(pattern["nic_edges"]) * per_edge / b_n if m > 1 else 0.0)
    hops = critical_hops(pattern["turn"], 2 * (p - 1)) if p > 1 else {"intra": 0, "inter": 0}
    expected = launch + hops["intra"] * a_i + hops["inter"] * a_n + busiest if p > 1 else 0.0
    assert ring_time(_cluster(shape, a_i, b_i, a_n, b_n, launch), n) == pytest.approx(expected, rel=1e-12)
    assert ring_inter_hops(m, g) == hops["inter"]


def test_ring_spreads_over_every_nic():
    # Two DGX-class nodes: eight 25 GB/s NICs each. The ring's bandwidth is the node's 200 GB/s,
    # not one NIC's (the single-NIC model's order-of-magnitude error).
    eight = Cluster(nodes=2, gpus_per_node=8, nics_per_node=8, intra=Link("240GB/s"), inter=Link("200Gbit/s"))
    one = eight.replace(nics_per_node=1)
    n = 2**30
    assert ring_time(eight, n) == pytest.approx(2 * 15 / 16 * n / 200e9)
    assert ring_time(one, n) == pytest.approx(8 * ring_time(eight, n))


# Basis: NCCL's double binary tree (trees.cc): the btree rule and its mirror/shift. The closed form's
# per-node edge count D(m) and the ⌈log2 m⌉ levels are those of the trees built rank by rank (three
# nodes excepted: 3 edges there, charged 4 as NCCL's tuner does).
@pytest.mark.parametrize("m", range(1, 130))
def test_double_binary_tree_shape(m):
    first, second = dtree_parents(m)
    degrees = [a + b for a, b in zip(tree_degrees(first), tree_degrees(second))]
    assert max(degrees) == (tree_node_edges(m) if m != 3 else 3)
    assert max(tree_height(first), tree_height(second)) == (math.ceil(math.log2(m)) if m > 1 else 0)
    # every node is interior (more than one edge) in at most one of the two trees
    assert all(min(a, b) <= 1 for a, b in zip(tree_degrees(first), tree_degrees(second))) or m <= 2
    assert sorted(btree_parents(m)).count(-1) == 1


# Basis: NCCL's tuner (tuning.cc): tree busBw·0.92 times treeCorrectionFactor[Simple][log2(n/64)],
# 1 beyond the table (23 entries: 64 B .. 256 MiB).
@pytest.mark.parametrize("nbytes, factor", [(64, .9), (2**17, .5), (2**26, .8), (2**27, .9), (2**28, .9),
                                            (2**29, 1.0), (2**34, 1.0), (2**26 + 2**25, .8)])
def test_tree_efficiency_follows_nccl_tuner(nbytes, factor):
    assert tree_efficiency(nbytes) == pytest.approx(0.92 * factor)


# The Simple protocol's row of treeCorrectionFactor in NCCL's tuning.cc, index log2(n/64), as published.
NCCL_TREE_CORRECTION_SIMPLE = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
                               .9, .9)


@pytest.mark.parametrize("index", range(len(NCCL_TREE_CORRECTION_SIMPLE)))
def test_every_tree_correction_entry_is_nccl_s(index):
    low, high = 64 * 2**index, 64 * 2 ** (index + 1) - 1  # both ends of the entry's range of sizes
    for nbytes in (low, high):
        assert tree_efficiency(nbytes) == pytest.approx(0.92 * NCCL_TREE_CORRECTION_SIMPLE[index])


# Basis: the message is cut into ceil(n/chunk) equal chunks, a partial last one counting as one (NCCL
# and Horovod cut by size); with c chunks the pipeline is one chunk through the three phases, then one
# chunk per period max(scatter + gather, across) — the GPU link carries phases 1 and 3 together.
# The partial part is kept away from 0 and 1 so that float rounding of chunk·count cannot move the
# count across an integer; exact multiples are checked with a power-of-two chunk, where it is exact.
def _hierarchical_expected(shape, n, c, b_i, b_n):
    m, g, r = shape
    scatter = (g - 1) / g * (n / c) / b_i
    across = 2 * (m - 1) / m * (n / c) / (r * b_n)
    return 2 * scatter + across + (c - 1) * max(2 * scatter, across)


@given(shapes, st.floats(1e6, 1e9), bandwidths, bandwidths, st.integers(1, 39), st.floats(0.01, 0.99))
def test_hierarchical_counts_a_partial_chunk(shape, chunk, b_i, b_n, whole, partial):
    n = chunk * (whole + partial)
    cluster = _cluster(shape, 0.0, b_i, 0.0, b_n).replace(chunk_bytes=chunk)
    expected = _hierarchical_expected(shape, n, whole + 1, b_i, b_n)
    assert hierarchical_time(cluster, n) == pytest.approx(expected, rel=1e-9)


@given(shapes, st.integers(20, 30), bandwidths, bandwidths, st.integers(1, 40))
def test_hierarchical_counts_exact_multiples_of_the_chunk(shape, chunk_log2, b_i, b_n, count):
    chunk = float(2**chunk_log2)
    n = chunk * count
    cluster = _cluster(shape, 0.0, b_i, 0.0, b_n).replace(chunk_bytes=chunk)
    expected = _hierarchical_expected(shape, n, count, b_i, b_n)
    assert hierarchical_time(cluster, n) == pytest.approx(expected, rel=1e-9)


@with_edge_cases(launch=7e-6)
@given(shapes, sizes, latencies, bandwidths, latencies, bandwidths, st.floats(0.0, 1e-4))
def test_tree_matches_the_trees_built_rank_by_rank(shape, n, a_i, b_i, a_n, b_n, launch):
    m, g, r = shape
    if m * g == 1:
        return
    first, second = dtree_parents(m)
    node_edges = max(a + b for a, b in zip(tree_degrees(first), tree_degrees(second)))
    node_edges = 4 if m == 3 else node_edges  # NCCL's tuner charges three nodes as a full tree
    levels = max(tree_height(first), tree_height(second))
    # each tree carries n/2; every edge end sends n/2 (reduce up, broadcast down); NCCL's trees
    # reach 0.92 of their links, less on medium sizes (tuning.cc's treeCorrectionFactor)
    gpu = max(chain_neighbours(g)) * (n / 2) * 2 / b_i if g > 1 else 0.0
    nic = node_edges * (n / 2) / (r * b_n) if m > 1 else 0.0
    # each hop of the critical path also waits for a whole chunk (NCCL: 256 KiB at 12 GB/s)
    fill = 2 * ((g - 1) + levels) * min(256 * 2**10, n / 2) / 12e9
    expected = launch + 2 * ((g - 1) * a_i + levels * a_n) + fill + max(gpu, nic) / tree_efficiency(n)
    assert tree_time(_cluster(shape, a_i, b_i, a_n, b_n, launch), n) == pytest.approx(expected, rel=1e-12)


# Basis: with one chunk the hierarchical all-reduce is three phases one after another (Horovod's
# unpipelined form): ring reduce-scatter over g, ring all-reduce of n/g over m on a rail of r·B_n/g,
# ring all-gather over g (Thakur et al. 2005 for each ring).
@with_edge_cases()
@given(shapes, sizes, latencies, bandwidths, latencies, bandwidths)
def test_hierarchical_unpipelined_is_the_sum_of_its_phases(shape, n, a_i, b_i, a_n, b_n):
    m, g, r = shape
    cluster = _cluster(shape, a_i, b_i, a_n, b_n).replace(chunk_bytes=n)
    scatter = (g - 1) * a_i + (g - 1) / g * n / b_i
    across = 2 * (m - 1) * a_n + 2 * (m - 1) / m * (n / g) / (r * b_n / g)
    assert hierarchical_time(cluster, n) == pytest.approx(2 * scatter + across, rel=1e-12)


# Basis: pipelining overlaps the phases, so it is never slower than running them in turn, and it
# can never beat the busier resource moving its bytes alone (2(g-1)/g·n on each GPU link for the
# scatter and gather, 2(m-1)/m·n through the node's NICs).
@given(shapes, st.floats(1e6, 1e9), bandwidths, bandwidths, st.floats(1e4, 1e8))
def test_hierarchical_pipeline_bounds(shape, n, b_i, b_n, chunk):
    m, g, r = shape
    cluster = _cluster(shape, 0.0, b_i, 0.0, b_n).replace(chunk_bytes=chunk)
    pipelined = hierarchical_time(cluster, n)
    serial = hierarchical_time(cluster.replace(chunk_bytes=n), n)
    floor = max(2 * (g - 1) / g * n / b_i, 2 * (m - 1) / m * n / (r * b_n))
    assert floor * (1 - 1e-12) <= pipelined <= serial * (1 + 1e-12)


# Basis: binomial reduce then broadcast (Thakur et al. 2005), every round at the slowest hop.
@example(m=1, g=2, n=1e6, a_i=1e-6, b_i=1e10, a_n=1e-5, b_n=1e9)
@example(m=2, g=1, n=1e6, a_i=1e-4, b_i=1e8, a_n=1e-5, b_n=1e9)  # the idle intra link must not count
@example(m=4, g=1, n=3e5, a_i=1e-4, b_i=1e8, a_n=1e-5, b_n=1e9)
@given(st.integers(1, 8), st.integers(1, 8), sizes, latencies, bandwidths, latencies, bandwidths)
def test_binomial_closed_form(m, g, n, a_i, b_i, a_n, b_n):
    cluster = Cluster(nodes=m, gpus_per_node=g, intra=Link(b_i, a_i), inter=Link(b_n, a_n))
    used = [link for link, on in ((cluster.intra, g > 1), (cluster.inter, m > 1)) if on]
    rounds = math.ceil(math.log2(m * g)) if m * g > 1 else 0
    expected = 2 * rounds * (max(x.latency for x in used) + n / min(x.bandwidth for x in used)) if used else 0.0
    assert binomial_time(cluster, n) == pytest.approx(expected, rel=1e-12)


# Basis: NCCL's tuner runs, per collective, the algorithm its model predicts fastest.
@given(shapes, st.floats(1e2, 1e10))
def test_auto_takes_the_fastest_nccl_algorithm(shape, n):
    cluster = _cluster(shape, 2e-6, 240e9, 5e-6, 25e9, 8e-6)
    name, seconds = choose("auto", n, cluster)
    assert seconds == min(ring_time(cluster, n), tree_time(cluster, n))
    assert name in ("ring", "tree") and choose(name, n, cluster)[1] == seconds


def test_auto_switches_from_tree_to_ring_as_messages_grow_and_records_it():
    # 4 DGX-class nodes: small buckets are latency-bound (the tree's 2·log2 m inter hops beat the
    # ring's 2m), large ones bandwidth-bound (the ring sends 2(p-1)/p·n per node, the tree 2n).
    cluster = Cluster.preset("a100-100g", gpus=32)
    small, large = choose("auto", 64 * 2**10, cluster), choose("auto", 1 * 2**30, cluster)
    assert small[0] == "tree" and large[0] == "ring"
    workload = Workload(param_bytes=float(2**30 + 2**16), layers=(2**30, 2**16), compute_time=0.1)
    res = simulate(cluster, workload, AllReduce(bucket_bytes=2**16), steps=2)
    ran = res.collectives.groupby("bytes")["algorithm"].first()
    assert ran[float(2**16)] == "tree" and ran[float(2**30)] == "ring"


# Basis: with overlap, bucket b starts when backward has produced it (and bucket b-1 is done), so
# the step ends max(compute, last-bucket-ready) + cost of what is left; never later than no overlap.
@given(st.integers(2, 32), st.integers(1, 12), st.floats(1e-3, 0.2))
def test_overlap_never_slower_and_bounded(p, layers, compute):
    workload = Workload(param_bytes=None, layers=[4e6] * layers, compute_time=compute)
    cluster = Cluster.homogeneous(p, Link("10GB/s", "5us"))
    overlapped = simulate(cluster, workload, AllReduce(algorithm="ring", bucket_bytes=4e6), steps=3).step_time
    serial = simulate(cluster, workload, AllReduce(algorithm="ring", bucket_bytes=4e6, overlap=False),
                      steps=3).step_time
    last_bucket = 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * 4e6 / 10e9
    assert overlapped <= serial * (1 + 1e-12)
    assert overlapped >= compute + last_bucket - 1e-12


def test_local_sgd_communicates_every_period():
    cluster = Cluster.homogeneous(8, Link("1GB/s", "10us"))
    n, compute = 1e8, 0.05
    res = simulate(cluster, Workload(n, compute), LocalSGD(period=4, algorithm="ring"), steps=16)
    average = 2 * 7 * 10e-6 + 2 * 7 / 8 * n / 1e9
    assert res.makespan == pytest.approx(16 * compute + 4 * average, rel=1e-12)
    assert (res.trace["kind"] == "average").sum() == 4 * 8


# Basis: on token-bucket links (tc-tbf) that idle through each compute long enough to refill, the
# first `burst` bytes each link carries pass at once: the ring's transmission term loses burst/B.
@given(st.integers(2, 16), sizes, latencies, bandwidths, st.floats(0, 1e7))
def test_ring_on_links_with_a_burst(p, n, alpha, bandwidth, burst):
    compute = max(1e-3, 2 * burst / bandwidth)  # the bucket refills during every compute
    cluster = Cluster.homogeneous(p, Link(bandwidth, alpha, burst=burst))
    res = simulate(cluster, Workload(n, compute), AllReduce(algorithm="ring", bucket_bytes=2 * n, overlap=False),
                   steps=3)
    wire = 2 * (p - 1) / p * n
    expected = compute + 2 * (p - 1) * alpha + max(0.0, wire - burst) / bandwidth
    assert res.step_time == pytest.approx(expected, rel=1e-9)


# Basis: back-to-back buckets leave the bucket no time to refill: the second gets what the first left.
@given(st.integers(2, 16), sizes, bandwidths, st.floats(0, 1e7))
def test_back_to_back_buckets_share_one_burst(p, n, bandwidth, burst):
    compute = max(1e-3, 2 * burst / bandwidth)
    cluster = Cluster.homogeneous(p, Link(bandwidth, 0.0, burst=burst))
    res = simulate(cluster, Workload(n, compute), AllReduce(algorithm="ring", bucket_bytes=n / 2, overlap=False),
                   steps=3)
    wire = 2 * (p - 1) / p * n / 2  # each of the two buckets
    first = min(burst, wire)
    second = min(burst - first, wire)
    assert res.step_time == pytest.approx(compute + (2 * wire - first - second) / bandwidth, rel=1e-9)


# Basis: tc-tbf refills its bucket at its own rate R all the time (tc-tbf(8)), whatever rate what
# crosses it reaches. A collective sending at B < R leaves (R - B) per second of its sending in the
# bucket, and a compute spell c adds R c. Once those refill what the first collective took from a full
# bucket, min(burst, wire), every collective meets the bucket the first met, and each step costs
# compute + 2(p-1)α + max(0, wire - burst)/B. (Refilled at B instead, the steps after the first cost
# more: what this compute gives back at B is less than what the first collective took.)
@given(st.integers(2, 16), sizes, latencies, st.floats(1e7, 1e10), st.floats(1.2, 20), st.floats(1e3, 1e7))
def test_a_bucket_refilled_at_the_shaper_s_rate_meets_every_collective_as_full_as_the_first(
        p, n, alpha, bandwidth, faster, burst):
    wire = 2 * (p - 1) / p * n
    refill = faster * bandwidth
    rest = max(0.0, wire - burst) / bandwidth  # the first collective's sending at B, after the bucket
    compute = max(1e-6, (min(burst, wire) - rest * (refill - bandwidth)) / refill * 1.001)
    link = Link(bandwidth, alpha, burst=burst, refill=refill)
    res = simulate(Cluster.homogeneous(p, link), Workload(n, compute),
                   AllReduce(algorithm="ring", bucket_bytes=2 * n, overlap=False), steps=6)
    expected = compute + 2 * (p - 1) * alpha + rest
    assert res.step_time == pytest.approx(expected, rel=1e-9)
    collectives = res.collectives
    assert (collectives["end"] - collectives["start"]).to_numpy() == pytest.approx(expected - compute, rel=1e-9)


# Basis: a token bucket of b bytes refilled at R lets at most b + R t bytes through in any t from a
# full bucket (tc-tbf(8)): by the end of every collective, the bytes the ring sent over each link
# since the start are at most burst + R x that time, whatever the compute, latency and buckets.
@given(st.integers(2, 8), sizes, latencies, st.floats(1e7, 1e10), st.floats(1, 20), st.floats(0, 1e7),
       st.floats(1e-6, 1e-1), st.sampled_from([1, 2, 3]))
def test_a_shaped_link_never_passes_more_than_its_bucket_and_refill(p, n, alpha, bandwidth, faster, burst,
                                                                    compute, buckets):
    refill = faster * bandwidth
    link = Link(bandwidth, alpha, burst=burst, refill=refill)
    res = simulate(Cluster.homogeneous(p, link), Workload(n, compute),
                   AllReduce(algorithm="ring", bucket_bytes=n / buckets * 1.0001, overlap=False), steps=5)
    collectives = res.collectives.sort_values("end")
    sent = (2 * (p - 1) / p * collectives["bytes"]).cumsum().to_numpy()
    allowed = burst + refill * collectives["end"].to_numpy()
    assert (sent <= allowed * (1 + 1e-9)).all()


# Basis: with one GPU there is nobody to exchange with, and zero bytes need no exchange: every
# algorithm costs nothing (a mutation survivor charged a lone tree a second).
# Basis: any message, however small, is a collective: it pays the launch and its hops' latencies.
@pytest.mark.parametrize("algorithm", ["auto", "ring", "tree", "hierarchical", "binomial"])
@pytest.mark.parametrize("nbytes", [0.5, 1.0, 4.0])
def test_a_tiny_message_still_pays_the_launch(algorithm, nbytes):
    cluster = Cluster(nodes=2, gpus_per_node=4, intra=Link("100GB/s", "2us"), inter=Link("10GB/s", "5us"),
                      collective_latency="8us")
    assert allreduce_time(algorithm, nbytes, cluster) >= 8e-6 + 2e-6


@pytest.mark.parametrize("algorithm", ["auto", "ring", "tree", "hierarchical", "binomial"])
def test_nothing_to_reduce_costs_nothing(algorithm):
    alone = Cluster.homogeneous(1, Link("10GB/s", "5us"))
    assert allreduce_time(algorithm, 1e6, alone) == 0.0
    assert allreduce_time(algorithm, 0.0, Cluster(nodes=2, gpus_per_node=4, intra=Link("100GB/s", "2us"),
                                                  inter=Link("10GB/s", "5us"))) == 0.0
