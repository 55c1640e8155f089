"""A stand-in for the validation study's calibration and runs: the simulator itself plays the testbed, so
tests of the study's grid, report and resume run without root or a network."""

from __future__ import annotations

from real.validation import evaluation
from real.validation.calibration import Calibration
from real.validation.losses import LOSS_STEPS
from real.validation.measurement import SPREAD_WINDOWS, Measurement
from studies import validation
from syncsim import Cluster, Link, Workload, simulate
from syncsim.metrics import step_time_spread


def fake_study(monkeypatch, fail: set):
    """calibrate gives a fixed cluster; measure 'runs' the simulator itself (or fails for ``fail``)."""
    calls = []

    def calibrate(config, settings):
        cluster = Cluster.homogeneous(config.world, Link("20MB/s", "100us"), servers=config.servers,
                                      jitter=0.1)
        workload = Workload(param_bytes="400kB", compute_time="2ms", batch_size=settings.batch_size)
        return Calibration(cluster, workload, {"compute_time": 2e-3, "jitter": 0.1})

    def measure(config, settings, folder, steps, slow_forward=None):
        calls.append(config.key)
        if config.key in fail:
            raise RuntimeError("rank 1 (worker) failed at step 3: injected")
        calibration = calibrate(config, settings)
        result = simulate(calibration.cluster, calibration.workload, config.scheme, steps=steps, seed=1)
        result.trace.to_csv(folder / "trace.csv", index=False)  # where a real run leaves its trace
        return Measurement(result.steady, step_time_spread(result.trace, SPREAD_WINDOWS, steps, config.world), 0,
                           result.trace)

    def loss_figures(folder, steps):  # a simulated run logs no losses: its comparison is a fixed stand-in
        assert (folder / "trace.csv").exists() and steps == LOSS_STEPS
        return {"loss_steps": steps, "loss_rel_median": 1e-7, "loss_rel_max": 2e-6}

    monkeypatch.setattr(evaluation, "calibrate", calibrate)
    monkeypatch.setattr(evaluation, "measure", measure)
    monkeypatch.setattr(evaluation, "loss_figures", loss_figures)
    monkeypatch.setattr(validation, "loss_figures", loss_figures)  # a resumed study's older rows (fill_in_older_rows)
    monkeypatch.setattr("real.testbed.unavailable", lambda: None)
    return calls
