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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Action", "Compute", "AllReduceGradients", "LocalUpdate", "AverageParameters",
    "Push", "WaitForClock", "Pull", "SERVER_ACTIONS",
]


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


# The actions that talk to parameter servers: a plan with any of them needs server hosts (the
# simulator's ServerGroup, the executor's client and server ranks).
SERVER_ACTIONS = (Push, WaitForClock, Pull)
