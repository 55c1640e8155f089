"""The replay's actions of sharded data parallelism: reduce-scatter, the sharded optimiser step, gathers.

A mixin of syncsim.convergence.replay.Replayer, kept in a module of its own as real/sharded.py is
for the executor; the dispatch is the Replayer's (one handler per action type).
"""

from __future__ import annotations

import numpy as np

from syncsim.convergence.home import SHARDS
from syncsim.schemes.diloco import fragment_bounds

__all__ = ["ShardedActions"]

# The collectives a sharded step joins: its reduce-scatter, then its workers' shard steps.
_SCATTER, _SHARD_STEP = "reduce-scatter", "shard step"


class ShardedActions:
    """ZeRO's and FSDP's handlers and the sharded master parameters with their optimiser state."""

    def _init_sharded(self, x0: np.ndarray) -> None:
        """The master parameters, worker w owning shard w (with its optimiser state), the mean gradient each
        keeps of its shard, and the workers whose gathers wait for this step's shard steps."""
        self.master = x0.copy()
        self.master_velocity = np.zeros_like(x0)
        self.scattered: np.ndarray | None = None
        self._gather_after: list[int] = []

    def _reduce_scatter(self, w, t, r, a, time, action) -> None:
        if not self._join(w, _SCATTER):
            return
        # the mean of every worker's gradient, as an all-reduce makes it (wire rounding, loss scaling); each
        # worker keeps its shard of it (its row's slice, unscaled by its own scale)
        scaled = np.stack(self.gradients)
        scales = np.array([self._scale(v) for v in range(self.workers)])
        if self.scaler is not None:
            scaled *= scales[:, None]
        reduced = self.wire.mean(scaled)
        if self.scaler is None:
            self.scattered = np.broadcast_to(reduced, scaled.shape)
            return
        found_inf = not np.isfinite(reduced).all()
        for v in range(self.workers):
            self.scaler.update(v, found_inf)
        self.scattered = None if found_inf else reduced[None, :] / scales[:, None]

    def _shard_step(self, w, t, r, a, time, action) -> None:
        if not self._join(w, _SHARD_STEP):
            return
        if self.scattered is None:  # an overflow: every worker skips its shard's step, as all-reduce's replicas do
            self.skipped += 1
        else:
            for v, (start, stop) in enumerate(fragment_bounds(self.problem.dim, self.workers)):
                self.optimizer.step(self.master[start:stop], self.master_velocity[start:stop],
                                    self.scattered[v, start:stop])
        self.scattered = None
        waiting, self._gather_after = self._gather_after, []
        for v in waiting:
            self.replicas[v] = self.wire.send(self.master)
        self._new_version(a, time, SHARDS)

    def _gather(self, w, t, r, a, time, action) -> None:
        # A gather after the worker's own shard step of this step (ZeRO-1/2's) receives every worker's updated
        # shard: it waits for the last shard step. One before it (before forward or backward) reads the shards
        # as they are, every shard step before it done.
        if w in self._joins.get(_SHARD_STEP, ()):
            self._gather_after.append(w)
        else:
            self.replicas[w] = self.wire.send(self.master)
