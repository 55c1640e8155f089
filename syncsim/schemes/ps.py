"""Parameter server: workers push gradients to server shards and pull parameters.

A parameter server is a topology, not a consistency model: it can run
synchronously (BSP), asynchronously (each gradient applied on arrival, as in
Dean et al. 2012, "Large Scale Distributed Deep Networks"), or with bounded
staleness (Stale Synchronous Parallel, Ho et al. 2013, "More Effective
Distributed ML via a Stale Synchronous Parallel Parameter Server": no worker
runs more than ``s`` clocks ahead of the slowest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from syncsim.config import check_choice, check_int
from syncsim.schemes.actions import Compute, Pull, Push, WaitForClock
from syncsim.schemes.policy import ON_SERVERS, Policy, StateLayout
from syncsim.schemes.spec import Scheme, register

__all__ = ["ParameterServer", "MODES"]

MODES = ("sync", "async", "ssp")


@register
@dataclass(frozen=True)
class ParameterServer(Scheme):
    name = "ps"
    mode: str | None = None
    """"sync", "async" or "ssp"; left out, it is "ssp" when ``staleness`` is set, else "sync"."""
    staleness: int | None = None
    """SSP bound s: clocks the fastest worker may run ahead of the slowest."""

    def __post_init__(self) -> None:
        super().__post_init__()
        mode, staleness = self.mode, self.staleness
        if mode is None:
            mode = "sync" if staleness is None else "ssp"
        check_choice("ParameterServer", "mode", mode, MODES)
        if staleness is not None:
            staleness = check_int("ParameterServer", "staleness", staleness, 0)
            if mode != "ssp":
                raise ValueError(f"ParameterServer.staleness={staleness} applies to mode='ssp' only, "
                                 f"got mode={mode!r} (sync is staleness 0, async is unbounded)")
        elif mode == "ssp":
            raise ValueError("ParameterServer(mode='ssp') needs staleness=s (an integer >= 0)")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "staleness", staleness)

    def canonical_fields(self) -> dict:
        fields = super().canonical_fields()
        if self.mode in ("sync", "ssp"):  # implied by the presence or absence of staleness
            fields.pop("mode", None)
        return fields

    @property
    def slack(self) -> int | None:
        """Clock slack of the worker's wait: 0 for sync, s for SSP, None (no wait) for async."""
        return {"sync": 0, "ssp": self.staleness, "async": None}[self.mode]  # type: ignore[index]

    def policy(self, param_bytes: float, layers: Sequence[float] | None = None,
               backward_fraction: float = 2 / 3, shapes: Sequence[Sequence[int]] | None = None) -> Policy:
        wire = param_bytes * self.wire_ratio
        actions = [Compute(), Push(nbytes=wire, aggregate=self.mode == "sync")]
        if self.slack is not None:
            actions.append(WaitForClock(slack=self.slack))
        actions.append(Pull(nbytes=wire))
        # the servers hold the optimiser's state and apply the gradients; a worker its replica and gradient
        return Policy.constant(self, param_bytes, layers, tuple(actions), StateLayout(optimizer=ON_SERVERS))
