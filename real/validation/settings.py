"""What every configuration of one validation study shares: where it writes, how its runs are sized, how
its links are probed, which testbed it builds. The study's command line makes one (studies.validation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings"]


@dataclass(frozen=True)
class Settings:
    """``out``: the study's folder (calibrations under ``out/calibration``, runs under ``out/runs``);
    ``steps`` and ``batch_size``: each run's, per worker, before run_steps resizes a long or short run;
    ``repeats``: the link probe's repeats per message size; ``prefix``: the testbed's namespace prefix;
    ``run_timeout``: seconds before a run is stopped; ``loss_steps``: a run's first steps whose logged
    losses are compared with its replayed schedule (0: none); ``precisions``: the wire precisions the
    study's schemes send, all that its link sweep times (traffic.sent_precisions)."""

    out: Path
    steps: int
    batch_size: int
    repeats: int
    prefix: str
    run_timeout: float
    loss_steps: int
    precisions: tuple[str, ...]

    def __post_init__(self) -> None:
        from syncsim.config import check_float, check_int

        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "steps", check_int("Settings", "steps", self.steps, 2))
        object.__setattr__(self, "batch_size", check_int("Settings", "batch_size", self.batch_size, 1))
        object.__setattr__(self, "repeats", check_int("Settings", "repeats", self.repeats, 1))
        object.__setattr__(self, "loss_steps", check_int("Settings", "loss_steps", self.loss_steps, 0))
        object.__setattr__(self, "run_timeout", check_float("Settings", "run_timeout", self.run_timeout,
                                                            low=0.0, low_open=True))
        object.__setattr__(self, "precisions", tuple(self.precisions))
