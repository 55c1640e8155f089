"""ZeRO: data parallelism that partitions the optimiser state (stage 1), the gradients (2) and the parameters (3).

Rajbhandari, Rasley, Ruwase & He 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (SC20), as DeepSpeed runs it (deepspeed/runtime/zero). Every worker keeps 1/W of the optimiser's
state (stage 1), of the gradients too (stage 2), of the parameters too (stage 3) and updates only its
shard; section 7 counts the communication: stages 1 and 2 reduce-scatter the gradients (Ψ) and all-gather
the updated parameters (Ψ), 2Ψ per step like an all-reduce; stage 3 all-gathers each unit's parameters
before its forward and again before its backward and reduce-scatters the gradients, 3Ψ.

- Stages 1 and 2: a step computes on the full parameters, reduce-scatters the gradients in buckets as
  backward produces them (``overlap``, DeepSpeed's ``overlap_comm``) or after it, each worker steps its
  shard, and the updated parameters are all-gathered in buckets (DeepSpeed's ``allgather_partitions``,
  after the optimiser step, before the next forward). The two stages move the same bytes; they differ in
  the memory the gradients take (syncsim.memory).
- Stage 3: the parameters are gathered unit by unit before each unit's forward and again before its
  backward, each one unit ahead of its need (DeepSpeed's prefetch), and freed after use; units are groups
  of consecutive layers of at least DeepSpeed's ``stage3_prefetch_bucket_size`` (5e7 values).

DeepSpeed's defaults (deepspeed/runtime/zero/config.py): ``reduce_bucket_size`` and
``allgather_bucket_size`` 5e8 values (``bucket_bytes`` 2e9 fp32 bytes), ``overlap_comm`` on for stage 3 and
off for 1 and 2 unless set (here on for every stage, as the configurations users publish set it; turn it off
with ``overlap=false``).

``precision`` is here the working precision of the parameters and gradients as well as what crosses the
wire, since the gathers carry the very parameters the workers compute with: ``precision=bf16`` is mixed
precision, with the fp32 master copy in the sharded optimiser state (syncsim.memory counts it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.config import check_bool, check_float, check_int
from syncsim.schemes.actions import AllGatherParameters, Compute, ReduceScatterGradients, ShardedOptimizerStep
from syncsim.schemes.allreduce import gradient_buckets
from syncsim.schemes.policy import REPLICATED, SHARDED, Policy, StateLayout
from syncsim.schemes.sharded import (
    backward_gather,
    equal_buckets,
    forward_gather,
    gathered_peak,
    unit_marks,
    unit_sizes,
)
from syncsim.schemes.spec import Scheme, register
from syncsim.units import parse_size

__all__ = ["ZeRO", "STAGES", "DEFAULT_ZERO_BUCKET_BYTES", "ZERO3_UNIT_BYTES"]

STAGES = (1, 2, 3)
# DeepSpeed's reduce_bucket_size and allgather_bucket_size default, 5e8 values, in fp32 bytes.
DEFAULT_ZERO_BUCKET_BYTES = 4 * 5e8
# DeepSpeed's stage3_prefetch_bucket_size default, 5e7 values, in fp32 bytes: stage 3's gathering unit.
ZERO3_UNIT_BYTES = 4 * 5e7


@register
@dataclass(frozen=True)
class ZeRO(Scheme):
    name = "zero"
    stage: int = 1
    """1: optimiser state partitioned; 2: and gradients; 3: and parameters."""
    bucket_bytes: float = DEFAULT_ZERO_BUCKET_BYTES
    """Gradient (fp32) bytes per reduce-scatter bucket, and parameter bytes per all-gather bucket of stages 1
    and 2 (DeepSpeed's reduce_bucket_size and allgather_bucket_size, 5e8 values)."""
    overlap: bool = True
    """Reduce-scatter each bucket as soon as backward produces it (DeepSpeed's overlap_comm)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            stage = check_int("ZeRO", "stage", self.stage, min(STAGES), max(STAGES))
        except ValueError:
            raise ValueError(f"ZeRO.stage must be 1, 2 or 3 (1: optimiser state partitioned; 2: and gradients; "
                             f"3: and parameters), got {self.stage!r}") from None
        object.__setattr__(self, "stage", stage)
        bucket = parse_size(self.bucket_bytes, "ZeRO.bucket_bytes")
        object.__setattr__(self, "bucket_bytes", check_float("ZeRO", "bucket_bytes", bucket, low=1.0))
        object.__setattr__(self, "overlap", check_bool("ZeRO", "overlap", self.overlap))

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3, shapes: Sequence[Sequence[int]] | None = None) -> Policy:
        ratio, v = self.wire_ratio, self.value_bytes
        sizes, ready = gradient_buckets(param_bytes, layers, self.bucket_bytes, backward_fraction)
        if not self.overlap:
            ready = tuple(1.0 for _ in ready)
        scatter = ReduceScatterGradients(buckets=tuple(s * ratio for s in sizes), ready=ready)
        if self.stage < 3:
            gathers = equal_buckets(param_bytes, self.bucket_bytes, "ZeRO.bucket_bytes")
            gather = AllGatherParameters(units=tuple(b * ratio for b in gathers), needed=(1.0,) * len(gathers),
                                         phase="step")
            plan = (Compute(), scatter, ShardedOptimizerStep(), gather)
            # stage 2 frees each bucket's gradient once reduce-scattered: one bucket's worth is held at a time
            layout = StateLayout(value_bytes=v, parameters=REPLICATED,
                                 gradients=REPLICATED if self.stage == 1 else SHARDED, optimizer=SHARDED,
                                 transient=0.0 if self.stage == 1 else max(sizes) * v / 4)
        else:
            units = unit_sizes(param_bytes, layers, ZERO3_UNIT_BYTES, "ZeRO units")
            marks = unit_marks(units, backward_fraction)
            plan = (forward_gather(units, marks, ratio, prefetch=True), Compute(),
                    backward_gather(units, marks, ratio, prefetch=True), scatter, ShardedOptimizerStep())
            layout = StateLayout(value_bytes=v, parameters=SHARDED, gradients=SHARDED, optimizer=SHARDED,
                                 transient=(gathered_peak(units, True) + max(sizes)) * v / 4)
        return Policy.constant(self, param_bytes, layers, plan, layout)
