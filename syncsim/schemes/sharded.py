"""What ZeRO and FSDP share: units of layers, where each unit's compute falls in a step, the sharded actions.

A *unit* is a group of consecutive layers whose parameters are gathered together (an FSDP-wrapped module,
a ZeRO-3 prefetch group). Compute is divided among units in proportion to their parameter bytes, forward in
layer order and backward in reverse, the assumption ``syncsim.schemes.allreduce.gradient_buckets`` makes
for DDP's buckets: of a step's compute, the first 1 - b is forward and the last b backward (b:
``Workload.backward_fraction``), and unit k's share of each is u_k / U.

Nothing here imports SimPy or torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from syncsim.limits import MAX_BUCKETS
from syncsim.schemes.actions import AllGatherParameters, ReduceScatterGradients

__all__ = ["unit_sizes", "unit_marks", "forward_gather", "backward_gather", "unit_scatter", "equal_buckets",
           "gathered_peak"]


def unit_sizes(param_bytes: float, layers: Sequence[float] | None, unit_bytes: float,
               owner: str = "unit_bytes") -> tuple[float, ...]:
    """fp32 bytes of each unit, forward order.

    With per-layer sizes, consecutive layers are grouped until a group holds at least ``unit_bytes`` (torch
    FSDP's ``size_based_auto_wrap_policy`` wraps a module once the parameters not yet wrapped under it reach
    ``min_num_params``, torch/distributed/fsdp/wrap.py); what is left at the end is a unit of its own (FSDP
    would put it in the root unit). Without them the model is taken as finely divisible, as
    ``gradient_buckets`` takes it: equal units of at most ``unit_bytes``."""
    if layers is None:
        count = max(1, math.ceil(param_bytes / unit_bytes - 1e-9))
        if count > MAX_BUCKETS:
            raise ValueError(f"{owner}: {param_bytes:g} bytes of parameters in units of {unit_bytes:g} bytes make "
                             f"{count:,} units, more than the {MAX_BUCKETS:,} allowed (syncsim.limits.MAX_BUCKETS); "
                             f"raise it to at least {math.ceil(param_bytes / MAX_BUCKETS):,}")
        return (param_bytes / count,) * count
    units, current = [], 0.0
    for layer in layers:
        current += layer
        if current >= unit_bytes:
            units.append(current)
            current = 0.0
    if current > 0:
        units.append(current)
    return tuple(units)


def unit_marks(units: Sequence[float], backward_fraction: float) -> tuple[tuple[float, ...], ...]:
    """(forward start, backward start, backward end) of each unit, as fractions of the step's compute.

    Each boundary is computed once, so a unit's backward ends at exactly the fraction at which the next unit's
    (in backward order) begins: what is issued at that point is ordered by the plan, not by rounding."""
    total = float(sum(units))
    forward = 1.0 - backward_fraction
    prefix = [0.0]
    for size in units:
        prefix.append(prefix[-1] + size)
    starts = tuple(forward * before / total for before in prefix[:-1])
    # boundary k of the backward pass: where unit k's backward ends and unit k - 1's begins (units after k first)
    bounds = [min(1.0, forward + backward_fraction * (total - before) / total) for before in prefix]
    bounds[0] = 1.0  # the first unit's backward ends the compute, exactly
    return starts, tuple(bounds[1:]), tuple(bounds[:-1])


def forward_gather(units: Sequence[float], marks: tuple, wire_ratio: float, prefetch: bool) -> AllGatherParameters:
    """Each unit gathered before its forward, in forward order."""
    return AllGatherParameters(units=tuple(u * wire_ratio for u in units), needed=marks[0], phase="forward",
                               prefetch=prefetch)


def backward_gather(units: Sequence[float], marks: tuple, wire_ratio: float, prefetch: bool) -> AllGatherParameters:
    """Each unit gathered again before its backward, in reverse order (after resharding freed it)."""
    order = range(len(units) - 1, -1, -1)
    return AllGatherParameters(units=tuple(units[k] * wire_ratio for k in order),
                               needed=tuple(marks[1][k] for k in order), phase="backward", prefetch=prefetch)


def unit_scatter(units: Sequence[float], marks: tuple, wire_ratio: float, overlap: bool = True
                 ) -> ReduceScatterGradients:
    """Each unit's gradient reduce-scattered once its backward ends (FSDP's post-backward hook), reverse order."""
    order = range(len(units) - 1, -1, -1)
    ready = tuple(marks[2][k] if overlap else 1.0 for k in order)
    return ReduceScatterGradients(buckets=tuple(units[k] * wire_ratio for k in order), ready=ready)


def equal_buckets(param_bytes: float, bucket_bytes: float, owner: str) -> tuple[float, ...]:
    """``param_bytes`` in equal buckets of at most ``bucket_bytes``."""
    return unit_sizes(param_bytes, None, bucket_bytes, owner)


def gathered_peak(units: Sequence[float], prefetch: bool) -> float:
    """fp32 bytes of parameters gathered at once at the peak: the unit being computed and, with prefetch, the
    next one (in forward or backward order alike: a neighbour), as FSDP's rate limiter allows two in flight."""
    if prefetch and len(units) > 1:
        return max(a + b for a, b in zip(units, units[1:]))
    return max(units)
