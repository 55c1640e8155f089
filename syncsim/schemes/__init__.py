"""Sync schemes, each defined once: a frozen spec (its knobs) and a pure policy.

Neither SimPy nor torch is imported here (tests/unit/test_scheme_purity.py
checks): the simulator and the real executor both carry out the same plans.
"""

from syncsim.schemes.actions import (
    Action,
    AllReduceGradients,
    AverageParameters,
    Compute,
    LocalUpdate,
    Pull,
    Push,
    WaitForClock,
)
from syncsim.schemes.allreduce import AllReduce
from syncsim.schemes.localsgd import LocalSGD
from syncsim.schemes.policy import Policy
from syncsim.schemes.ps import ParameterServer
from syncsim.schemes.spec import PRECISIONS, SCHEMES, Scheme, parse

__all__ = [
    "Scheme", "AllReduce", "ParameterServer", "LocalSGD", "parse", "SCHEMES", "PRECISIONS", "Policy",
    "Action", "Compute", "AllReduceGradients", "LocalUpdate", "AverageParameters", "Push", "WaitForClock", "Pull",
]
