"""One configuration evaluated: calibrated, predicted, measured and compared, as one row of the study's table."""

from __future__ import annotations

import math
import time
from pathlib import Path

from real.validation.calibration import calibrate
from real.validation.config import KEY, Config
from real.validation.losses import loss_figures
from real.validation.measurement import measure
from real.validation.prediction import as_run_on_gloo, predict, replay, run_steps
from real.validation.settings import Settings

__all__ = ["evaluate", "compared"]


def evaluate(config: Config, settings: Settings) -> dict:
    """One row: calibrate, predict, measure, compare; a failure is a row with its reason."""
    started = time.perf_counter()
    row: dict = dict(zip(KEY, config.key)) | {"steps": settings.steps, "batch_size": settings.batch_size}
    try:
        _fill(row, config, settings, settings.out / "runs" / config.name)
    except Exception as err:  # the study goes on; the row says why this configuration has no figures
        row["error"] = f"{type(err).__name__}: {err}".replace("\n", " ")[:500]
    row["wall_time"] = time.perf_counter() - started
    return row


def _fill(row: dict, config: Config, settings: Settings, folder: Path) -> None:
    """``row``'s figures, each written as soon as it is known: a failure keeps those before it."""
    from syncsim import simulate

    calibration = calibrate(config, settings)
    cluster, workload = calibration.cluster, calibration.workload
    row.update(calibration.values)
    scheme = as_run_on_gloo(config.scheme)
    result = simulate(cluster, workload, scheme, steps=settings.steps, seed=0)
    steps = row["run_steps"] = run_steps(settings.steps, result.makespan)
    if steps != settings.steps:
        result = simulate(cluster, workload, scheme, steps=steps, seed=0)
    folder.mkdir(parents=True, exist_ok=True)
    result.trace.to_csv(folder / "sim-trace.csv", index=False)  # beside the real trace.csv, to compare
    result.updates.to_csv(folder / "sim-updates.csv", index=False)
    prediction = predict(result)
    row["predicted_seed_cv"] = prediction.seed_cv
    forward = calibration.values.get("slow_forward", math.nan)  # what the probe's slowed rank sized its sleep from
    measured = measure(config, settings, folder, steps, slow_forward=None if math.isnan(forward) else forward)
    row["measured_spread"], row["dropped"] = measured.spread, measured.dropped
    row.update(compared(prediction.steady, measured.steady), error="")
    row["replayed_step_time"] = replay(cluster, workload, scheme, measured.trace, steps, config.world)
    # the run's own schedule replayed on its model and data: its logged losses, predicted step by step
    row.update(loss_figures(folder, settings.loss_steps))


def compared(predicted, measured) -> dict:
    """The predicted and measured steady states' figures side by side (syncsim.metrics.SteadyState each),
    and how far apart their staleness distributions lie (syncsim.metrics.staleness_distance)."""
    from syncsim.metrics import staleness_distance

    return dict(predicted_step_time=predicted.step_time, measured_step_time=measured.step_time,
                predicted_throughput=predicted.throughput, measured_throughput=measured.throughput,
                predicted_staleness_mean=predicted.staleness_mean, measured_staleness_mean=measured.staleness_mean,
                predicted_staleness_max=predicted.staleness_max, measured_staleness_max=measured.staleness_max,
                staleness_distance=staleness_distance(predicted.staleness, measured.staleness))
