"""What a configuration's run sends over the links between its workers: the collective it synchronises
by, the size its links' rate is read at, and the collectives its link probe times at their own sizes."""

from __future__ import annotations

import functools
from typing import NamedTuple

from real.validation.config import STEPS, Config, model_bytes, model_shapes

__all__ = ["AllReduceSize", "GatherSize", "sync_action", "steps_per_sync", "message_bytes", "timed_size",
           "timed_gather", "sent_precisions"]


class AllReduceSize(NamedTuple):
    """One all-reduce a run sends a step, as its link probe times it: wire bytes at a precision."""

    nbytes: int
    precision: str


class GatherSize(NamedTuple):
    """Top-k's exchange a run sends a step: an all-gather of k int32 indices, then one of k values."""

    values: int
    precision: str


@functools.cache
def _synced_plan(scheme: str, model: str) -> tuple[tuple, ...]:
    """Each of STEPS steps' collectives that synchronise workers (COLLECTIVE_SYNCS), as real.executor plans
    ``scheme`` for ``model``'s layers and tensor shapes."""
    from real.models import build, param_layers
    from syncsim.schemes import parse
    from syncsim.schemes.actions import COLLECTIVE_SYNCS

    layers = param_layers(build(model, 0))
    policy = parse(scheme).policy(sum(layers), layers=layers, shapes=model_shapes(model))
    return tuple(tuple(a for a in policy.plan(step, STEPS) if isinstance(a, COLLECTIVE_SYNCS)) for step in range(STEPS))


def _sync_action(scheme: str, model: str):
    counts: dict = {}
    for synced in _synced_plan(scheme, model):
        for action in synced:
            counts[action] = counts.get(action, 0) + 1
    return max(counts, key=counts.get) if counts else None  # the first of the most frequent


def sync_action(config: Config):
    """The collective a run of ``config`` synchronises by, as real.executor plans it for the model's layers
    and tensor shapes (the most frequent over STEPS steps: a DiLoCo run's outer step at its own period, a
    streaming one's single fragment; a sharded run's reduce-scatter of the gradient); None for a run that
    sends nothing over the links between workers (a parameter server's traffic is point to point; one worker
    has no peer)."""
    if config.servers or config.world < 2:
        return None
    return _sync_action(config.scheme, config.model)


def _steps_per_sync(scheme: str, model: str) -> float:
    synced = sum(bool(step) for step in _synced_plan(scheme, model))
    return STEPS / synced if synced else 1.0


def steps_per_sync(config: Config) -> float:
    """How many steps a worker of ``config`` computes between its collectives, on average over STEPS
    steps, as real.executor plans them: 1 for a scheme that synchronises every step, the period for
    local SGD's averaging and DiLoCo's outer step; 1 for a run with no collective between workers. What a
    rank computes after leaving one collective before it meets the next (the link probe's ``after``)."""
    if config.servers or config.world < 2:
        return 1.0
    return _steps_per_sync(config.scheme, config.model)


def message_bytes(config: Config) -> float:
    """What a run of ``config`` sends at once, the size its links' rate is read at: its gradient (or local SGD's
    parameters, a push, DiLoCo's pseudo-gradient, a sharded run's reduce-scatter and its all-gathers, each the
    whole gradient or parameters) at the scheme's wire precision; PowerSGD's larger round; the bytes each
    worker contributes to top-k's all-gather (indices and values)."""
    from syncsim.schemes import parse
    from syncsim.schemes.actions import LowRankAllReduce, OuterStep, SparseAllGather

    action = sync_action(config)
    if isinstance(action, LowRankAllReduce):
        return max(action.p_bytes, action.q_bytes)
    if isinstance(action, (SparseAllGather, OuterStep)):  # an outer step: its fragments' pseudo-gradients
        return action.nbytes
    return model_bytes(config.model) * parse(config.scheme).wire_ratio


def timed_size(config: Config) -> tuple[AllReduceSize, ...]:
    """The all-reduces a run of ``config`` sends a step, as its link probe times them
    (real.calibration.messages.wire_bytes): its gradient's, local SGD's or DiLoCo's parameters', or
    PowerSGD's two rounds (P with the uncompressed values, then Q); () for a run that all-reduces nothing
    over the links (a parameter server's, one worker's, top-k's: timed_gather).

    A sharded run (ZeRO, FSDP) sends no all-reduce: the all-reduce of its gradient sets the link's rate and
    launch, on which the simulator prices its reduce-scatters and all-gathers, each as NCCL's ring moves
    them ((p-1) hops of n/p). gloo does not run them so (on loopback here, two ranks, 4 MiB:
    reduce_scatter_single 7.3 ms, all_reduce 3.6 ms, all_gather_single 3.0 ms, medians of 15): how much
    longer its collectives keep the link busy is fitted from the run's own collectives
    (real.validation.calibration.sharded_traffic; docs/memory.md, "In the validation study")."""
    from real.calibration.messages import wire_bytes
    from syncsim.schemes import parse
    from syncsim.schemes.actions import LowRankAllReduce, SparseAllGather

    action = sync_action(config)
    if action is None or isinstance(action, SparseAllGather):
        return ()
    precision = parse(config.scheme).precision
    if isinstance(action, LowRankAllReduce):
        rounds = [action.p_bytes] + ([action.q_bytes] if action.q_bytes else [])
        return tuple(AllReduceSize(wire_bytes(size, precision), precision) for size in rounds)
    return (AllReduceSize(wire_bytes(message_bytes(config), precision), precision),)


def timed_gather(config: Config) -> tuple[GatherSize, ...]:
    """The top-k exchange a run of ``config`` sends a step (an all-gather of k int32 indices, then one of k
    values), as its link probe times it; () for every other run."""
    from syncsim.schemes import parse
    from syncsim.schemes.actions import SparseAllGather

    action = sync_action(config)
    return (GatherSize(action.values, parse(config.scheme).precision),) if isinstance(action, SparseAllGather) else ()


def sent_precisions(configs: list[Config]) -> tuple[str, ...]:
    """The wire precisions the schemes of ``configs`` send: the link probe's sweep times only these."""
    from syncsim.schemes import parse

    return tuple(sorted({parse(config.scheme).precision for config in configs}))
