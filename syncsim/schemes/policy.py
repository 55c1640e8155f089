"""A policy: the per-step plan of one scheme for one model size.

Policies are pure: they import neither SimPy nor torch, and every worker gets
the same plan for the same step, which is what makes the simulator and the
real executor comparable action by action.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from syncsim.schemes.actions import Action

__all__ = ["Policy"]


@dataclass(frozen=True)
class Policy:
    """``plan(step, steps)`` gives the actions of one worker's step ``step`` of ``steps``."""

    scheme: object
    param_bytes: float
    layers: tuple[float, ...] | None
    _planner: Callable[[int, int], tuple[Action, ...]] = field(repr=False)

    def plan(self, step: int, steps: int) -> tuple[Action, ...]:
        if not 0 <= step < steps:
            raise ValueError(f"step must be in [0, {steps}), got {step}")
        return self._planner(step, steps)

    def plans(self, steps: int) -> list[tuple[Action, ...]]:
        return [self.plan(step, steps) for step in range(steps)]

    def action_types(self, steps: int) -> set[type]:
        """Every kind of action the plan uses over ``steps`` steps (what an executor must set up)."""
        return {type(action) for plan in self.plans(steps) for action in plan}

    def wire_bytes(self, steps: int) -> float:
        """Payload bytes one worker sends over ``steps`` steps (collectives count the input size)."""
        total = 0.0
        for plan in self.plans(steps):
            for action in plan:
                total += getattr(action, "nbytes", 0.0)
        return total


def layer_tuple(param_bytes: float, layers: Sequence[float] | None) -> tuple[float, ...] | None:
    return None if layers is None else tuple(float(b) for b in layers)
