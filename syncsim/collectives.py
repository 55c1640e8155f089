"""Closed-form costs of the collectives (alpha-beta model, no contention).

Notation: p participants, n bytes, alpha latency per message, B bandwidth
(beta = 1/B). Reduction arithmetic (the gamma term) is ignored: on GPUs it runs
at memory bandwidth, far above any network link's.

- Ring all-reduce (reduce-scatter then all-gather; Patarasuk & Yuan 2009,
  "Bandwidth optimal all-reduce algorithms for clusters of workstations";
  Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication
  Operations in MPICH", sec. 4.5): 2(p-1)·alpha + 2(p-1)/p · n/B.
- Binary-tree all-reduce (binomial-tree reduce then binomial-tree broadcast,
  Thakur et al. 2005 sec. 4.2/4.3, short-message algorithms):
  2·ceil(log2 p)·(alpha + n/B).
- Hierarchical all-reduce (Horovod's hierarchical mode, Sergeev & Del Balso
  2018; Jia et al. 2018, "Highly Scalable Deep Learning Training System with
  Mixed-Precision"): reduce to one leader per node, ring all-reduce among the
  m node leaders, broadcast from the leader. The intra-node reduce and
  broadcast use Thakur et al.'s long-message algorithms over g GPUs:
  reduce (Rabenseifner: reduce-scatter + gather) 2·ceil(log2 g)·alpha + 2(g-1)/g · n/B;
  broadcast (van de Geijn: scatter + all-gather) (ceil(log2 g) + g - 1)·alpha + 2(g-1)/g · n/B.

A flat ring or tree that spans nodes runs at its slowest hop: the largest
latency and smallest bandwidth among the links it crosses.
"""

from __future__ import annotations

import math

from syncsim.cluster import Cluster, Link

__all__ = [
    "ring_allreduce_time", "tree_allreduce_time", "reduce_time", "broadcast_time",
    "hierarchical_allreduce_time", "allreduce_time", "bottleneck",
]


def _log2ceil(p: int) -> int:
    return 0 if p <= 1 else math.ceil(math.log2(p))


def ring_allreduce_time(p: int, nbytes: float, latency: float, bandwidth: float) -> float:
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (p - 1) * latency + 2 * (p - 1) / p * nbytes / bandwidth


def tree_allreduce_time(p: int, nbytes: float, latency: float, bandwidth: float) -> float:
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * _log2ceil(p) * (latency + nbytes / bandwidth)


def reduce_time(p: int, nbytes: float, latency: float, bandwidth: float) -> float:
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * _log2ceil(p) * latency + 2 * (p - 1) / p * nbytes / bandwidth


def broadcast_time(p: int, nbytes: float, latency: float, bandwidth: float) -> float:
    if p <= 1 or nbytes <= 0:
        return 0.0
    return (_log2ceil(p) + p - 1) * latency + 2 * (p - 1) / p * nbytes / bandwidth


def hierarchical_allreduce_time(nodes: int, gpus_per_node: int, nbytes: float, intra: Link | None,
                                inter: Link | None) -> float:
    g, m = gpus_per_node, nodes
    total = 0.0
    if g > 1:
        assert intra is not None
        lat, bw = intra.latency, intra.bandwidth  # type: ignore[assignment]
        total += reduce_time(g, nbytes, lat, bw) + broadcast_time(g, nbytes, lat, bw)
    if m > 1:
        assert inter is not None
        total += ring_allreduce_time(m, nbytes, inter.latency, inter.bandwidth)  # type: ignore[arg-type]
    return total


def bottleneck(cluster: Cluster) -> tuple[float, float]:
    """(latency, bandwidth) of the slowest hop of a flat collective over the whole cluster."""
    links = []
    if cluster.gpus_per_node > 1:
        links.append(cluster.intra)
    if cluster.nodes > 1:
        links.append(cluster.inter)
    links = [link for link in links if link is not None]
    if not links:
        return 0.0, math.inf
    return max(link.latency for link in links), min(link.bandwidth for link in links)  # type: ignore[type-var]


def allreduce_time(algorithm: str, nbytes: float, cluster: Cluster) -> float:
    """Seconds for one uncontended all-reduce of ``nbytes`` over every GPU of ``cluster``."""
    p = cluster.gpus
    if algorithm == "hierarchical":
        return hierarchical_allreduce_time(cluster.nodes, cluster.gpus_per_node, nbytes, cluster.intra,
                                           cluster.inter)
    latency, bandwidth = bottleneck(cluster)
    if algorithm == "ring":
        return ring_allreduce_time(p, nbytes, latency, bandwidth)
    if algorithm == "tree":
        return tree_allreduce_time(p, nbytes, latency, bandwidth)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose ring, tree or hierarchical")
