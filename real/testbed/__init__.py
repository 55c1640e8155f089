"""The emulated-network testbed: a measuring tool around the executor, never imported by it.

- ``real.testbed.namespaces``: one network namespace per host, tbf-limited veth links on a bridge;
- ``real.testbed.launcher``: a real.worker run (or any module) as a multi-node torchrun on those hosts;
- ``python -m real.testbed``: the command line (one run; ``--check`` runs the validation study's quick preset as
  a program of its own).
"""

from real.testbed.launcher import run, torchrun_on
from real.testbed.namespaces import HOST_IFACE, Testbed, TestbedConfig, TestbedUnavailable, unavailable

__all__ = ["Testbed", "TestbedConfig", "TestbedUnavailable", "unavailable", "HOST_IFACE", "torchrun_on", "run"]
