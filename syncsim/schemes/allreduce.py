"""Synchronous data parallelism: all-reduce the gradients every step (DDP)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.collectives import ALGORITHMS
from syncsim.config import check_bool, check_choice, check_float
from syncsim.limits import MAX_BUCKETS
from syncsim.schemes.actions import AllReduceGradients, Compute
from syncsim.schemes.policy import Policy
from syncsim.schemes.spec import Scheme, register
from syncsim.units import parse_size

__all__ = ["AllReduce", "ALGORITHMS", "DEFAULT_BUCKET_BYTES", "gradient_buckets"]

# torch DistributedDataParallel's default bucket_cap_mb = 25 (MiB).
DEFAULT_BUCKET_BYTES = 25 * 2**20


@register
@dataclass(frozen=True)
class AllReduce(Scheme):
    name = "allreduce"
    algorithm: str = "auto"
    """Collective algorithm per bucket: "auto" (NCCL's choice), "ring", "tree", "hierarchical", "binomial"."""
    bucket_bytes: float = DEFAULT_BUCKET_BYTES
    """Gradient bytes (fp32) per bucket; DDP's ``bucket_cap_mb`` in bytes."""
    overlap: bool = True
    """All-reduce each bucket as soon as backward produces it, as DDP does."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("AllReduce", "algorithm", self.algorithm, ALGORITHMS)
        bucket = parse_size(self.bucket_bytes, "AllReduce.bucket_bytes")
        object.__setattr__(self, "bucket_bytes", check_float("AllReduce", "bucket_bytes", bucket,
                                                             low=1.0))
        object.__setattr__(self, "overlap", check_bool("AllReduce", "overlap", self.overlap))

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3) -> Policy:
        return Policy.constant(self, param_bytes, layers, (Compute(), self.action(param_bytes, layers,
                                                                                 backward_fraction)))

    def action(self, param_bytes: float, layers: Sequence[float] | None,
               backward_fraction: float) -> AllReduceGradients:
        sizes, ready = gradient_buckets(param_bytes, layers, self.bucket_bytes, backward_fraction)
        if not self.overlap:
            ready = tuple(1.0 for _ in ready)
        return AllReduceGradients(buckets=tuple(s * self.wire_ratio for s in sizes), ready=ready,
                                  algorithm=self.algorithm, bucket_bytes=self.bucket_bytes)


def gradient_buckets(param_bytes: float, layers: Sequence[float] | None, bucket_bytes: float,
                     backward_fraction: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """DDP-style buckets: (fp32 bytes of each bucket, fraction of compute after which it is ready).

    Gradients appear in reverse layer order during backward; DDP fills a bucket
    until it reaches the cap (torch/csrc/distributed/c10d/reducer.cpp,
    ``compute_bucket_assignment_by_size``). Backward time is taken as
    proportional to parameter bytes. Without per-layer sizes the model is
    treated as finely divisible: equal buckets of at most ``bucket_bytes``.
    After its first iteration DDP rebuilds buckets in the order gradients
    actually became ready (a layer's weight can precede its bias), so real
    bucket boundaries can shift by a tensor; count and total stay the same.
    """
    if layers is None:
        count = max(1, math.ceil(param_bytes / bucket_bytes - 1e-9))
        if count > MAX_BUCKETS:
            raise ValueError(f"AllReduce.bucket_bytes: {param_bytes:g} bytes of gradients in buckets of "
                             f"{bucket_bytes:g} bytes make {count:,} buckets, more than the {MAX_BUCKETS:,} allowed "
                             f"(syncsim.limits.MAX_BUCKETS); raise bucket_bytes to at least "
                             f"{math.ceil(param_bytes / MAX_BUCKETS):,}")
        sizes = [param_bytes / count] * count
    else:
        sizes, current = [], 0.0
        for layer in reversed(layers):
            current += layer
            if current >= bucket_bytes:
                sizes.append(current)
                current = 0.0
        if current > 0:
            sizes.append(current)
    total = sum(sizes)
    forward = 1.0 - backward_fraction
    ready, done = [], 0.0
    for size in sizes:
        done += size
        ready.append(min(1.0, forward + backward_fraction * done / total))
    ready[-1] = 1.0
    return tuple(sizes), tuple(ready)
