"""The vocabulary of sync actions a policy emits and both executors carry out.

A policy turns (step, steps) into a tuple of actions for one worker. The
simulator times them on modelled GPUs and links; the real executor performs
them with torch.distributed. Neither decides *what* to do: they only know how
to do each action below. Payload sizes are bytes on the wire (precision
applied), so both sides count the same traffic.

Semantics every executor honours:

- ``Compute``: forward and backward of one minibatch on the worker's current
  parameters (its replica, or the version it last pulled).
- ``AllReduceGradients``: average gradients over all workers, bucket by bucket
  in the listed order; every replica then applies the mean. One new version.
- ``LocalUpdate``: the worker applies its own gradient to its own replica.
- ``AverageParameters``: average the replicas' parameters over all workers.
  One new version.
- ``Push``: send the gradient to the parameter servers (sharded evenly). The
  servers weigh each worker's gradient by 1/W (W workers), so every mode
  applies the same total per round and, with plain SGD, modes differ only in
  *when* gradients land (with momentum, also in how often the server's
  optimiser steps). With ``aggregate=True`` (synchronous PS) a round's W
  gradients are applied together as one version; otherwise each is applied
  on arrival, one version each.
- ``WaitForClock``: block until the slowest worker's clock (completed pushes)
  is at least this worker's clock minus ``slack``; slack 0 is a barrier. The
  servers send the slowest clock with every pull reply and every wake, and a
  worker asks them (a request and its answer) only when the clock it last
  heard of does not already allow it to go on: an SSP client serves reads from
  its cache while the cache is fresh enough (Ho et al. 2013, section 3), so
  it pays no round trip on a step the bound does not hold back. The view is
  never ahead of the servers' (clocks only grow), so the bound is kept.
- ``Pull``: fetch the current parameters from the servers; the next gradient
  reads the version that was current when the pull started.
- ``LowRankAllReduce``: PowerSGD (Vogels, Karimireddy & Jaggi 2019, "PowerSGD:
  Practical Low-Rank Gradient Compression for Distributed Optimization",
  algorithm 1 with error feedback and warm start), as torch's
  ``powerSGD_hook`` arranges it: each worker adds its residual to its gradient
  (Δ = g + e); tensors listed in ``matrices`` (viewed as rows × cols) are
  compressed, the rest (``uncompressed`` values: tensors too small to gain)
  are all-reduced as they are. Round one all-reduces the uncompressed values
  and P = Δ·Q for each matrix (Q: the previous step's,
  warm start; at the first step a seeded Gaussian shared by all workers,
  orthonormalised);
  each worker orthonormalises the mean P (Gram–Schmidt) into P̂; round two
  all-reduces Q = Δᵀ·P̂. Every replica applies the mean of the uncompressed
  values and P̂·Qᵀ for each matrix; each worker keeps e = Δ − (what it
  applied) as its residual. One new version. Numerics: syncsim.compression.
- ``SparseAllGather``: top-k sparsification with error feedback (Stich,
  Cordonnier & Jaggi 2018, "Sparsified SGD with Memory"; Lin et al. 2018,
  "Deep Gradient Compression"): each worker adds its residual to its
  gradient, sends the ``values`` entries of largest magnitude (ties: the lower
  index) with their indices, and keeps the rest (and the rounding of what it
  sent) as its residual. Sparse sets of different workers do not add up in
  place, so they travel by all-gather: every worker receives every worker's
  (indices, values) and applies their sum over W as the gradient. One new
  version.
- ``OuterStep``: DiLoCo's outer step (Douillard et al. 2023, "DiLoCo:
  Distributed Low-Communication Training of Language Models"): for each
  listed fragment of the ``count`` (contiguous, equal slices of the flat
  parameters in forward order; ``count`` > 1 is streaming DiLoCo's staggered
  schedule, Douillard et al. 2025), the workers all-reduce the mean
  pseudo-gradient (the fragment's value at its last outer step minus its
  value now; the listed fragments in one all-reduce), and every worker
  applies it to the fragment's last outer value with the outer optimiser
  (SGD with Nesterov momentum: ``lr``, ``momentum``; its state is the
  fragment's own), then sets its replica's fragment to the result. One new
  version. With lr 1 and no momentum it is parameter averaging of the
  fragments.

- ``ReduceScatterGradients``: sharded data parallelism's gradient reduction
  (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models", section 5; Zhao et al. 2023, "PyTorch FSDP"):
  bucket by bucket in the listed order, as backward produces them, every
  worker contributes its whole gradient of the bucket and receives the mean
  over the W workers of its own 1/W shard of it, and only that shard. No new
  version by itself: the shards are applied by ``ShardedOptimizerStep``.
- ``ShardedOptimizerStep``: each worker applies the optimiser to its own 1/W
  shard of the parameters (contiguous, equal slices of the flat parameters,
  worker w the w-th), with its shard of the mean gradient and its shard of
  the optimiser's state, which lives nowhere else. The shards together are
  the new authoritative parameters: one new version. Every worker steps the
  same values with the same arithmetic an all-reduce step would: sharding
  changes where state lives, not the update.
- ``AllGatherParameters``: every worker contributes its 1/W shard of each
  listed unit's parameters (at the wire precision) and receives the others,
  so that it holds the unit whole: the parameters it then computes on. When
  it runs is its ``phase``: "forward", each unit before its forward
  (ZeRO-3, FSDP); "backward", each unit again before its backward, in
  reverse order, after resharding freed it (ZeRO-3, FSDP with
  reshard_after_forward); "step", after the optimiser step, so every worker
  holds all the updated parameters for the next step (ZeRO-1 and -2).
  ``needed`` gives, per unit, the fraction of the step's compute at which
  its parameters are needed: compute cannot pass it until the gather is
  done. ``prefetch``: each gather is issued when the previous unit's
  compute begins (one unit ahead: FSDP's forward_prefetch and
  BACKWARD_PRE), not when its own is needed. A worker's gather reads every
  shard as it is after every worker's ``ShardedOptimizerStep`` of the steps
  before it.

``LocalUpdate.optimizer`` names the worker's own optimiser: "sgd" (SGD with
the run's learning rate and momentum) or "adamw" (DiLoCo's inner optimiser,
torch.optim.AdamW with the run's learning rate and torch's defaults).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Action", "Compute", "AllReduceGradients", "LocalUpdate", "AverageParameters",
    "Push", "WaitForClock", "Pull", "LowRankAllReduce", "SparseAllGather", "OuterStep", "SERVER_ACTIONS",
    "INDEX_BYTES", "LOCAL_OPTIMIZERS", "ReduceScatterGradients", "ShardedOptimizerStep", "AllGatherParameters",
    "GATHER_PHASES", "SHARDED_ACTIONS", "COLLECTIVE_SYNCS",
]

# Bytes of one index of a sparse gradient on the wire: int32, enough for 2^31 values per tensor.
INDEX_BYTES = 4
LOCAL_OPTIMIZERS = ("sgd", "adamw")


@dataclass(frozen=True)
class Action:
    kind = "action"


@dataclass(frozen=True)
class Compute(Action):
    kind = "compute"


@dataclass(frozen=True)
class AllReduceGradients(Action):
    buckets: tuple[float, ...]
    """Wire bytes of each bucket, in the order buckets become ready during backward."""
    ready: tuple[float, ...]
    """Fraction of the compute after which each bucket is ready (1.0 = at the end)."""
    algorithm: str
    bucket_bytes: float
    """Gradient (fp32) bytes per bucket: the cap the buckets were formed with (DDP's ``bucket_cap_mb``)."""
    kind = "allreduce"

    @property
    def nbytes(self) -> float:
        return float(sum(self.buckets))


@dataclass(frozen=True)
class LocalUpdate(Action):
    optimizer: str = "sgd"
    """The worker's own optimiser: "sgd" or "adamw" (LOCAL_OPTIMIZERS)."""
    kind = "local_update"


@dataclass(frozen=True)
class AverageParameters(Action):
    nbytes: float
    algorithm: str
    kind = "average"


@dataclass(frozen=True)
class Push(Action):
    nbytes: float
    aggregate: bool
    kind = "push"


@dataclass(frozen=True)
class WaitForClock(Action):
    slack: int
    kind = "wait"


@dataclass(frozen=True)
class Pull(Action):
    nbytes: float
    kind = "pull"


@dataclass(frozen=True)
class LowRankAllReduce(Action):
    rank: int
    """Columns of P and Q (capped per matrix at min(rows, cols), as torch's hook does)."""
    matrices: tuple[tuple[int, int], ...]
    """(rows, cols) of each compressed tensor, in forward order."""
    uncompressed: int
    """Values all-reduced as they are (tensors too small to gain)."""
    value_bytes: int
    """Bytes per value on the wire (the scheme's precision)."""
    algorithm: str
    min_compression: float = 2.0
    """The rule that chose ``matrices`` (syncsim.schemes.allreduce.matrix_split), for an executor whose
    tensors differ from the workload's (the replay's problem)."""
    kind = "allreduce"

    def ranks(self) -> tuple[int, ...]:
        return tuple(min(self.rank, rows, cols) for rows, cols in self.matrices)

    @property
    def p_bytes(self) -> float:
        """Round one: the uncompressed values and every P (rows × rank)."""
        return float((self.uncompressed + sum(r * rows for r, (rows, _) in zip(self.ranks(), self.matrices)))
                     * self.value_bytes)

    @property
    def q_bytes(self) -> float:
        """Round two: every Q (cols × rank)."""
        return float(sum(r * cols for r, (_, cols) in zip(self.ranks(), self.matrices)) * self.value_bytes)

    @property
    def nbytes(self) -> float:
        return self.p_bytes + self.q_bytes

    @property
    def flops(self) -> float:
        """Arithmetic of one worker's step: P = ΔQ, Q = ΔᵀP̂ and P̂Qᵀ (2·rows·cols·rank each) and the
        Gram–Schmidt of P, two passes (4·rows·rank², syncsim.compression.orthonormalise)."""
        return float(sum(6 * rows * cols * r + 4 * rows * r * r
                         for r, (rows, cols) in zip(self.ranks(), self.matrices)))


@dataclass(frozen=True)
class SparseAllGather(Action):
    values: int
    """k: entries each worker sends."""
    size: int
    """Values of the dense gradient the entries are chosen from."""
    value_bytes: int
    """Bytes per value on the wire (the scheme's precision); each index takes INDEX_BYTES."""
    ratio: float = 1.0
    """The share k/n that chose ``values`` (TopK.k), for an executor whose gradient has another size."""
    kind = "allgather"

    @property
    def nbytes(self) -> float:
        """Bytes one worker contributes: k values and k indices. It receives W - 1 times that."""
        return float(self.values * (self.value_bytes + INDEX_BYTES))


@dataclass(frozen=True)
class OuterStep(Action):
    fragments: tuple[int, ...]
    """The fragments this outer step synchronises, in order (one, or every fragment at a run's last step)."""
    count: int
    """F: the fragments the parameters are split into."""
    spans: tuple[tuple[int, int], ...]
    """[start, stop) of each listed fragment in the workload's flat parameters."""
    value_bytes: int
    algorithm: str
    lr: float
    momentum: float
    kind = "outer"

    @property
    def values(self) -> int:
        return sum(stop - start for start, stop in self.spans)

    @property
    def nbytes(self) -> float:
        """The fragments' pseudo-gradients at the wire precision: one all-reduce."""
        return float(self.values * self.value_bytes)


@dataclass(frozen=True)
class ReduceScatterGradients(Action):
    buckets: tuple[float, ...]
    """Wire bytes of each bucket's whole gradient, in the order buckets become ready during backward; each
    worker sends (W - 1)/W of each and keeps the mean of its 1/W shard."""
    ready: tuple[float, ...]
    """Fraction of the step's compute after which each bucket is ready (1.0 = at the end)."""
    kind = "reducescatter"

    @property
    def nbytes(self) -> float:
        return float(sum(self.buckets))


@dataclass(frozen=True)
class ShardedOptimizerStep(Action):
    kind = "optimizer"


GATHER_PHASES = ("forward", "backward", "step")


@dataclass(frozen=True)
class AllGatherParameters(Action):
    units: tuple[float, ...]
    """Wire bytes of each unit's whole parameters, in the order they are gathered; each worker holds 1/W of
    each and receives the rest, (W - 1)/W of it."""
    needed: tuple[float, ...]
    """Fraction of the step's compute at which each unit's parameters are needed: the start of its forward
    or backward; 1.0 for a gather after the compute (phase "step"), which holds no compute back."""
    phase: str
    """"forward", "backward" or "step" (GATHER_PHASES): before each unit's forward, before each unit's
    backward (reverse order), or after the optimiser step."""
    prefetch: bool = False
    """Issue each gather when the previous unit's compute begins, one unit ahead of its need."""
    kind = "allgather"

    def __post_init__(self) -> None:
        if self.phase not in GATHER_PHASES:
            raise ValueError(f"AllGatherParameters.phase must be one of {GATHER_PHASES}, got {self.phase!r}")
        if len(self.needed) != len(self.units):
            raise ValueError(f"AllGatherParameters: {len(self.units)} units but {len(self.needed)} needed times")

    @property
    def nbytes(self) -> float:
        """The gathered bytes: what every worker holds once it is done (its own shard included)."""
        return float(sum(self.units))

    def issued(self) -> tuple[tuple[float, bool], ...]:
        """When each gather is issued, as (fraction of the compute, whether compute must first be allowed past
        that fraction): without prefetch on reaching its own ``needed``; with prefetch once the previous unit's
        compute has begun, i.e. past the previous unit's ``needed`` (the first unit's own need)."""
        if not self.prefetch:
            return tuple((need, False) for need in self.needed)
        return tuple((self.needed[0], False) if i == 0 else (self.needed[i - 1], True)
                     for i in range(len(self.needed)))


# The actions of sharded data parallelism: the simulator schedules a step's sharded actions together with
# its compute (syncsim.communicator.Communicator.join_schedule).
SHARDED_ACTIONS = (ReduceScatterGradients, ShardedOptimizerStep, AllGatherParameters)

# The actions by which the workers synchronise in one collective they all join (a sharded step's by its
# reduce-scatter, which its gathers accompany): the workers leave it together.
COLLECTIVE_SYNCS = (AllReduceGradients, AverageParameters, LowRankAllReduce, SparseAllGather, OuterStep,
                    ReduceScatterGradients)

# The actions that talk to parameter servers: a plan with any of them needs server hosts (the
# simulator's ServerGroup, the executor's client and server ranks).
SERVER_ACTIONS = (Push, WaitForClock, Pull)
