"""One configuration of the validation: a scheme on some workers behind links of one rate, a model, and
one slowed worker or none; what its run is made of (the model's bytes and tensor shapes)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Config", "KEY", "STEPS", "is_baseline", "model_bytes", "model_shapes"]

STEPS = 40  # a multiple of every local-SGD period here, warm-up (a tenth) included: whole periods are timed
KEY = ("scheme", "world", "servers", "bandwidth", "model", "slow")
"""The columns that name a configuration in a table of rows (Config.key, in this order)."""


def is_baseline(scheme, world, slow):
    """Whether a configuration is the speedup baseline, one worker all-reducing at full speed; of a
    Config's fields or, elementwise, of a table's columns."""
    return (scheme == "allreduce") & (world == 1) & (slow == 1)


@dataclass(frozen=True)
class Config:
    """One configuration of the study; ``slow`` > 1 slows the last worker by that factor."""

    scheme: str
    world: int
    bandwidth: str
    model: str
    slow: float = 1.0

    def __post_init__(self) -> None:
        from real.config import MODELS as REAL_MODELS
        from real.testbed import TestbedConfig
        from syncsim.config import check_choice, check_float, check_int
        from syncsim.schemes import parse

        try:
            object.__setattr__(self, "scheme", str(parse(self.scheme)))
        except ValueError as err:
            raise ValueError(f"Config.scheme: {err}") from None
        object.__setattr__(self, "world", check_int("Config", "world", self.world, 1))
        try:  # a rate the testbed can shape
            TestbedConfig(bandwidth=self.bandwidth)
        except ValueError as err:
            raise ValueError(f"Config.bandwidth: {err}") from None
        check_choice("Config", "model", self.model, REAL_MODELS)
        object.__setattr__(self, "slow", check_float("Config", "slow", self.slow, low=1.0))

    @property
    def servers(self) -> int:
        """One parameter-server host for a scheme that pushes, none otherwise (read off its plan)."""
        from real.config import needs_servers

        return int(needs_servers(self.scheme))

    @property
    def ranks(self) -> int:
        return self.world + self.servers

    @property
    def link_hosts(self) -> int:
        """Hosts of this configuration's link probe: all-reduces run over the run's own workers (their
        chunks and their contention for the cores); pushes and pulls are point to point, which two time."""
        return 2 if self.servers else max(2, self.world)

    @property
    def baseline(self) -> bool:
        """One worker all-reducing at full speed: what every speedup of its model is measured against."""
        return bool(is_baseline(self.scheme, self.world, self.slow))

    @property
    def key(self) -> tuple:
        return (self.scheme, self.world, self.servers, self.bandwidth, self.model, float(self.slow))

    @property
    def name(self) -> str:
        from real.calibration.cache import slug

        slow = f"-slow{self.slow:g}" if self.slow > 1 else ""
        return f"{slug(self.scheme)}-w{self.world}-{slug(self.bandwidth)}-{self.model}{slow}"


@functools.cache
def model_bytes(model: str) -> float:
    """fp32 bytes of the parameters of real.models' ``model`` (the compute probe's ``layers``, summed)."""
    from real.models import build, param_layers

    return sum(param_layers(build(model, 0)))


@functools.cache
def model_shapes(model: str) -> tuple[tuple[int, ...], ...]:
    """real.models' ``model``'s parameter tensors' shapes (real.models.param_shapes): what the executor
    builds its plan with (PowerSGD views them as matrices), and so the simulator's Workload.shapes."""
    from real.models import build, param_shapes

    return param_shapes(build(model, 0))
