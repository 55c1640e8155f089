"""A policy: the per-step plan of one scheme for one model size.

Policies are pure: they import neither SimPy nor torch, and every worker gets
the same plan for the same step, which is what makes the simulator and the
real executor comparable action by action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from syncsim.schemes.actions import SERVER_ACTIONS, Action

__all__ = ["Policy", "StateLayout", "REPLICATED", "SHARDED", "ON_SERVERS"]

REPLICATED, SHARDED, ON_SERVERS = "replicated", "sharded", "servers"


@dataclass(frozen=True)
class StateLayout:
    """Where one worker's training state lives: what ``syncsim.memory`` counts, read off the policy, never
    off the scheme's type.

    ``value_bytes`` is the working precision of the parameters and gradients a worker computes with; the
    optimiser's state (and an fp32 master copy when that precision is 16-bit) is counted by syncsim.memory.
    ``parameters``, ``gradients`` and ``optimizer`` are each REPLICATED (every worker holds all of it),
    SHARDED (each worker holds 1/W) or, for the optimiser, ON_SERVERS (none on the workers). ``extra_bytes``
    is further per-worker state per parameter (an error-feedback residual, DiLoCo's outer copy);
    ``transient`` the bytes of the buffers a step holds at its peak besides that state (parameters gathered
    for the units being computed, gradients awaiting their reduce-scatter)."""

    value_bytes: int = 4
    parameters: str = REPLICATED
    gradients: str = REPLICATED
    optimizer: str = REPLICATED
    extra_bytes: float = 0.0
    transient: float = 0.0

    def __post_init__(self) -> None:
        for name, allowed in (("parameters", (REPLICATED, SHARDED)), ("gradients", (REPLICATED, SHARDED)),
                              ("optimizer", (REPLICATED, SHARDED, ON_SERVERS))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"StateLayout.{name} must be one of {allowed}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Policy:
    """``plan(step, steps)`` gives the actions of one worker's step ``step`` of ``steps``.

    ``distinct_steps(steps)`` names a few steps whose plans, between them, include every
    distinct plan of a ``steps``-step run, so that what a run needs (which actions, which
    bucket sizes) is known without building a plan per step: a million-step run costs the
    same to set up as a ten-step one. Each scheme states its own (tests check them against
    every step); by default it is every step.
    """

    scheme: object
    param_bytes: float
    layers: tuple[float, ...] | None
    _planner: Callable[[int, int], tuple[Action, ...]] = field(repr=False)
    _distinct: Callable[[int], Iterable[int]] | None = field(default=None, repr=False)
    layout: StateLayout = field(default=StateLayout())
    """Where the worker's training state lives (syncsim.memory)."""

    @classmethod
    def constant(cls, scheme: object, param_bytes: float, layers: Sequence[float] | None,
                 plan: tuple[Action, ...], layout: StateLayout = StateLayout()) -> Policy:
        """The same plan every step."""
        return cls(scheme, param_bytes, layer_tuple(param_bytes, layers), lambda step, steps: plan, lambda steps: (0,),
                   layout)

    def plan(self, step: int, steps: int) -> tuple[Action, ...]:
        if not 0 <= step < steps:
            raise ValueError(f"step must be in [0, {steps}), got {step}")
        return self._planner(step, steps)

    def plans(self, steps: int) -> list[tuple[Action, ...]]:
        return [self.plan(step, steps) for step in range(steps)]

    def distinct_steps(self, steps: int) -> list[int]:
        chosen = range(steps) if self._distinct is None else self._distinct(steps)
        return sorted({step for step in chosen if 0 <= step < steps})

    def actions(self, steps: int) -> set[Action]:
        """Every distinct action the plan emits over ``steps`` steps."""
        return {action for step in self.distinct_steps(steps) for action in self.plan(step, steps)}

    def action_types(self, steps: int) -> set[type]:
        """Every kind of action the plan uses over ``steps`` steps (what an executor must set up)."""
        return {type(action) for action in self.actions(steps)}

    def needs_servers(self, steps: int) -> bool:
        """Whether the plan talks to parameter servers over ``steps`` steps (any of SERVER_ACTIONS): read off
        the plan, not the scheme's type (the one rule of docs/architecture.md)."""
        return any(issubclass(kind, SERVER_ACTIONS) for kind in self.action_types(steps))

    def wire_bytes(self, steps: int) -> float:
        """Payload bytes one worker sends over ``steps`` steps (collectives count the input size)."""
        total = 0.0
        for step in range(steps):
            for action in self.plan(step, steps):
                total += getattr(action, "nbytes", 0.0)
        return total


def layer_tuple(param_bytes: float, layers: Sequence[float] | None) -> tuple[float, ...] | None:
    return None if layers is None else tuple(float(b) for b in layers)
