"""A stand-in for the validation study's calibration and runs: the simulator itself plays the testbed, so
tests of the study's grid, report and resume run without root or a network."""

from __future__ import annotations

from studies import validation
from syncsim import Cluster, Link, Workload, simulate
from syncsim.metrics import step_time_spread


def fake_study(monkeypatch, fail: set):
    """calibrate gives a fixed cluster; measure 'runs' the simulator itself (or fails for ``fail``)."""
    calls = []

    def calibrate(config, args):
        cluster = Cluster.homogeneous(config.world, Link("20MB/s", "100us"), servers=config.servers,
                                      jitter=0.1)
        workload = Workload(param_bytes="400kB", compute_time="2ms", batch_size=args.batch_size)
        return cluster, workload, {"compute_time": 2e-3, "jitter": 0.1}

    def measure(config, args, folder, steps, slow_forward=None):
        calls.append(config.key)
        if config.key in fail:
            raise RuntimeError("rank 1 (worker) failed at step 3: injected")
        cluster, workload, _ = calibrate(config, args)
        result = simulate(cluster, workload, config.scheme, steps=steps, seed=1)
        result.trace.to_csv(folder / "trace.csv", index=False)  # where a real run leaves its trace
        return (result.steady, step_time_spread(result.trace, validation.SPREAD_WINDOWS, steps, config.world), 0,
                result.trace)

    def loss_figures(folder, steps):  # a simulated run logs no losses: its comparison is a fixed stand-in
        assert (folder / "trace.csv").exists() and steps == validation.LOSS_STEPS
        return {"loss_steps": steps, "loss_rel_median": 1e-7, "loss_rel_max": 2e-6}

    monkeypatch.setattr(validation, "calibrate", calibrate)
    monkeypatch.setattr(validation, "measure", measure)
    monkeypatch.setattr(validation, "loss_figures", loss_figures)
    monkeypatch.setattr("real.testbed.unavailable", lambda: None)
    return calls
