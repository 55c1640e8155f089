"""Synchronous data parallelism: all-reduce the gradients every step (DDP), optionally PowerSGD-compressed.

``compression="powersgd"`` all-reduces rank-``rank`` factors instead of the
gradients (Vogels, Karimireddy & Jaggi 2019), as torch's DDP hook
``powerSGD_hook`` does (torch.distributed.algorithms.ddp_comm_hooks
.powerSGD_hook): every tensor is viewed as shape[0] rows by the rest; it is
compressed when ``min_compression`` × rank·(rows + cols) < rows·cols
(torch's ``min_compression_rate``, default 2), otherwise all-reduced as it is. The factors are sent after the
backward pass (no per-bucket overlap: torch's hook compresses per DDP bucket,
which this simulation does not split).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.collectives import ALGORITHMS
from syncsim.config import check_bool, check_choice, check_float, check_int
from syncsim.limits import MAX_BUCKETS
from syncsim.schemes.actions import AllReduceGradients, Compute, LowRankAllReduce
from syncsim.schemes.policy import Policy, StateLayout
from syncsim.schemes.spec import Scheme, register
from syncsim.units import parse_size

__all__ = ["AllReduce", "ALGORITHMS", "COMPRESSIONS", "DEFAULT_BUCKET_BYTES", "gradient_buckets", "matrix_split",
           "tensor_view",
           "default_shapes"]

COMPRESSIONS = ("none", "powersgd")

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
    compression: str = "none"
    """"none", or "powersgd": rank-``rank`` low-rank factors with error feedback and warm start."""
    rank: int = 1
    """PowerSGD's rank (torch's ``matrix_approximation_rank``, default 1)."""
    min_compression: float = 2.0
    """Compress a matrix only when this many times fewer values go on the wire (torch's
    ``min_compression_rate``, default 2); 0 compresses every matrix, even at full rank."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("AllReduce", "compression", self.compression, COMPRESSIONS)
        object.__setattr__(self, "rank", check_int("AllReduce", "rank", self.rank, 1))
        object.__setattr__(self, "min_compression", check_float("AllReduce", "min_compression",
                                                                self.min_compression, low=0.0))
        if self.compression == "none" and (self.rank != 1 or self.min_compression != 2.0):
            raise ValueError(f"AllReduce.rank={self.rank} and min_compression={self.min_compression:g} apply to "
                             f"compression='powersgd' only, got compression='none'")
        check_choice("AllReduce", "algorithm", self.algorithm, ALGORITHMS)
        bucket = parse_size(self.bucket_bytes, "AllReduce.bucket_bytes")
        object.__setattr__(self, "bucket_bytes", check_float("AllReduce", "bucket_bytes", bucket,
                                                             low=1.0))
        object.__setattr__(self, "overlap", check_bool("AllReduce", "overlap", self.overlap))

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3, shapes: Sequence[Sequence[int]] | None = None) -> Policy:
        layout = StateLayout()
        if self.compression == "powersgd":
            action = self.low_rank(param_bytes, layers, shapes)
            layout = StateLayout(extra_bytes=4.0)  # each worker's error-feedback residual (P and Q are small)
        else:
            action = self.action(param_bytes, layers, backward_fraction)
        return Policy.constant(self, param_bytes, layers, (Compute(), action), layout)

    def low_rank(self, param_bytes: float, layers: Sequence[float] | None,
                 shapes: Sequence[Sequence[int]] | None) -> LowRankAllReduce:
        tensors = default_shapes(param_bytes, layers) if shapes is None else shapes
        matrices, vectors = matrix_split(tensors, self.rank, self.min_compression)
        return LowRankAllReduce(rank=self.rank, matrices=matrices, uncompressed=vectors,
                                value_bytes=self.value_bytes, algorithm=self.algorithm,
                                min_compression=self.min_compression)

    def action(self, param_bytes: float, layers: Sequence[float] | None,
               backward_fraction: float) -> AllReduceGradients:
        sizes, ready = gradient_buckets(param_bytes, layers, self.bucket_bytes, backward_fraction)
        if not self.overlap:
            ready = tuple(1.0 for _ in ready)
        return AllReduceGradients(buckets=tuple(s * self.wire_ratio for s in sizes), ready=ready,
                                  algorithm=self.algorithm, bucket_bytes=self.bucket_bytes)


def tensor_view(shape: Sequence[int], rank: int, min_compression: float) -> tuple[int, int, int]:
    """(rows, cols, r) of one tensor as PowerSGD sees it; r = 0 when it is sent as it is.

    As torch's hook (``powerSGD_hook``, ``_should_compress``): every tensor is viewed as rows =
    shape[0] by cols = the rest (a vector of n as n × 1); with r = min(rank, rows, cols) it is
    compressed when min_compression · r·(rows + cols) < rows·cols."""
    rows = int(shape[0])
    cols = math.prod(shape) // rows
    r = min(rank, rows, cols)
    return rows, cols, r if min_compression * r * (rows + cols) < rows * cols else 0


def matrix_split(shapes: Sequence[Sequence[int]], rank: int,
                 min_compression: float) -> tuple[tuple[tuple[int, int], ...], int]:
    """(the (rows, cols) of each tensor PowerSGD compresses, the values it sends as they are); see
    ``tensor_view``."""
    matrices, vectors = [], 0
    for shape in shapes:
        rows, cols, r = tensor_view(shape, rank, min_compression)
        if r:
            matrices.append((rows, cols))
        else:
            vectors += rows * cols
    return tuple(matrices), vectors


def default_shapes(param_bytes: float, layers: Sequence[float] | None) -> tuple[tuple[int, ...], ...]:
    """Tensor shapes when a workload gives none: each layer (or the whole model) as one matrix of
    ⌊√n⌋ rows and as many full columns as fit, the remainder a vector. An assumption, stated: a
    low-rank compressor then sends about 2·rank·√n values per layer."""
    out: list[tuple[int, ...]] = []
    for layer in (layers if layers is not None else (param_bytes,)):
        n = int(round(layer / 4))
        rows = math.isqrt(n)
        cols = n // rows if rows else 0
        if rows >= 2 and cols >= 2:
            out.append((rows, cols))
            n -= rows * cols
        if n:
            out.append((n,))
    return tuple(out)


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
