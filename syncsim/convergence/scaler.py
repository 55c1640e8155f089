"""Dynamic loss scaling for gradients that cross the wire in fp16.

fp16 spans only ~6e-8 to 65,504: small gradients underflow to 0 unless the
loss (hence every gradient) is multiplied by a scale S before backward, and
divided by S again in fp32 before the optimiser step. The scale adapts as in
torch's GradScaler, with its defaults (torch.amp.GradScaler: init_scale=2**16,
growth_factor=2.0, backoff_factor=0.5, growth_interval=2000): a step whose
scaled gradient is not finite is skipped — parameters and optimiser state
untouched — and the scale halves; after 2,000 finite steps in a row it doubles.
bf16 has fp32's exponent range and needs no scaling (torch's autocast docs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from syncsim.config import check_float, check_int

__all__ = ["LossScaling", "LossScaler"]


@dataclass(frozen=True)
class LossScaling:
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        owner = "LossScaling"
        object.__setattr__(self, "init_scale", check_float(owner, "init_scale", self.init_scale,
                                                           low=0.0, low_open=True))
        object.__setattr__(self, "growth_factor", check_float(owner, "growth_factor", self.growth_factor,
                                                              low=1.0, low_open=True))
        object.__setattr__(self, "backoff_factor", check_float(owner, "backoff_factor", self.backoff_factor,
                                                               low=0.0, high=1.0, low_open=True, high_open=True))
        object.__setattr__(self, "growth_interval", check_int(owner, "growth_interval", self.growth_interval, 1))

    def scaler(self, workers: int = 1) -> LossScaler:
        return LossScaler(self, workers)


class LossScaler:
    """One GradScaler per worker: ``scale[w]`` and its count of finite steps in a row."""

    def __init__(self, config: LossScaling, workers: int) -> None:
        self.config = config
        self.scale = np.full(workers, config.init_scale)
        self.good_steps = np.zeros(workers, dtype=np.int64)

    def update(self, worker: int, found_inf: bool) -> None:
        """After worker ``worker``'s step: back off on overflow, else count towards growth."""
        config = self.config
        if found_inf:
            self.scale[worker] *= config.backoff_factor
            self.good_steps[worker] = 0
            return
        self.good_steps[worker] += 1
        if self.good_steps[worker] == config.growth_interval:
            self.scale[worker] *= config.growth_factor
            self.good_steps[worker] = 0
