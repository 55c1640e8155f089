"""Sync schemes, each defined once: a frozen spec (its knobs) and a pure policy.

Neither SimPy nor torch is imported here (checked by
tests/unit/test_schemes.py::test_policies_import_neither_simpy_nor_torch): the
simulator, the replay and the real executor all carry out the same plans.
"""

from syncsim.schemes.actions import (
    SERVER_ACTIONS,
    SHARDED_ACTIONS,
    Action,
    AllGatherParameters,
    AllReduceGradients,
    AverageParameters,
    Compute,
    LocalUpdate,
    LowRankAllReduce,
    OuterStep,
    Pull,
    Push,
    ReduceScatterGradients,
    ShardedOptimizerStep,
    SparseAllGather,
    WaitForClock,
)
from syncsim.schemes.allreduce import AllReduce
from syncsim.schemes.diloco import DiLoCo
from syncsim.schemes.fsdp import FSDP
from syncsim.schemes.localsgd import LocalSGD
from syncsim.schemes.policy import Policy, StateLayout
from syncsim.schemes.ps import ParameterServer
from syncsim.schemes.spec import PRECISIONS, SCHEMES, Scheme, parse
from syncsim.schemes.topk import TopK
from syncsim.schemes.zero import ZeRO

__all__ = [
    "Scheme", "AllReduce", "ParameterServer", "LocalSGD", "TopK", "DiLoCo", "parse", "SCHEMES", "PRECISIONS",
    "Policy", "Action", "Compute", "AllReduceGradients", "LocalUpdate", "AverageParameters", "Push", "WaitForClock",
    "Pull", "LowRankAllReduce", "SparseAllGather", "OuterStep", "SERVER_ACTIONS", "ZeRO", "FSDP", "StateLayout",
    "ReduceScatterGradients", "ShardedOptimizerStep", "AllGatherParameters", "SHARDED_ACTIONS",
]
