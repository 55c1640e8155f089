"""DiLoCo: H inner steps of a local optimiser, then an outer step on the averaged pseudo-gradient.

Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of
Language Models": every worker takes ``period`` (H) steps of AdamW on its own
replica; then the workers all-reduce the pseudo-gradient (the parameters at the
last outer step minus their own now), and an outer SGD with Nesterov momentum
(the paper's lr 0.7, momentum 0.9) applies its mean to the last outer
parameters, which every replica then takes. With outer lr 1 and no momentum it
is local SGD (the average of the replicas); with H = 1, inner SGD and that
outer step, synchronous SGD (the average of one SGD step each is one step on
the mean gradient).

Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping
communication"): the parameters are split into ``fragments`` and fragment f is
synchronised H/F steps after fragment f − 1, so every H/F steps 1/F of the
parameters crosses the network instead of all of them every H steps: the same
bytes, spread out. Fragments here are equal contiguous slices of the flat
parameters in forward order (the paper groups transformer blocks). Its overlap
of a fragment's all-reduce with the next inner steps is not modelled: each
outer step holds its workers until its all-reduce ends. The last step of a run
synchronises every fragment (in one all-reduce), so a run ends with equal replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.collectives import ALGORITHMS
from syncsim.config import check_choice, check_float, check_int
from syncsim.schemes.actions import LOCAL_OPTIMIZERS, Compute, LocalUpdate, OuterStep
from syncsim.schemes.policy import Policy, StateLayout, layer_tuple
from syncsim.schemes.spec import Scheme, register

__all__ = ["DiLoCo", "fragment_bounds"]


@register
@dataclass(frozen=True)
class DiLoCo(Scheme):
    name = "diloco"
    period: int = 100
    """H: inner steps between two outer steps of the same fragment."""
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    """Nesterov momentum of the outer SGD (0: plain SGD)."""
    inner: str = "adamw"
    """The workers' own optimiser: "adamw" (the paper's) or "sgd"."""
    fragments: int = 1
    """Streaming DiLoCo's fragments F; ``period`` must be a multiple of F."""
    algorithm: str = "auto"
    """Collective that all-reduces the pseudo-gradients."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "period", check_int("DiLoCo", "period", self.period, 1))
        object.__setattr__(self, "outer_lr", check_float("DiLoCo", "outer_lr", self.outer_lr, low=0.0,
                                                         low_open=True))
        object.__setattr__(self, "outer_momentum", check_float("DiLoCo", "outer_momentum", self.outer_momentum,
                                                               low=0.0, high=1.0, high_open=True))
        check_choice("DiLoCo", "inner", self.inner, LOCAL_OPTIMIZERS)
        object.__setattr__(self, "fragments", check_int("DiLoCo", "fragments", self.fragments, 1))
        check_choice("DiLoCo", "algorithm", self.algorithm, ALGORITHMS)
        if self.period % self.fragments:
            raise ValueError(f"DiLoCo.period={self.period} must be a multiple of fragments={self.fragments}: "
                             f"fragment f is synchronised every period steps, period/fragments after fragment f-1")

    def synced_fragments(self, step: int, steps: int) -> tuple[int, ...]:
        """Fragments whose outer step ends ``step``: fragment f at steps t with (t + 1) ≡ (f + 1)·H/F
        (mod H); every fragment at the last step."""
        if step == steps - 1:
            return tuple(range(self.fragments))
        gap = self.period // self.fragments
        if (step + 1) % gap:
            return ()
        return ((((step + 1) // gap) - 1) % self.fragments,)

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3, shapes: Sequence[Sequence[int]] | None = None) -> Policy:
        values = max(1, int(round(param_bytes / 4)))
        bounds = fragment_bounds(values, self.fragments)
        local = (Compute(), LocalUpdate(optimizer=self.inner))
        plans: dict[tuple[int, ...], tuple] = {(): local}

        def planner(step: int, steps: int):
            synced = self.synced_fragments(step, steps)
            plan = plans.get(synced)
            if plan is None:
                plan = plans[synced] = local + (OuterStep(
                    fragments=synced, count=self.fragments, spans=tuple(bounds[f] for f in synced),
                    value_bytes=self.value_bytes, algorithm=self.algorithm, lr=self.outer_lr,
                    momentum=self.outer_momentum),)
            return plan

        def distinct(steps: int) -> tuple[int, ...]:
            gap = self.period // self.fragments
            return (0, *(gap * (f + 1) - 1 for f in range(self.fragments)), steps - 1)

        # each worker keeps every fragment's last outer value and, with momentum, its Nesterov buffer (fp32)
        layout = StateLayout(extra_bytes=8.0 if self.outer_momentum else 4.0)
        return Policy(self, param_bytes, layer_tuple(param_bytes, layers), planner, distinct, layout)


def fragment_bounds(values: int, fragments: int) -> tuple[tuple[int, int], ...]:
    """[start, stop) of each of ``fragments`` contiguous slices of ``values``: ⌊f·n/F⌋ to ⌊(f+1)·n/F⌋."""
    return tuple((f * values // fragments, (f + 1) * values // fragments) for f in range(fragments))
