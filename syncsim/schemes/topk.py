"""Top-k sparsification with error feedback: each worker sends its k largest gradient entries.

Stich, Cordonnier & Jaggi 2018, "Sparsified SGD with Memory" (error feedback:
what is not sent is kept and added to the next gradient); Lin et al. 2018,
"Deep Gradient Compression" (the same with momentum correction, which this
scheme leaves out: the replicas' optimiser runs on the applied sparse mean).
Each worker picks its own entries, so the sparse gradients do not add up in
place: they travel by all-gather (every worker receives every worker's values
and indices), whose bytes per worker grow with the number of workers, unlike
an all-reduce's (Renggli et al. 2019, "SparCML", make the same point).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.config import check_float
from syncsim.schemes.actions import Compute, SparseAllGather
from syncsim.schemes.policy import Policy, StateLayout
from syncsim.schemes.spec import Scheme, register

__all__ = ["TopK", "top_k"]


def top_k(values: int, ratio: float) -> int:
    """Entries sent out of ``values``: ⌈ratio · n⌉, at least 1 (the tiny epsilon keeps a ratio · n of
    3.0000000000000004 at 3)."""
    return max(1, min(values, math.ceil(ratio * values - 1e-9)))


@register
@dataclass(frozen=True)
class TopK(Scheme):
    name = "topk"
    ratio: float = 0.01
    """Share of the gradient's values each worker sends: k = ⌈ratio · n⌉ (at least 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "ratio", check_float("TopK", "ratio", self.ratio, low=0.0, high=1.0,
                                                      low_open=True))

    def k(self, values: int) -> int:
        return top_k(values, self.ratio)

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3, shapes: Sequence[Sequence[int]] | None = None) -> Policy:
        values = max(1, int(round(param_bytes / 4)))
        action = SparseAllGather(values=self.k(values), size=values, value_bytes=self.value_bytes, ratio=self.ratio)
        # each worker keeps its error-feedback residual, one fp32 value per parameter
        return Policy.constant(self, param_bytes, layers, (Compute(), action), StateLayout(extra_bytes=4.0))
