"""FSDP: fully sharded data parallelism, unit by unit (PyTorch's FullyShardedDataParallel and fully_shard).

Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023), section
3: the model is wrapped in *units* (groups of layers); every worker keeps 1/W of each unit's parameters,
gradients and optimiser state. Before a unit's forward its parameters are all-gathered; after it they are
freed again (``reshard=true``: FSDP1's ShardingStrategy.FULL_SHARD, FSDP2's reshard_after_forward=True) and
gathered once more before the unit's backward, or kept until the backward is done (``reshard=false``:
SHARD_GRAD_OP, reshard_after_forward=False). Each unit's gradient is reduce-scattered as soon as its
backward ends (the post-backward hook), and each worker steps its own shard. Bytes per step: all-gathers Ψ
(forward) + Ψ (backward, when resharded) and reduce-scatter Ψ, each moving (W - 1)/W of it per worker:
3Ψ or 2Ψ, ZeRO-3's and ZeRO-2's counts (Rajbhandari et al. 2020, section 7).

``prefetch=true`` issues each unit's all-gather when the previous unit's compute begins, so that it
overlaps that compute (FSDP1's ``forward_prefetch=True`` and ``backward_prefetch=BACKWARD_PRE``, FSDP2's
default implicit prefetching; ``limit_all_gathers`` keeps at most two units gathered at once); with
``false`` a gather is issued when its unit is reached and its time is exposed. ``unit_bytes`` groups
consecutive layers of ``Workload.layers`` into units of at least that many fp32 bytes, as torch's
``size_based_auto_wrap_policy`` does with ``min_num_params`` (default 1e8 parameters: 4e8 bytes);
a Llama-class model's transformer blocks are then each one unit, as torchtitan wraps them.

Left out: FSDP's heuristic of not resharding the root unit (its parameters would be gathered again at
once for backward), which saves one unit's gather per step.

``precision`` is here the working precision of the parameters and gradients as well as what crosses the
wire, since the gathers carry the very parameters the workers compute with: ``precision=bf16`` is mixed
precision (FSDP's MixedPrecision(param_dtype=bf16)), with the fp32 master copy in the sharded optimiser
state (syncsim.memory counts it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.config import check_bool, check_float
from syncsim.schemes.actions import Compute, ShardedOptimizerStep
from syncsim.schemes.policy import SHARDED, Policy, StateLayout
from syncsim.schemes.sharded import backward_gather, forward_gather, gathered_peak, unit_marks, unit_scatter, unit_sizes
from syncsim.schemes.spec import Scheme, register
from syncsim.units import parse_size

__all__ = ["FSDP", "DEFAULT_UNIT_BYTES"]

# torch.distributed.fsdp.wrap.size_based_auto_wrap_policy: min_num_params = int(1e8), in fp32 bytes.
DEFAULT_UNIT_BYTES = 4 * 1e8


@register
@dataclass(frozen=True)
class FSDP(Scheme):
    name = "fsdp"
    reshard: bool = True
    """Free each unit's parameters after its forward and gather them again for its backward (FULL_SHARD);
    false keeps them from forward to backward (SHARD_GRAD_OP)."""
    prefetch: bool = True
    """Gather each unit one unit ahead of its need, overlapping the previous unit's compute."""
    unit_bytes: float = DEFAULT_UNIT_BYTES
    """Parameter (fp32) bytes a unit holds at least: consecutive layers are grouped until they reach it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "reshard", check_bool("FSDP", "reshard", self.reshard))
        object.__setattr__(self, "prefetch", check_bool("FSDP", "prefetch", self.prefetch))
        unit = parse_size(self.unit_bytes, "FSDP.unit_bytes")
        object.__setattr__(self, "unit_bytes", check_float("FSDP", "unit_bytes", unit, low=1.0))

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3, shapes: Sequence[Sequence[int]] | None = None) -> Policy:
        ratio, v = self.wire_ratio, self.value_bytes
        units = unit_sizes(param_bytes, layers, self.unit_bytes, "FSDP.unit_bytes")
        marks = unit_marks(units, backward_fraction)
        plan = (forward_gather(units, marks, ratio, self.prefetch), Compute())
        if self.reshard:
            plan += (backward_gather(units, marks, ratio, self.prefetch),)
        plan += (unit_scatter(units, marks, ratio), ShardedOptimizerStep())
        # At the peak (in backward): the gathered units (every unit, without resharding) and one unit's
        # unsharded gradient awaiting its reduce-scatter.
        gathered = gathered_peak(units, self.prefetch) if self.reshard else sum(units)
        layout = StateLayout(value_bytes=v, parameters=SHARDED, gradients=SHARDED, optimizer=SHARDED,
                             transient=(gathered + max(units)) * v / 4)
        return Policy.constant(self, param_bytes, layers, plan, layout)
