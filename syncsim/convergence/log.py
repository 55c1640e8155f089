"""What a replay needs from a run: the scheme's plan, the run's size and its update log.

A simulation (``SimResult``) and a real run of ``real/`` write the same
updates table — one row per applied gradient: worker, step, version_read,
version_applied, staleness, time_applied — so either can be replayed. An
``UpdateLog`` is that table with the policy the run carried out, the number of
workers, steps per worker and samples per worker per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from syncsim.config import check_int
from syncsim.recorder import UPDATE_COLUMNS
from syncsim.result import SimResult
from syncsim.schemes import Policy

__all__ = ["UpdateLog"]


@dataclass(frozen=True, eq=False)
class UpdateLog:
    policy: Policy
    workers: int
    steps: int
    """Steps per worker."""
    batch_size: int
    """Samples per worker per step."""
    updates: pd.DataFrame

    def __post_init__(self) -> None:
        if not isinstance(self.policy, Policy):
            raise ValueError(f"UpdateLog.policy must be a syncsim.schemes.Policy, got {type(self.policy).__name__}")
        for name in ("workers", "steps", "batch_size"):
            object.__setattr__(self, name, check_int("UpdateLog", name, getattr(self, name), 1))
        updates = self.updates
        missing = [c for c in UPDATE_COLUMNS if c not in getattr(updates, "columns", ())]
        if missing:
            raise ValueError(f"UpdateLog.updates must be a table with columns {', '.join(UPDATE_COLUMNS)}; "
                             f"missing {', '.join(missing)}")
        # the replay keeps as many old versions as the largest staleness: the column must be the truth
        wrong = updates["staleness"] != updates["version_applied"] - updates["version_read"]
        if wrong.any():
            w, t, read, applied, stale = (int(updates[c][wrong].iloc[0]) for c in UPDATE_COLUMNS[:5])
            raise ValueError(f"UpdateLog.updates: staleness must be version_applied - version_read, but worker {w} "
                             f"step {t} reads {read}, is applied to {applied} and says staleness {stale}")

    @classmethod
    def of(cls, result: SimResult) -> UpdateLog:
        """The update log of a simulation, with the policy it simulated."""
        workload = result.workload
        policy = result.scheme.policy(workload.param_bytes, workload.layers, workload.backward_fraction,
                                      workload.shapes)
        return cls(policy, result.workers, result.steps, workload.batch_size, result.updates)

    @property
    def scheme(self):
        return self.policy.scheme

    @property
    def versions(self) -> int:
        """Versions of the authoritative parameters the run produced."""
        return int(self.updates["version_applied"].max()) + 1 if len(self.updates) else 0
