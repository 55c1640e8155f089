"""All-reduce as NCCL runs it on multi-GPU, multi-NIC nodes: closed forms, and NCCL's choice.

Notation: m nodes of g GPUs (p = m·g), n bytes per GPU. The intra-node link
gives each GPU B_i bytes/s of egress (each direction) and α_i per hop; one NIC
gives B_n and α_n, a node has r NICs (``Cluster.nics_per_node``), so it sends
r·B_n to other nodes; L is the fixed cost of launching a collective
(``Cluster.collective_latency``). Reduction arithmetic is left out: it runs at
GPU memory bandwidth, far above any link's.

Every algorithm costs

    T = L + (latencies of the hops one piece of data crosses, in sequence)
          + (bytes on the busiest resource) / (that resource's bandwidth),

the shape of NCCL's own cost model (src/graph/tuning.cc, ``ncclTopoTuneModel``:
time = latency + bytes / bandwidth, latency = base latency + per-hop latencies
by link type). The resources are each GPU's egress (B_i) and each node's NICs
(r·B_n). A term whose resource is absent drops out (B_i when g = 1, the NICs
when m = 1).

The resources: each GPU's intra link carries its GPU-to-GPU sends (a GPU
hands inter-node data to its NIC over PCIe, a separate path); each NIC its
node's sends to other nodes.

ring — NCCL's rings (src/graph/search.cc, rings.cc): one channel per NIC (or
a multiple), each a ring through all p GPUs that enters and leaves every node
once, leaving through its own NIC from a GPU on that NIC's rail, so a
collective drives all of a node's NICs. Ring all-reduce is reduce-scatter then
all-gather, 2(p−1) steps of n/p per channel-share: every GPU sends 2(p−1)/p·n,
and so does every node across its boundary, spread over its r NICs. A GPU's
sends go over its intra link except on the channels it is the exit of; with
channels spread evenly over the rails, the least-used GPU exits ⌊r/g⌋ of
every r channels, so the busiest intra link carries a share
s = 1 − ⌊r/g⌋/r of 2(p−1)/p·n (s = 1 when GPUs outnumber NICs or m = 1).
The latency is the critical path: the
piece of data whose 2(p−1) consecutive hops cross the most node boundaries,
h_n = 2m when g ≥ 3 (two full turns of the ring less two intra hops;
tuning.cc also counts 2·nNodes inter steps), 2m − 1 when g = 2, 2(m − 1) when
g = 1, and h_i = 2(p−1) − h_n intra hops:

    T_ring = L + h_i·α_i + h_n·α_n + 2(p−1)/p · n · max(s/B_i, 1/(r·B_n)).

With g = 1, r = 1 and L = 0 it is the textbook ring 2(p−1)α + 2(p−1)/p·n/B
(Patarasuk & Yuan 2009).

tree — NCCL's pipelined double binary tree (Sanders, Speck & Träff 2009;
src/graph/trees.cc): inside a node a chain of the g GPUs; across nodes two
binary trees over the m nodes, each carrying half the data, the second the
mirror (m even) or the shift by one (m odd) of the first, so that a node is
interior in at most one. Reduce flows up and broadcast down at once, in
chunks, so the bandwidth term is the busiest resource once, not log₂ m times
the message. On every tree edge each endpoint sends n/2 (reduce up, broadcast
down), so a node's NIC egress is n/2 per edge it has in the two trees: one
each on two nodes (n: half of what a ring sends, the "2x less traffic on the
network" of two-node trees, NCCL issue 946), and up to 3 + 1 from four nodes
on (2n). Three nodes leave the busiest 3 edges in our count, but NCCL's tuner
charges the full 2n beyond two nodes (it runs on ``bwInter`` there, with the
same 1/2 algorithm-bandwidth ratio), and what the tuner believes decides what
runs, so D = 0, 2, 4, 4 for m = 1, 2, 3, ≥ 4. A GPU inside the chain sends n/2
to each chain neighbour per tree: E_gpu = 2n when g ≥ 3 (n when g = 2, the
chain's ends talking to the NIC or to nobody). NCCL's tree reaches 0.92 of
its links' bandwidth (tuning.cc: ``busBw*.92`` for trees), and less on
medium messages, by NCCL's measured correction per power of two of the size
(tuning.cc, ``treeCorrectionFactor``, Simple protocol: 0.5 around 128 KiB to
8 MiB, 0.8 at 64 MiB, 0.9 at 128 and 256 MiB, 1 from 512 MiB): the model
takes both over as the tree's efficiency e(n). The critical path runs up the chain and the ⌈log₂ m⌉ levels of
the taller tree and back down, H = 2((g−1) + ⌈log₂ m⌉) hops (tuning.cc
charges 2·((g−1)·α_i + log2i(m)·α_n), rounding the levels down), and on each
hop a chunk must arrive whole before it is passed on: the pipeline's fill,
which NCCL's tuner folds into its tree latency ("Tree/Simple is the latency
a 256kB chunk, which is ~ base lat + 256k/12GB/s", tuning.cc, NCCL 2.7), so
each hop adds c/12 GB/s with c = min(256 KiB, n/2):

    T_tree = L + 2((g−1)·α_i + ⌈log₂ m⌉·α_n) + H·c/(12 GB/s)
               + max(E_gpu/B_i, D(m)·n/2 / (r·B_n)) / e(n).

hierarchical — intra-node reduce-scatter (ring over g GPUs), then each GPU
all-reduces its 1/g shard across nodes over its own rail (a ring over m nodes;
all g rails at once share the node's r NICs, r·B_n/g each), then intra-node
all-gather (Horovod's hierarchical all-reduce, Sergeev & Del Balso 2018, in the
rail-parallel form of Jia et al. 2018). The phases are pipelined: the message
is cut into N = ⌈n/c⌉ equal chunks of the ``Cluster.chunk_bytes`` granularity
c (NCCL's per-channel buffer) and a chunk moves to the next phase as soon as
it is done. Per chunk of size c' = n/N the phases take τ₁ = τ₃ =
(g−1)/g·c'/B_i and τ₂ = 2(m−1)/m·(c'/g)/(r·B_n/g). The first chunk passes all
three (Σ τ); after it, a chunk leaves every period P, the busier of the two
resources per chunk: each GPU's link carries phases 1 and 3 of different
chunks at once (τ₁ + τ₃), the rails phase 2 (τ₂). Each phase's latency is
paid once:

    T_hier = L + 2(g−1)·α_i + 2(m−1)·α_n + Σ_s τ_s + (N−1)·max(τ₁ + τ₃, τ₂).

One chunk (c ≥ n) is Horovod's unpipelined sum of the three phases; many
chunks approach n·max(2(g−1)/g/B_i, 2(m−1)/m/(r·B_n)), the busier resource
alone; the chunk size sets how much of the fill (Σ τ − P) is exposed.

binomial — the textbook short-message tree of MPI libraries (binomial reduce
then broadcast over all p GPUs, Thakur, Rabenseifner & Gropp 2005),
unpipelined, every round at the slowest hop: 2⌈log₂ p⌉·(α + n/B). Not an
NCCL algorithm; kept as the contrast the pipelined tree improves on.

all-gather (``allgather_time``, what top-k's sparse gradients travel by) — one turn of NCCL's
rings: p − 1 steps, each GPU sending (p − 1)·n of the gathered p·n over the ring all-reduce's
resources; its critical path is p − 1 consecutive hops (``allgather_inter_hops`` of them between
nodes).

reduce-scatter (``reducescatter_time``, ZeRO's and FSDP's gradients) — the all-gather run backwards: one
turn of NCCL's rings, p − 1 steps, in which every GPU sends and receives (p − 1)/p of its n bytes, adding
what it receives to its own (tuning.cc gives ReduceScatter the all-gather's ``nsteps = nRanks-1`` and
``nInterSteps = nNodes-1``, and runs both on rings only). Its time is therefore the all-gather's with each
GPU contributing n/p; ZeRO's and FSDP's parameter all-gathers (``AllGatherParameters``) are priced the same
way, each GPU contributing its 1/p shard of the gathered n. A reduce-scatter then an all-gather move a ring
all-reduce's bytes (2(p − 1)/p · n per GPU), with two launches and two ring passes of latency.

auto — what NCCL's tuner does for each collective: the fastest of the
algorithms it has, ring and tree (its CollNet and NVLS algorithms need
switch-side reduction, not modelled; ``hierarchical`` and ``binomial`` are
not NCCL algorithms).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from syncsim.cluster import Cluster

__all__ = [
    "ALGORITHMS", "NCCL_ALGORITHMS", "allreduce_time", "allgather_time", "allgather_inter_hops", "choose",
    "reducescatter_time", "sharded_allgather_time",
    "ring_time", "tree_time", "hierarchical_time", "binomial_time", "tree_node_edges", "ring_inter_hops",
    "tree_efficiency",
    "pipeline_time",
]

NCCL_ALGORITHMS = ("ring", "tree")
# Fraction of its links' bandwidth NCCL's tree reaches (src/graph/tuning.cc, ncclTopoTuneModel: busBw*.92),
# times NCCL's measured correction for medium sizes (tuning.cc, treeCorrectionFactor, Simple protocol
# row, NCCL 2.20), indexed by log2(bytes / 64); sizes past the table's end are not corrected.
TREE_EFFICIENCY = 0.92
TREE_CORRECTION = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)


def tree_efficiency(nbytes: float) -> float:
    """e(n): the fraction of its links' bandwidth NCCL's tree reaches on a message of ``nbytes``."""
    index = max(0, int(nbytes) >> 6).bit_length() - 1
    return TREE_EFFICIENCY * (TREE_CORRECTION[max(index, 0)] if index < len(TREE_CORRECTION) else 1.0)
# A tree hop forwards whole chunks: NCCL's tuner charges each hop "the latency a 256kB chunk, which is
# ~ base lat + 256k/12GB/s" (tuning.cc, NCCL 2.7, above its hwLat table).
TREE_CHUNK_BYTES = 256 * 2**10
TREE_CHUNK_BANDWIDTH = 12e9
ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "binomial")


def tree_node_edges(nodes: int) -> int:
    """D(m): tree edges charged to the busiest node of NCCL's double binary tree over ``nodes`` nodes.

    An interior node of a binary tree has a parent and up to two children, a
    leaf one edge, and the second tree makes the first one's interior nodes
    leaves: at most 3 + 1 edges. Two nodes have one edge in each tree. Three
    nodes leave at most 3 (the trees built rank by rank in tests/property),
    but NCCL's tuner charges 4 from three nodes on, and so does the model.
    """
    return 0 if nodes <= 1 else 2 if nodes == 2 else 4


def ring_inter_hops(nodes: int, gpus_per_node: int) -> int:
    """Node boundaries on the ring's critical path: the most that 2(p−1) consecutive hops cross."""
    if nodes == 1:
        return 0
    return {1: 2 * (nodes - 1), 2: 2 * nodes - 1}.get(gpus_per_node, 2 * nodes)


def _log2_ceil(n: int) -> int:
    return 0 if n <= 1 else (n - 1).bit_length()


def _terms(cluster: Cluster) -> tuple[int, int, float, float, float]:
    """(m, g, α_i, B_i, α_n) of a cluster; a link it lacks costs nothing and never binds."""
    intra, inter = cluster.intra, cluster.inter
    a_i, b_i = (0.0, math.inf) if intra is None else (intra.latency, intra.bandwidth)
    a_n = 0.0 if inter is None else inter.latency
    return cluster.nodes, cluster.gpus_per_node, a_i, b_i, a_n  # type: ignore[return-value]


def ring_time(cluster: Cluster, nbytes: float) -> float:
    m, g, a_i, b_i, a_n = _terms(cluster)
    p = m * g
    if p <= 1 or nbytes <= 0:
        return 0.0
    r = cluster.nics_per_node
    share = 1 - (r // g) / r if m > 1 else 1.0  # of a GPU's sends that go over its intra link
    per_byte = max(share / b_i if g > 1 else 0.0, 1 / cluster.node_bandwidth if m > 1 else 0.0)
    inter = ring_inter_hops(m, g)
    hops = (2 * (p - 1) - inter) * a_i + inter * a_n
    return cluster.collective_latency + hops + 2 * (p - 1) / p * nbytes * per_byte  # type: ignore[operator]


def tree_time(cluster: Cluster, nbytes: float) -> float:
    m, g, a_i, b_i, a_n = _terms(cluster)
    if m * g <= 1 or nbytes <= 0:
        return 0.0
    # chain neighbours of the busiest GPU: two inside a chain of three or more, one for g = 2
    chain_edges = min(2, g - 1)
    gpu_time = chain_edges * nbytes / b_i if chain_edges else 0.0  # n/2 per edge per tree, two trees
    nic_time = tree_node_edges(m) * nbytes / 2 / cluster.node_bandwidth if m > 1 else 0.0
    hops = 2 * ((g - 1) * a_i + _log2_ceil(m) * a_n)
    fill = 2 * ((g - 1) + _log2_ceil(m)) * min(TREE_CHUNK_BYTES, nbytes / 2) / TREE_CHUNK_BANDWIDTH
    return (cluster.collective_latency + hops + fill  # type: ignore[operator]
            + max(gpu_time, nic_time) / tree_efficiency(nbytes))


def pipeline_time(stage_times: tuple[float, ...], period: float, chunks: int) -> float:
    """``chunks`` equal chunks through ``stage_times``: the first passes every stage, the rest one per ``period``."""
    return sum(stage_times) + (chunks - 1) * period


def hierarchical_time(cluster: Cluster, nbytes: float) -> float:
    m, g, a_i, b_i, a_n = _terms(cluster)
    if m * g <= 1 or nbytes <= 0:
        return 0.0
    chunks = max(1, math.ceil(nbytes / cluster.chunk_bytes))  # type: ignore[operator]
    chunk = nbytes / chunks
    scatter = (g - 1) / g * chunk / b_i if g > 1 else 0.0
    # each GPU's shard c/g over its rail, which gets r·B_n/g of the node's NICs
    across = 2 * (m - 1) / m * chunk / cluster.node_bandwidth if m > 1 else 0.0
    hops = 2 * (g - 1) * a_i + 2 * (m - 1) * a_n
    period = max(2 * scatter, across)  # the GPU link carries phases 1 and 3 of different chunks at once
    stages = pipeline_time((scatter, across, scatter), period, chunks)
    return cluster.collective_latency + hops + stages  # type: ignore[operator]


def binomial_time(cluster: Cluster, nbytes: float) -> float:
    p = cluster.gpus
    if p <= 1 or nbytes <= 0:
        return 0.0
    links = [link for link, used in ((cluster.intra, cluster.gpus_per_node > 1), (cluster.inter, cluster.nodes > 1))
             if used and link is not None]
    latency = max(link.latency for link in links)  # type: ignore[type-var]
    bandwidth = min(link.bandwidth for link in links)  # type: ignore[type-var]
    return cluster.collective_latency + 2 * _log2_ceil(p) * (latency + nbytes / bandwidth)  # type: ignore[operator]


_TIMES: dict[str, Callable[[Cluster, float], float]] = {
    "ring": ring_time, "tree": tree_time, "hierarchical": hierarchical_time, "binomial": binomial_time,
}


def choose(algorithm: str, nbytes: float, cluster: Cluster) -> tuple[str, float]:
    """(the algorithm that runs, its seconds) for one all-reduce; ``auto`` takes NCCL's fastest."""
    if algorithm == "auto":
        return min(((name, _TIMES[name](cluster, nbytes)) for name in NCCL_ALGORITHMS), key=lambda pair: pair[1])
    if algorithm not in _TIMES:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return algorithm, _TIMES[algorithm](cluster, nbytes)


def allgather_inter_hops(nodes: int, gpus_per_node: int) -> int:
    """Node boundaries on the all-gather's critical path: the most that p − 1 consecutive hops of a ring
    cross. A ring enters and leaves every node once, so one turn (p hops) crosses m boundaries; p − 1
    hops leave one hop out, an intra-node one when g ≥ 2 (m boundaries), a boundary when g = 1 (m − 1)."""
    if nodes == 1:
        return 0
    return nodes - 1 if gpus_per_node == 1 else nodes


def allgather_time(cluster: Cluster, nbytes: float, traffic: float = 1.0) -> float:
    """Seconds for a ring all-gather in which each of the p GPUs contributes ``nbytes``.

    NCCL runs all-gather on its rings only, one pass of p − 1 steps where all-reduce makes 2(p − 1)
    (src/graph/tuning.cc, ncclTopoTuneModel: ``nsteps = nRanks-1`` for AllGather; NCCL's tuner prices
    it as latency + nBytes/algBw with nBytes the gathered p·n, src/include/info.h's ncclInfoSetDerived,
    and algBw = busBw·p/(p − 1)):
    every GPU sends, and receives, the other p − 1 contributions, (p − 1)·n bytes, through the same
    resources as ring all-reduce's, so its bus bandwidth is the all-reduce's (nccl-tests,
    doc/PERFORMANCE.md: busBw = algBw·(p − 1)/p for all-gather, 2(p − 1)/p for all-reduce). A piece of
    data crosses p − 1 consecutive hops (allgather_inter_hops of them between nodes):

        T = L + (p − 1 − h_n)·α_i + h_n·α_n + (p − 1)·n·max(s/B_i, 1/(r·B_n)),

    with s the busiest GPU's share of its sends over its intra link (as for the ring all-reduce). With
    g = 1, r = 1 and L = 0 it is the textbook ring all-gather (p − 1)·α + (p − 1)·n/B (Thakur,
    Rabenseifner & Gropp 2005, the ring allgather). ``traffic`` multiplies the last term: how many times
    the ring's bytes a backend that is not NCCL's ring keeps the busiest link busy for (Cluster's
    ``reducescatter_traffic`` and ``allgather_traffic``)."""
    m, g, a_i, b_i, a_n = _terms(cluster)
    p = m * g
    if p <= 1 or nbytes <= 0:
        return 0.0
    r = cluster.nics_per_node
    share = 1 - (r // g) / r if m > 1 else 1.0  # of a GPU's sends that go over its intra link (ring_time)
    per_byte = max(share / b_i if g > 1 else 0.0, 1 / cluster.node_bandwidth if m > 1 else 0.0)
    inter = allgather_inter_hops(m, g)
    hops = (p - 1 - inter) * a_i + inter * a_n
    return cluster.collective_latency + hops + traffic * (p - 1) * nbytes * per_byte  # type: ignore[operator]


def reducescatter_time(cluster: Cluster, nbytes: float) -> float:
    """Seconds for a ring reduce-scatter of ``nbytes`` per GPU: each of the p GPUs ends with the sum of its
    1/p shard.

    NCCL runs it on its rings only, as one pass of p − 1 steps like all-gather (src/graph/tuning.cc,
    ncclTopoTuneModel at NVIDIA/nccl 01afd20a: ``nsteps = nRanks-1`` and ``nInterSteps = nNodes-1`` for
    ncclCollReduceScatter and ncclCollAllGather alike, ``2*(nRanks-1)`` and ``2*(nNodes-1)`` for AllReduce;
    ``if (coll != ncclCollAllReduce && a != NCCL_ALGO_RING) continue``): at each step every GPU passes one
    shard of n/p to its ring successor, which adds its own and passes it on, so every GPU sends (p − 1)/p·n
    over the ring all-reduce's resources and a shard crosses p − 1 consecutive hops. That is exactly an
    all-gather in which every GPU contributes n/p, run backwards (nccl-tests, doc/PERFORMANCE.md: both have
    busBw = algBw·(p − 1)/p), so

        T = L + (p − 1 − h_n)·α_i + h_n·α_n + (p − 1)/p · n · max(s/B_i, 1/(r·B_n)),

    with h_n = allgather_inter_hops (m, g) and s as for the ring all-reduce; the additions run at memory
    bandwidth and are left out, as for every all-reduce. With g = 1, r = 1, L = 0 it is the textbook ring
    reduce-scatter (p − 1)·α + (p − 1)/p·n/B (Thakur, Rabenseifner & Gropp 2005). The byte term is
    scaled by ``Cluster.reducescatter_traffic`` (1 for NCCL)."""
    p = cluster.gpus
    return allgather_time(cluster, nbytes / p, cluster.reducescatter_traffic) if p > 1 else 0.0


def sharded_allgather_time(cluster: Cluster, nbytes: float) -> float:
    """Seconds for a ring all-gather that leaves every GPU holding ``nbytes`` of which it owned 1/p (ZeRO's and
    FSDP's parameter gathers): ``allgather_time`` with each GPU contributing its shard, n/p, its byte term
    scaled by ``Cluster.allgather_traffic`` (1 for NCCL)."""
    p = cluster.gpus
    return allgather_time(cluster, nbytes / p, cluster.allgather_traffic) if p > 1 else 0.0


def allreduce_time(algorithm: str, nbytes: float, cluster: Cluster) -> float:
    """Seconds for one uncontended all-reduce of ``nbytes`` per GPU over every GPU of ``cluster``."""
    return choose(algorithm, nbytes, cluster)[1]
