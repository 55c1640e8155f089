"""Re-enact a run's update order on an optimisation problem.

``simulate`` decides *when* each gradient lands and *which parameter version*
it was computed on; the replay carries out the same actions (the scheme's
policy, step by step) on a real problem, in the simulated applied order. A
real run of ``real/`` writes the same updates table, so its ``UpdateLog``
replays the same way (real/replay.py: its torch model and data order as a
``Problem``; tests/real/test_replay_agreement.py checks the two agree).


- ``Compute``: the gradient of the worker's own minibatch (``problem.sampler``) at the
  parameters the worker holds: its replica, or — once it pulls — the server
  version the updates table says it read;
- ``AllReduceGradients``: every worker's gradient crosses the wire, the mean
  comes back, and each replica steps with its own optimiser state;
- ``LocalUpdate``: the worker steps its own replica, nothing crosses the wire;
- ``AverageParameters``: every replica becomes the replicas' mean;
- ``Push``: the servers apply the gradient with weight 1/W on arrival, or a
  round's W gradients together (``aggregate``), with the server's optimiser;
- ``WaitForClock``: nothing — the simulated order already reflects the wait;
- ``Pull``: from now on the worker computes on the server's versions;
- ``LowRankAllReduce``: PowerSGD with error feedback and warm start, one
  ``syncsim.compression.LowRank`` per worker over the problem's tensors
  (``Problem.shapes``, split by the action's rank and min_compression); the
  replay takes the means of what the workers send (P and the uncompressed
  values, then Q) where a real run all-reduces, and every replica steps with
  the gradient the compressors agree on;
- ``SparseAllGather``: top-k with error feedback, one
  ``syncsim.compression.Sparsifier`` per worker, k = top_k(problem dim, the
  action's ratio); every replica steps with the all-gathered sum over W;
- ``OuterStep``: DiLoCo's outer step on a fragment of the problem's
  parameters (``fragment_bounds(dim, fragments)``): the mean pseudo-gradient
  (the fragment's last outer value minus each replica's) crosses the wire,
  an outer SGD with Nesterov momentum (per-fragment state) applies it to the
  last outer value, and every replica takes the result. The outer
  parameters are the authoritative ones: with several fragments the
  replicas agree only on the fragment just synchronised.

- ``ReduceScatterGradients``: every worker's gradient crosses the wire (as an
  all-reduce's does, loss-scaled at fp16) and each worker keeps the mean of
  its own shard (``fragment_bounds(dim, W)``, worker w the w-th);
- ``ShardedOptimizerStep``: each worker steps its own shard of the master
  parameters with its shard of the mean gradient and its shard of the
  optimiser's state: one new version, the shards together;
- ``AllGatherParameters``: the worker's replica becomes every shard as it
  crosses the wire, as the shards are after every worker's optimiser step
  before it (a gather that comes after the worker's own shard step of the
  step waits for the last worker's).

``LocalUpdate(optimizer="adamw")`` steps the worker's replica with its own
AdamW state (torch.optim.AdamW with the replay's lr and torch's defaults).

Like the simulator and the real executor, the replay dispatches only on the
action, never on the scheme. Collectives complete when the last of the W
workers joins, as on a communicator, so a round's replicas never change while
its gradients are still being computed. fp16 gradients crossing the wire are
loss-scaled (``scaler.py``); what crosses the wire is rounded (``wire.py``).

Compressed gradients (``LowRankAllReduce``, ``SparseAllGather``) at fp16 are
not loss-scaled: error feedback already keeps whatever the wire's rounding
loses, underflow to 0 included, in the worker's residual and sends it later,
which is the loss scaling's whole purpose; and an overflowing step would leave
inf in the residuals and PowerSGD's warm-started Q, which torch's GradScaler
does not roll back (it skips only the optimiser step), so every later step
would be poisoned. Pseudo-gradients (``OuterStep``) are parameter
differences, not gradients of the scaled loss, and are not scaled either.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
import pandas as pd

from syncsim.config import check_int
from syncsim.convergence.compressed import CompressedActions
from syncsim.convergence.home import OUTER, REPLICAS, SERVER, SHARDS
from syncsim.convergence.log import UpdateLog
from syncsim.convergence.optimizer import SGD, AdamW
from syncsim.convergence.problems import Problem
from syncsim.convergence.scaler import LossScaling
from syncsim.convergence.sharded import ShardedActions
from syncsim.convergence.wire import Wire
from syncsim.result import SimResult
from syncsim.schemes import (
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

__all__ = ["Replayer", "replay", "DEFAULT_EVALUATIONS"]

# Evaluations per replay when ``every`` is not given: enough points for a
# smooth curve and a time-to-target resolution of 0.5% of the run, while the
# held-out evaluation stays a small share of the replay's cost.
DEFAULT_EVALUATIONS = 200


class Replayer(CompressedActions, ShardedActions):
    """The state of one replay: worker replicas, server parameters, optimiser and loss-scaler state.

    ``run(on_version=..., on_compute=...)`` walks the updates table; the hooks
    see every new version ``(version, time, gradients_applied)`` and every
    gradient's inputs ``(worker, step, parameters)``. ``on_version`` may return
    True to stop early.
    """

    def __init__(self, result: SimResult | UpdateLog, problem: Problem, lr: float, momentum: float = 0.0,
                 seed: int = 0, scaling: LossScaling | None = None, batch_size: int | None = None) -> None:
        log = as_log(result)
        if not isinstance(problem, Problem):
            raise ValueError(f"replay needs a syncsim.convergence Problem, got {type(problem).__name__}")
        self.seed = check_int("replay", "seed", seed, 0)
        self.log, self.problem = log, problem
        self.optimizer = SGD(lr, momentum)
        self.workers = workers = log.workers
        self.steps = log.steps
        self.policy = log.policy
        self.wire = Wire(log.scheme.precision)
        # Only fp16 has too little range for raw gradients (see scaler.py).
        self.scaler = (scaling or LossScaling()).scaler(workers) if self.wire.precision == "fp16" else None
        # The problem stands in for the model: its minibatch may be the run's or its own.
        batch = log.batch_size if batch_size is None else check_int("replay", "batch_size", batch_size, 1)
        self.sampler = problem.sampler(batch, workers, seed)

        x0 = np.asarray(problem.init(seed), dtype=float)
        self._init_replicas(x0, lr)
        self._init_order(log.updates, x0)
        self._init_compressed(x0)
        self._init_sharded(x0)
        self._joins: dict[object, list[int]] = {}   # workers joined so far, per collective
        self._round: list[tuple[np.ndarray, bool]] = []
        self._handlers: dict[type, Callable] = {
            Compute: self._compute, AllReduceGradients: self._allreduce, LocalUpdate: self._local_update,
            AverageParameters: self._average, Push: self._push, WaitForClock: self._wait, Pull: self._pull,
            LowRankAllReduce: self._low_rank, SparseAllGather: self._sparse, OuterStep: self._outer,
            ReduceScatterGradients: self._reduce_scatter, ShardedOptimizerStep: self._shard_step,
            AllGatherParameters: self._gather,
        }
        self.on_version: Callable | None = None
        self.on_compute: Callable | None = None
        self._stop = False

    def _init_replicas(self, x0: np.ndarray, lr: float) -> None:
        """The workers' replicas and the servers' parameters, with their optimisers' state."""
        workers = self.workers
        self.replicas = np.tile(x0, (workers, 1))
        self.replica_velocity = np.zeros_like(self.replicas)
        self.server = x0.copy()
        self.server_velocity = np.zeros_like(x0)
        self.pulled = [False] * workers
        self.gradients: list[np.ndarray | None] = [None] * workers
        self.home = REPLICAS      # which copy holds the authoritative parameters
        self.version = 0
        self.applied = 0          # gradients folded into the authoritative parameters so far
        self.skipped = 0          # optimiser steps skipped for overflow
        # LocalUpdate(optimizer="adamw"): each worker's own AdamW state, made when first needed
        self.adamw = AdamW(lr)
        self.adam_moments: tuple[np.ndarray, np.ndarray] | None = None   # (exp_avg, exp_avg_sq) per worker
        self.adam_steps = np.zeros(workers, dtype=np.int64)

    def _init_order(self, updates: pd.DataFrame, x0: np.ndarray) -> None:
        """The updates table in applied order, and the server versions a gradient may still read."""
        order = np.lexsort((updates["step"].to_numpy(), updates["worker"].to_numpy(),
                            updates["version_applied"].to_numpy()))
        self.columns = [updates[c].to_numpy()[order].tolist()
                        for c in ("worker", "step", "version_read", "version_applied", "time_applied")]
        # A gradient reads at most max-staleness versions back: keep that many server versions.
        self.depth = int(updates["staleness"].max()) + 1 if len(updates) else 1
        self.history = np.empty((self.depth, len(x0)))
        self.history[0] = self.wire.send(x0)

    # -- the walk -------------------------------------------------------------------
    def run(self, on_version: Callable | None = None, on_compute: Callable | None = None) -> Replayer:
        self.on_version, self.on_compute = on_version, on_compute
        plan, steps, handlers = self.policy.plan, self.steps, self._handlers
        with np.errstate(all="ignore"), single_blas_thread():  # a diverging run overflows; its loss says so
            for row, (w, t, r, a, time) in enumerate(zip(*self.columns)):
                self.row = row
                for action in plan(t, steps):
                    handlers[type(action)](w, t, r, a, time, action)
                if self._stop:
                    return self
        joined = max((len(j) for j in self._joins.values()), default=0)
        if joined or self._round or self._gather_after:
            raise RuntimeError(f"the updates table ends inside a collective: {joined + len(self._round)}"
                               f" of {self.workers} workers joined")
        return self

    def parameters(self) -> np.ndarray:
        """The authoritative parameters: the server's, the replicas' common value after a sync, or
        DiLoCo's outer parameters (each fragment's value at its last outer step)."""
        # After every synchronisation the replicas are bit-identical (a tested invariant), so row 0 is the value;
        # DiLoCo's outer parameters are the global model (with fragments, replicas agree only on the last synced).
        if self.home == SERVER:
            return self.server
        if self.home == SHARDS:
            return self.master
        return self.outer if self.home == OUTER else self.replicas[0]

    def _new_version(self, version_applied: int, time: float, home: str) -> None:
        if version_applied != self.version:
            raise RuntimeError(f"replay is at version {self.version} but the updates table applies to "
                               f"{version_applied}: the table is not in applied order")
        self.version += 1
        self.applied = self.row + 1
        self.home = home
        if home == SERVER:
            self.history[self.version % self.depth] = self.wire.send(self.server)
        if self.on_version is not None and self.on_version(self.version, time, self.applied):
            self._stop = True

    def _read(self, version: int) -> np.ndarray:
        if not self.version - self.depth < version <= self.version:
            raise RuntimeError(f"a gradient reads version {version} but the replay keeps versions "
                               f"{max(0, self.version - self.depth + 1)}..{self.version}")
        return self.history[version % self.depth]

    # -- sending gradients ------------------------------------------------------------
    def _scale(self, w: int) -> float:
        return 1.0 if self.scaler is None else float(self.scaler.scale[w])

    # -- actions ----------------------------------------------------------------------
    def _compute(self, w, t, r, a, time, action) -> None:
        x = self._read(r) if self.pulled[w] else self.replicas[w]
        if self.on_compute is not None:
            self.on_compute(w, t, x)
        self.gradients[w] = self.problem.gradient(x, self.sampler.indices(w, t))

    def _local_update(self, w, t, r, a, time, action) -> None:
        if action.optimizer == "adamw":
            if self.adam_moments is None:
                self.adam_moments = (np.zeros_like(self.replicas), np.zeros_like(self.replicas))
            self.adam_steps[w] += 1
            m, v = self.adam_moments
            self.adamw.step(self.replicas[w], m[w], v[w], int(self.adam_steps[w]), self.gradients[w])
        elif action.optimizer == "sgd":
            self.optimizer.step(self.replicas[w], self.replica_velocity[w], self.gradients[w])
        else:
            raise ValueError(f"LocalUpdate.optimizer {action.optimizer!r} is not one the replay knows")

    def _join(self, w: int, key: object = None) -> bool:
        """Worker ``w`` joins the collective ``key``; True for the last of the W workers."""
        joined = self._joins.setdefault(key, [])
        joined.append(w)
        if len(joined) < self.workers:
            return False
        if sorted(joined) != list(range(self.workers)):
            raise RuntimeError(f"a collective was joined by workers {sorted(joined)}, not each worker once")
        joined.clear()
        return True

    def _allreduce(self, w, t, r, a, time, action) -> None:
        if not self._join(w):
            return
        scales = np.array([self._scale(v) for v in range(self.workers)])
        scaled = np.stack(self.gradients)
        if self.scaler is not None:
            scaled *= scales[:, None]
        reduced = self.wire.mean(scaled)
        if self.scaler is not None:
            # Every worker receives the same reduced gradient, so all find (or miss) the overflow together.
            found_inf = not np.isfinite(reduced).all()
            for v in range(self.workers):
                self.scaler.update(v, found_inf)
            if found_inf:
                self.skipped += 1
                return self._new_version(a, time, REPLICAS)
            reduced = reduced[None, :] / scales[:, None]
        self.optimizer.step(self.replicas, self.replica_velocity, reduced)
        self._new_version(a, time, REPLICAS)

    def _average(self, w, t, r, a, time, action) -> None:
        if not self._join(w):
            return
        self.replicas[:] = self.wire.average_parameters(self.replicas)
        self._new_version(a, time, REPLICAS)

    def _push(self, w, t, r, a, time, action) -> None:
        gradient, found_inf = self.gradients[w], False
        if self.scaler is None:
            sent = self.wire.send(gradient)
        else:
            scale = self._scale(w)
            sent = self.wire.send(gradient * scale)
            found_inf = not np.isfinite(sent).all()
            self.scaler.update(w, found_inf)
            sent = sent / scale
        if action.aggregate:
            self._round.append((sent, found_inf))
            if len(self._round) < self.workers:
                return
            arrivals, self._round = self._round, []
            if any(bad for _, bad in arrivals):
                self.skipped += 1
            else:   # each gradient weighs 1/W: the round applies their mean as one step
                self.optimizer.step(self.server, self.server_velocity, np.mean([g for g, _ in arrivals], axis=0))
        elif found_inf:
            self.skipped += 1
        else:
            self.optimizer.step(self.server, self.server_velocity, sent * (1.0 / self.workers))
        self._new_version(a, time, SERVER)

    def _wait(self, w, t, r, a, time, action) -> None:
        return None

    def _pull(self, w, t, r, a, time, action) -> None:
        self.pulled[w] = True


def as_log(result: SimResult | UpdateLog) -> UpdateLog:
    if isinstance(result, UpdateLog):
        return result
    if isinstance(result, SimResult):
        return UpdateLog.of(result)
    raise ValueError(f"replay needs a SimResult from syncsim.simulate or an UpdateLog, got {type(result).__name__}")


def single_blas_thread():
    """One BLAS thread while replaying: each update's products are tiny, and OpenBLAS's threads
    cost more than they gain there (measured 2-3× slower on the project's 2-core machine)."""
    try:
        from threadpoolctl import threadpool_limits  # installed with scikit-learn
    except ImportError:  # pragma: no cover - scikit-learn is a dependency
        return nullcontext()
    return threadpool_limits(1, user_api="blas")


def replay(result: SimResult | UpdateLog, problem: Problem, lr: float, momentum: float = 0.0, seed: int = 0,
           every: int | None = None, scaling: LossScaling | None = None,
           stop: Callable[[dict], bool] | None = None, batch_size: int | None = None) -> pd.DataFrame:
    """Loss (and accuracy) against simulated time of ``problem`` trained in ``result``'s update order.

    Rows: version 0 at time 0, then every ``every`` versions (default: about
    200 rows per run) and the last version. Columns: time (simulated seconds),
    version, gradients (applied so far), steps (gradients per worker: the
    glossary's step, comparable across schemes), then the problem's metrics.
    ``stop(row)`` returning True ends the replay early (e.g. once a target is
    met); a non-finite loss ends it too. ``batch_size`` is each worker's
    minibatch on the problem (default: the workload's).
    """
    replayer = Replayer(result, problem, lr, momentum, seed, scaling, batch_size)
    total = replayer.log.versions
    every = max(1, total // DEFAULT_EVALUATIONS) if every is None else check_int("replay", "every", every, 1)
    workers = replayer.workers
    rows: list[dict] = []

    def record(version: int, time: float, applied: int) -> bool:
        row = {"time": time, "version": version, "gradients": applied, "steps": applied / workers,
               **problem.evaluate(replayer.parameters())}
        rows.append(row)
        return not np.isfinite(row["loss"]) or (stop is not None and bool(stop(row)))

    def on_version(version: int, time: float, applied: int) -> bool:
        if version % every == 0 or version == total:
            return record(version, time, applied)
        return False

    with np.errstate(all="ignore"), single_blas_thread():
        stopped = record(0, 0.0, 0)
    if not stopped:
        replayer.run(on_version=on_version)
    frame = pd.DataFrame(rows)
    frame.attrs.update(scheme=str(replayer.log.scheme), workers=workers, lr=replayer.optimizer.lr,
                       momentum=replayer.optimizer.momentum, skipped=replayer.skipped)
    return frame
