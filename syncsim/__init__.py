"""syncsim: predict and measure how parameter-synchronisation schemes scale in data-parallel training.

Names are loaded on first use (PEP 562), so ``import syncsim.schemes`` — what
the real executor needs — pulls in neither SimPy nor pandas.
"""

from importlib import import_module

__all__ = ["Cluster", "Link", "Workload", "simulate", "SimResult", "speedup", "CLUSTER_PRESETS",
           "WORKLOAD_PRESETS"]
__version__ = "0.1.0"

_HOME = {
    "Cluster": "syncsim.cluster", "Link": "syncsim.cluster", "CLUSTER_PRESETS": "syncsim.cluster",
    "Workload": "syncsim.workload", "WORKLOAD_PRESETS": "syncsim.workload",
    "simulate": "syncsim.engine", "SimResult": "syncsim.result", "speedup": "syncsim.engine",
}


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'syncsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
