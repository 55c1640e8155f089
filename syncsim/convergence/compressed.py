"""The replay's actions that trade bytes for arithmetic: PowerSGD, top-k, DiLoCo's outer step.

A mixin of syncsim.convergence.replay.Replayer (its state: the replicas, the wire, the gradients, the
collectives joined), kept in a module of its own as real/compressed.py is for the executor; the
dispatch is the Replayer's (one handler per action type).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from syncsim.compression import LowRank, Sparsifier, layout, scatter_mean
from syncsim.convergence.home import OUTER, REPLICAS
from syncsim.convergence.optimizer import Nesterov
from syncsim.schemes.diloco import fragment_bounds
from syncsim.schemes.topk import top_k

__all__ = ["CompressedActions"]


class CompressedActions:
    """PowerSGD's, top-k's and DiLoCo's handlers and their per-worker state (compressors, outer copies)."""

    def _init_compressed(self, x0: np.ndarray) -> None:
        """Per-worker state of the compressed and DiLoCo actions; compressors are made when first needed."""
        self.compressors: list = []       # one LowRank or Sparsifier per worker
        self._compressor_key: tuple | None = None
        self.reduced: np.ndarray | None = None   # the last gradient every replica applied (compressed actions)
        self.outer = x0.copy()                  # DiLoCo: every fragment's value at its last outer step
        self.outer_velocity = np.zeros_like(x0)  # its Nesterov buffer (fragments are disjoint: per-fragment state)

    def _compressors(self, key: tuple, make: Callable[[], object]) -> list:
        """The workers' compressors for ``key`` (made on first use; a run's plan has one kind)."""
        if self._compressor_key != key:
            if self._compressor_key is not None:
                raise RuntimeError(f"a run's compressed all-reduce changed from {self._compressor_key} to {key}: "
                                   f"the replay keeps one compressor state per worker")
            self._compressor_key = key
            self.compressors = [make() for _ in range(self.workers)]
        return self.compressors

    def _low_rank(self, w, t, r, a, time, action) -> None:
        if not self._join(w):
            return
        problem = self.problem

        def make() -> LowRank:
            shapes = tuple(tuple(int(n) for n in shape) for shape in problem.shapes)
            values = sum(math.prod(shape) for shape in shapes)
            if values != problem.dim:
                raise ValueError(f"{type(problem).__name__}.shapes hold {values} values but its dim is "
                                 f"{problem.dim}")
            return LowRank(layout(shapes, action.rank, action.min_compression), seed=self.seed,
                           send=self.wire.send)

        workers = self._compressors(("powersgd", action.rank, action.min_compression), make)
        mean = self.wire.mean
        # round one: the uncompressed values and every P; the compressors send them at wire precision
        starts = [c.start(g) for c, g in zip(workers, self.gradients)]
        plain = mean(np.stack([plain for plain, _ in starts]))
        p_mean = [mean(np.stack([ps[i] for _, ps in starts])) for i in range(len(starts[0][1]))]
        # round two: every Q = MᵀP̂
        middles = [c.middle(p_mean) for c in workers]
        q_mean = [mean(np.stack([qs[i] for qs in middles])) for i in range(len(middles[0]))]
        # every worker computes the same applied gradient (same means, same arithmetic); each keeps its residual
        applied = [c.finish(plain, q_mean) for c in workers]
        self._apply(applied[0], a, time)

    def _sparse(self, w, t, r, a, time, action) -> None:
        if not self._join(w):
            return
        dim = self.problem.dim
        k = top_k(dim, action.ratio)
        workers = self._compressors(("topk", k), lambda: Sparsifier(dim, k, send=self.wire.send))
        sent = [c.compress(g) for c, g in zip(workers, self.gradients)]
        # all-gather: every worker receives every (indices, values) as sent and sums them itself
        self._apply(scatter_mean([i for i, _ in sent], [v for _, v in sent], dim), a, time)

    def _apply(self, gradient: np.ndarray, a: int, time: float) -> None:
        self.reduced = gradient
        self.optimizer.step(self.replicas, self.replica_velocity, gradient)
        self._new_version(a, time, REPLICAS)

    def _outer(self, w, t, r, a, time, action) -> None:
        if not self._join(w):
            return
        bounds = fragment_bounds(self.problem.dim, action.count)
        for fragment in action.fragments:  # one all-reduce carries them all; each has its own outer state
            start, stop = bounds[fragment]
            outer = self.outer[start:stop]
            # the mean pseudo-gradient: each worker sends (last outer value - its replica) at wire precision
            pseudo = self.wire.mean(outer[None, :] - self.replicas[:, start:stop])
            Nesterov(action.lr, action.momentum).step(outer, self.outer_velocity[start:stop], pseudo)
            self.replicas[:, start:stop] = outer
        self._new_version(a, time, OUTER)
