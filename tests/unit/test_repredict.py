"""real.validation.repredict and the calibration cache's offline mode: a finished study predicted again
with nothing measured."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from real.calibration.cache import NotCached, cached, offline, store
from real.calibration.link_probe import measure_link
from real.validation.calibration import Calibration
from real.validation.config import Config
from real.validation.evaluation import compared
from real.validation.prediction import as_run_on_gloo, predict
from real.validation.repredict import main, repredict
from syncsim import Cluster, Link, Workload, simulate
from syncsim.metrics import steady_state

RESULT = {"compute_time": 2e-3}


def test_offline_reads_the_cache_and_measures_nothing(tmp_path):
    # Basis: offline() promises that no probe runs: a cached result comes back as it is, a missing one
    # raises NotCached naming its file without measure() being called; outside it, a miss is measured.
    path, calls = tmp_path / "probe.json", []

    def measure():
        calls.append(1)
        return RESULT

    with offline(), pytest.raises(NotCached, match="probe.json"):
        cached(path, measure)
    assert calls == [] and not path.exists()
    assert cached(path, measure) == RESULT and calls == [1]
    with offline():
        assert cached(path, measure) == RESULT
    assert calls == [1]


def test_offline_the_link_probe_neither_sweeps_again_nor_times_a_runs_own_sizes(tmp_path):
    # A cached sweep that lacks a precision asked for, and a run's own all-reduces (never cached), would
    # both start the testbed: offline, each raises NotCached instead.
    store(tmp_path / "link-50Mbit-s-h2.json", {"probe": {"allreduce_fp32": []}, "burst": 15_000})
    with offline():
        with pytest.raises(NotCached, match="link probe at 50Mbit/s"):
            measure_link("50Mbit/s", tmp_path, "sstb", 1, hosts=2, precisions=("fp16", "fp32"))
        with pytest.raises(NotCached, match="50Mbit-s-h2-now"):
            measure_link("50Mbit/s", tmp_path, "sstb", 1, hosts=2, now=[(4096, "fp32")], precisions=("fp32",))


def _row(config: Config, predicted, measured, steps: int) -> dict:
    return {"scheme": config.scheme, "world": config.world, "servers": config.servers, "bandwidth": config.bandwidth,
            "model": config.model, "slow": config.slow, "steps": steps, "run_steps": steps, "batch_size": 32,
            "predicted_seed_cv": 0.0, "error": ""} | compared(predicted, measured)


def test_a_finished_study_is_predicted_again_from_its_calibration_and_its_runs(monkeypatch, tmp_path):
    # Basis: only the prediction is redone. A re-predicted row's predicted figures are predict() on the
    # calibration as it is now; its measured ones, read again from the run's kept records, are the same as
    # recorded. A row whose calibration timed its run's own collectives (an all-reduce of two workers) is
    # re-predicted too, from the timings the study kept of them; one whose calibration is not cached is
    # counted, not measured, and keeps its recorded prediction.
    steps = 24
    # the server's link favours the older of two flows, so the asynchronous workers take turns and a reply
    # meets the other's push
    cluster = Cluster.homogeneous(gpus=2, link=Link("50Mbit/s", "100us"), servers=1,
                                  server_link=Link("50Mbit/s", "100us", newcomer_weight=0.5), name="testbed")
    workload = Workload(param_bytes=4e5, compute_time=2e-3, batch_size=32, name="mlp")
    async_ps = Config("ps:mode=async", 2, "50Mbit/s", "mlp")
    ring = Config("allreduce", 2, "50Mbit/s", "mlp")
    uncached = Config("ps", 2, "50Mbit/s", "lenet")
    rows = []
    for config in (async_ps, ring, uncached):
        # the "run": the same configuration simulated on a slower link, its records kept as a study keeps them
        run = simulate(cluster.replace(inter=Link("40Mbit/s", "100us")), workload, as_run_on_gloo(config.scheme),
                       steps=steps, seed=3)
        folder = tmp_path / "runs" / config.name
        folder.mkdir(parents=True)
        run.trace.to_csv(folder / "trace.csv", index=False)
        run.updates.to_csv(folder / "updates.csv", index=False)
        measured = steady_state(run.trace, run.updates, 32, steps=steps, workers=config.world)
        old = simulate(cluster, workload.replace(compute_time=5e-3), as_run_on_gloo(config.scheme), steps=steps)
        rows.append(_row(config, old.steady, measured, steps))
    frame = pd.DataFrame(rows)
    frame.to_csv(tmp_path / "validation.csv", index=False)

    def calibrate(config, settings):
        if config.model == "lenet":
            with offline():
                cached(tmp_path / "calibration" / "missing.json", lambda: RESULT)
        return Calibration(cluster, workload, {})

    monkeypatch.setattr("real.validation.calibration.calibrate", calibrate)
    got, counts = repredict(frame, tmp_path)
    assert counts == {"repredicted": 2, "kept": 0, "not cached": 1}
    want = predict(simulate(cluster, workload, as_run_on_gloo(async_ps.scheme), steps=steps, seed=0)).steady
    assert got.loc[0, "predicted_step_time"] == pytest.approx(want.step_time, rel=1e-12)
    assert got.loc[0, "predicted_step_time"] != pytest.approx(frame.loc[0, "predicted_step_time"], rel=1e-3)
    for column in ("measured_step_time", "measured_throughput", "measured_staleness_mean"):
        assert got.loc[0, column] == pytest.approx(frame.loc[0, column], rel=1e-12)
    ring_want = predict(simulate(cluster, workload, as_run_on_gloo(ring.scheme), steps=steps, seed=0)).steady
    assert got.loc[1, "predicted_step_time"] == pytest.approx(ring_want.step_time, rel=1e-12)
    assert got.loc[2, "predicted_step_time"] == frame.loc[2, "predicted_step_time"]  # not cached: as recorded
    assert got.loc[0, "rel_error"] == pytest.approx(want.step_time / frame.loc[0, "measured_step_time"] - 1)
    # The diagnostic: the asynchronous row predicted with compute drawn from its run's own phases, which
    # are made three times as long as the calibration's compute so that the two predictions differ.
    from real.validation.prediction import predict_drawn

    path = tmp_path / "runs" / async_ps.name / "trace.csv"
    trace = pd.read_csv(path)
    computes = trace["kind"] == "compute"
    trace.loc[computes, "end"] += 2 * (trace.loc[computes, "end"] - trace.loc[computes, "start"])
    trace.to_csv(path, index=False)
    got, counts = repredict(frame, tmp_path, compute="drawn")
    assert counts == {"repredicted": 2, "kept": 0, "not cached": 1}
    drawn = predict_drawn(cluster, workload, as_run_on_gloo(async_ps.scheme), trace, steps, 2).steady
    assert got.loc[0, "predicted_step_time"] == pytest.approx(drawn.step_time, rel=1e-12)
    assert drawn.step_time != pytest.approx(want.step_time, rel=1e-3)
    # The other diagnostic: every server link takes the window given (Link.window) instead of the study's; a
    # row without a server is predicted as before.
    import syncsim

    simulated = []

    def spy(cluster, *args, **kwargs):
        simulated.append(cluster.server_net.window if cluster.servers else None)
        return syncsim.simulate.__wrapped__(cluster, *args, **kwargs)

    spy.__wrapped__ = syncsim.simulate
    monkeypatch.setattr(syncsim, "simulate", spy)
    got, counts = repredict(frame, tmp_path, window=123e3)
    assert simulated and set(simulated) == {123e3}  # every simulation's (the fake's ring row has a server too)
    windowed = cluster.replace(server_link=dataclasses.replace(cluster.server_link, window=123e3))
    want = predict(spy.__wrapped__(windowed, workload, as_run_on_gloo(async_ps.scheme), steps=steps, seed=0)).steady
    assert got.loc[0, "predicted_step_time"] == pytest.approx(want.step_time, rel=1e-12)
    assert got.loc[1, "predicted_step_time"] == pytest.approx(ring_want.step_time, rel=1e-12)


def test_the_command_names_a_folder_without_a_study(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nothing")])
    assert "validation.csv does not exist" in capsys.readouterr().err


def test_untailed_replaces_only_what_is_over_four_times_the_median():
    # Closed form: the sample's median is 1.0; 4.0 is not over TAIL times it (kept), 4.5 and 9 are.
    from real.testbed.preemption import TAIL
    from real.validation.prediction import untailed

    sample = np.array([1.0, 0.5, 1.0, 4.0, 4.5, 1.0, 9.0])
    assert TAIL == 4.0
    assert untailed(sample).tolist() == [1.0, 0.5, 1.0, 4.0, 1.0, 1.0, 1.0]


def _one_server_run(steps: int, tail_every: int = 0):
    """A simulated one-worker parameter server (no collisions, so every phase alike) and its trace, with
    every ``tail_every``-th compute phase after the warm-up made ten times as long."""
    cluster = Cluster.homogeneous(gpus=1, link=Link("50Mbit/s", "100us"), servers=1,
                                  server_link=Link("50Mbit/s", "100us"), name="testbed")
    workload = Workload(param_bytes=4e5, compute_time=2e-3, batch_size=32, name="mlp")
    trace = simulate(cluster, workload, as_run_on_gloo("ps"), steps=steps).trace.copy()
    if tail_every:
        long = (trace["kind"] == "compute") & (trace["step"] >= 2) & (trace["step"] % tail_every == 0)
        trace.loc[long, "end"] += 9 * (trace.loc[long, "end"] - trace.loc[long, "start"])
    return cluster, workload, trace


def test_compute_drawn_from_a_run_of_equal_phases_is_that_run_replayed():
    # Basis: drawing independently from a sample whose values are all equal gives that value everywhere,
    # so predict_drawn must give what replay gives with the run's own (equal) phases in their order.
    from real.validation.prediction import predict_drawn, replay, replayed_compute

    steps = 40
    cluster, workload, trace = _one_server_run(steps)
    phases = replayed_compute(trace, steps, 1)[2:]
    assert np.ptp(phases) < 1e-12  # the premise: every phase after the warm-up alike
    drawn = predict_drawn(cluster, workload, as_run_on_gloo("ps"), trace, steps, 1)
    assert drawn.steady.step_time == pytest.approx(replay(cluster, workload, as_run_on_gloo("ps"), trace, steps, 1),
                                                   rel=1e-9)


def test_a_runs_tail_slows_the_drawn_prediction_and_untailed_removes_it():
    # Steps 5, 10, ..., 35 of the 38 after the warm-up have compute ten times as long (7 of 38): a one-
    # worker synchronous server adds its compute to every step, so drawn from that sample a step is on
    # average 7/38 * 9 * compute_time longer than drawn from the clean run's (32 seeds of 40 steps pin
    # the drawn share to within about 6 %); with the tail (over four times the median) replaced by the
    # median it is the clean one exactly.
    from real.validation.prediction import predict_drawn

    steps, scheme = 40, as_run_on_gloo("ps")
    cluster, workload, clean = _one_server_run(steps)
    _, _, tailed = _one_server_run(steps, tail_every=5)
    base = predict_drawn(cluster, workload, scheme, clean, steps, 1).steady.step_time
    slower = predict_drawn(cluster, workload, scheme, tailed, steps, 1).steady.step_time - base
    assert slower == pytest.approx(7 / 38 * 9 * workload.compute_time, rel=0.15)
    cut = predict_drawn(cluster, workload, scheme, tailed, steps, 1, mode="drawn-untailed")
    assert cut.steady.step_time == pytest.approx(base, rel=1e-9)
    with pytest.raises(ValueError, match="mode must be one of drawn, drawn-untailed; got 'sorted'"):
        predict_drawn(cluster, workload, scheme, clean, steps, 1, mode="sorted")


@pytest.mark.parametrize("window, message", [("-1", "--window must be a size of 0 bytes or more, got '-1'"),
                                             ("nan", "--window 'nan' is not understood"),
                                             ("lots", "--window 'lots' is not understood")])
def test_the_command_refuses_a_window_that_is_not_a_size(window, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--window", window])
    assert message in capsys.readouterr().err


def test_repredict_names_its_compute_choices(tmp_path):
    with pytest.raises(ValueError, match="compute must be probe, drawn or drawn-untailed; got 'own'"):
        repredict(pd.DataFrame(), tmp_path, compute="own")


def test_the_shared_host_diagnostic_gives_each_row_its_cores_and_its_collective_s_exit_spread(monkeypatch, tmp_path):
    # --host: a row's cluster becomes one host of this process's cores (two, here made so) whose ranks leave
    # each collective its recorded link_exit_spread apart (calibration.shared_host), with the contention its
    # compute probes measured (four ranks' 4 ms step over one rank's 2 ms: 2); four ranks of 4 ms together
    # on two cores, leaving 6 ms apart, compute alone (2 ms each): 2 ms sooner a step.
    from real.validation.calibration import shared_host

    monkeypatch.setattr("real.validation.calibration.os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute",
                        lambda model, batch, ranks, folder, **kw: {"compute_time": 2e-3 if ranks == 1 else 4e-3})

    steps = 24
    cluster = Cluster.homogeneous(gpus=4, link=Link("50Mbit/s", "100us"), name="testbed")
    workload = Workload(param_bytes=4e5, compute_time=4e-3, batch_size=32, name="mlp")
    ring = Config("allreduce", 4, "50Mbit/s", "mlp")
    run = simulate(cluster, workload, as_run_on_gloo(ring.scheme), steps=steps, seed=3)
    folder = tmp_path / "runs" / ring.name
    folder.mkdir(parents=True)
    run.trace.to_csv(folder / "trace.csv", index=False)
    run.updates.to_csv(folder / "updates.csv", index=False)
    measured = steady_state(run.trace, run.updates, 32, steps=steps, workers=4)
    frame = pd.DataFrame([_row(ring, run.steady, measured, steps) | {"link_exit_spread": 6e-3, "compute_time": 4e-3}])
    monkeypatch.setattr("real.validation.calibration.calibrate", lambda config, settings: Calibration(
        cluster, workload, {}))
    plain, _ = repredict(frame, tmp_path)
    shared, _ = repredict(frame, tmp_path, host=True)
    settings = SimpleNamespace(out=tmp_path, batch_size=32)
    host = shared_host(cluster, {"link_exit_spread": 6e-3, "compute_time": 4e-3}, ring, settings)
    assert host.host_cores == 2 and host.exit_spread == 6e-3 and host.host_contention == 2.0
    want = predict(simulate(host, workload, as_run_on_gloo(ring.scheme), steps=steps, seed=0)).steady.step_time
    assert shared.loc[0, "predicted_step_time"] == pytest.approx(want, rel=1e-12)
    assert shared.loc[0, "predicted_step_time"] == pytest.approx(plain.loc[0, "predicted_step_time"] - 2e-3, rel=1e-6)
