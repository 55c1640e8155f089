"""A run's loss curves: the per-step losses it logged against its own schedule replayed on its model and
data (real.replay, syncsim.convergence)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["LossAgreement", "LOSS_STEPS", "measured_losses", "replayed_losses", "loss_agreement", "loss_figures"]

# Each run's per-step loss is compared with its update log replayed (real.replay) over its first LOSS_STEPS
# steps (--loss-steps). The replay computes every gradient again, as long as the run's compute: 40 steps of
# two LeNet workers took 1.4 s here, four 2.8 s, one 0.6 s, the small model's 0.1-0.2 s, about 1.8 minutes
# over the default grid's rows, whose 25-27 minutes leave 3 of the half hour. 20 steps, half that, still
# cover where the compressing schemes' float32 drift shows (PowerSGD's from step 12, five DiLoCo outer steps).
LOSS_STEPS = 20


class LossAgreement(NamedTuple):
    """How closely a replayed schedule's losses follow a run's: the steps compared, and the median and
    max of |replayed / logged - 1| over them."""

    steps: int
    median: float
    maximum: float


def measured_losses(folder: Path) -> np.ndarray:
    """A real run's per-step losses, (steps, workers): each worker's minibatch loss at each step, as
    real.executor logs it (``losses`` in OUT/ranks/result-rank<r>.json; worker w is rank w)."""
    results = [json.loads(path.read_text()) for path in sorted((folder / "ranks").glob("result-rank*.json"))]
    workers = sorted((r for r in results if r.get("role") == "worker"), key=lambda r: r["rank"])
    if not workers or len({len(r["losses"]) for r in workers}) != 1:
        raise ValueError(f"measured_losses: {folder} holds no workers' losses, or losses of unequal lengths")
    return np.array([r["losses"] for r in workers], dtype=float).T


def replayed_losses(folder: Path, steps: int) -> np.ndarray:
    """The same losses predicted from the run's own schedule, (steps, workers) for its first ``steps`` steps:
    its update log (real.replay.load_log: which version each gradient read and was applied to, the plan
    built for the model's layers and shapes) replayed by syncsim.convergence on the run's model, initial
    weights, data order and learning rate (real.replay.TorchProblem), each worker's minibatch loss taken
    at the parameters its gradient is computed on (the replay's ``on_compute``: its replica, or the
    server version it read), rounded to float32 as the ranks hold them. The replay stops once every
    worker's first ``steps`` losses are taken."""
    import torch
    import torch.nn.functional as F

    from real.models import build
    from real.replay import TorchProblem, load_log
    from syncsim.convergence import Replayer

    config = json.loads((folder / "summary.json").read_text())["config"]
    problem = TorchProblem(model=config["model"], data=config["data"], seed=config["seed"])
    replayer = Replayer(load_log(folder), problem, lr=config["lr"], seed=config["seed"])
    net, dataset = build(config["model"], config["seed"]), problem.dataset
    steps = min(steps, config["steps"])
    losses = np.full((steps, config["world"]), np.nan)
    taken = 0

    def on_compute(worker: int, step: int, x: np.ndarray) -> None:
        nonlocal taken
        if step >= steps:
            return
        flat, offset = torch.from_numpy(np.asarray(x, dtype=np.float32)), 0
        with torch.no_grad():
            for param in net.parameters():
                param.copy_(flat[offset:offset + param.numel()].view_as(param))
                offset += param.numel()
            index = torch.as_tensor(replayer.sampler.indices(worker, step))
            losses[step, worker] = float(F.cross_entropy(net(dataset.x[index]), dataset.y[index]))
        taken += 1

    replayer.run(on_version=lambda *_: taken >= losses.size, on_compute=on_compute)
    return losses


def loss_agreement(measured: np.ndarray, replayed: np.ndarray) -> LossAgreement:
    """How closely the replay of a run's schedule predicts the losses the run logged: |replayed / measured - 1|
    over every (step, worker) of ``replayed``'s steps. A pair where both are not finite (a diverged run, and
    its replay with it) is left out; one where only one is counts as infinitely apart. NaNs when nothing is
    left to compare."""
    steps = min(len(measured), len(replayed))
    real, predicted = measured[:steps], replayed[:steps]
    both = np.isfinite(real) & np.isfinite(predicted)
    kept = both | (np.isfinite(real) != np.isfinite(predicted))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(both, np.abs(predicted / real - 1), np.inf)[kept]
    if not len(rel):
        return LossAgreement(steps, math.nan, math.nan)
    return LossAgreement(steps, float(np.median(rel)), float(rel.max()))


def loss_figures(folder: Path, steps: int = LOSS_STEPS) -> dict:
    """A run's loss-curve columns: loss_steps, loss_rel_median, loss_rel_max (loss_agreement over its first
    ``steps`` steps; none compared, NaNs, when ``steps`` is 0)."""
    if steps <= 0:
        return {"loss_steps": 0, "loss_rel_median": math.nan, "loss_rel_max": math.nan}
    agreement = loss_agreement(measured_losses(folder), replayed_losses(folder, steps))
    return {"loss_steps": agreement.steps, "loss_rel_median": agreement.median, "loss_rel_max": agreement.maximum}
