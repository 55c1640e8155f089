"""The simulated model's versions: the authoritative one, and which one each worker's next gradient reads."""

from __future__ import annotations

import numpy as np

from syncsim.communicator import REDUCESCATTER
from syncsim.recorder import Recorder

__all__ = ["ModelState"]

# Collectives after which every worker's gradient of the step has been applied (one update row each);
# the others (parameter averaging, outer steps) fold the workers' local steps into the new version.
_GRADIENT_COLLECTIVES = ("allreduce", "allgather", REDUCESCATTER)


class ModelState:
    """The authoritative version, and which version each worker's next gradient reads."""

    def __init__(self, workers: int, recorder: Recorder) -> None:
        self.version = 0
        self.read = [0] * workers
        self.recorder = recorder
        self.workers = np.arange(workers)
        self.local: list[list[int]] = [[] for _ in range(workers)]  # local steps not yet averaged

    def collective_done(self, kind: str, step: int, time: float) -> None:
        version = self.version
        if kind in _GRADIENT_COLLECTIVES:
            self.recorder.updates(self.workers, step, version, version, time)
        else:  # parameter averaging folds every worker's local steps into the new version
            for w, steps in enumerate(self.local):
                if steps:
                    self.recorder.updates(np.full(len(steps), w), np.asarray(steps), version, version, time)
                    steps.clear()
        self.version = version + 1
        self.read[:] = [version + 1] * len(self.read)
