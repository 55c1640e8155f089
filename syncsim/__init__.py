"""syncsim: predict and measure how parameter-synchronisation schemes scale in data-parallel training."""

from syncsim.cluster import CLUSTER_PRESETS, Cluster, Link
from syncsim.engine import simulate
from syncsim.result import SimResult
from syncsim.speedup import speedup
from syncsim.workload import WORKLOAD_PRESETS, Workload

__all__ = ["Cluster", "Link", "Workload", "simulate", "SimResult", "speedup", "CLUSTER_PRESETS",
           "WORKLOAD_PRESETS"]
__version__ = "0.1.0"
