"""Local SGD: each worker steps on its own replica; replicas are averaged every ``period`` steps.

This is what the seed article called "asynchronous training" (each GPU steps
locally, then parameters are synchronised); the literature calls it periodic
model averaging or local SGD (Stich 2019, "Local SGD Converges Fast and
Communicates Little"; Lin et al. 2020, "Don't Use Large Mini-Batches, Use Local
SGD", which adds the all-reduce warm-up torch's PostLocalSGDOptimizer has).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.collectives import ALGORITHMS
from syncsim.config import check_choice, check_int
from syncsim.schemes.actions import AverageParameters, Compute, LocalUpdate
from syncsim.schemes.allreduce import AllReduce
from syncsim.schemes.policy import Policy, layer_tuple
from syncsim.schemes.spec import Scheme, register

__all__ = ["LocalSGD"]


@register
@dataclass(frozen=True)
class LocalSGD(Scheme):
    name = "localsgd"
    period: int = 8
    """Average the replicas after every ``period`` local steps."""
    warmup_steps: int = 0
    """Steps of plain synchronous all-reduce before local steps begin."""
    algorithm: str = "auto"
    """Collective used to average parameters (and gradients during warm-up)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "period", check_int("LocalSGD", "period", self.period, 1))
        object.__setattr__(self, "warmup_steps", check_int("LocalSGD", "warmup_steps", self.warmup_steps, 0))
        check_choice("LocalSGD", "algorithm", self.algorithm, ALGORITHMS)

    def is_sync_step(self, step: int, steps: int) -> bool:
        """Whether the replicas are averaged at the end of ``step``; the last step always ends synchronised.

        That final average is one more than the period calls for when
        ``steps - warmup_steps`` is not a multiple of ``period``, and it counts
        in the steady-state step time: choose such step counts for timing.
        """
        return (step + 1 - self.warmup_steps) % self.period == 0 or step == steps - 1

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3, shapes: Sequence[Sequence[int]] | None = None) -> Policy:
        warm = AllReduce(algorithm=self.algorithm, precision=self.precision).action(
            param_bytes, layers, backward_fraction)
        warm_plan = (Compute(), warm)
        local = (Compute(), LocalUpdate())
        synced = local + (AverageParameters(nbytes=param_bytes * self.wire_ratio, algorithm=self.algorithm),)

        def planner(step: int, steps: int):
            if step < self.warmup_steps:
                return warm_plan
            return synced if self.is_sync_step(step, steps) else local

        def distinct(steps: int) -> tuple[int, ...]:
            # the three plans: a warm-up step (step 0, if any), a local step (the first after
            # warm-up, unless period is 1) and an averaging step (the last step always is one)
            return 0, self.warmup_steps, steps - 1

        return Policy(self, param_bytes, layer_tuple(param_bytes, layers), planner, distinct)
