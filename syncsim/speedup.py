"""Speedup of a scheme on a cluster over plain training on one GPU."""

from __future__ import annotations

from syncsim.cluster import Cluster
from syncsim.engine import simulate
from syncsim.schemes import Scheme
from syncsim.workload import Workload

__all__ = ["speedup"]


def speedup(cluster: Cluster, workload: Workload, scheme: Scheme | str, steps: int = 100, seed: int = 0) -> float:
    """Cluster throughput / throughput of the same workload on one nominal GPU (no communication)."""
    return simulate(cluster, workload, scheme, steps=steps, seed=seed).speedup
