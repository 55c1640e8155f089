"""real.validation and studies.validation without a testbed: grid, link fits, bookkeeping (rows, failures, resume)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from real.calibration.link_fit import AT_TRIM, RATE_WINDOW, at_size_time, fit_links
from real.calibration.link_probe import measure_link
from real.calibration.messages import wire_bytes
from real.calibration.sharing_fit import fit_duplex, fit_sharing, simulate_collision
from real.calibration.sharing_probe import SHARING_OFFSETS
from real.calibration.timing import AT_MAX_REPEATS, AT_REPEATS, AT_SECONDS, at_repeats, interleaved
from real.models import build, param_layers
from real.validation.calibration import calibrate, shared_host
from real.validation.config import KEY, Config, model_bytes
from real.validation.frame import COLUMNS, derive
from real.validation.losses import loss_agreement, loss_figures, measured_losses, replayed_losses
from real.validation.measurement import SPREAD_WINDOWS, measure
from real.validation.prediction import (
    MAX_STEPS,
    MIN_STEPS,
    PREDICTION_SEEDS,
    as_run_on_gloo,
    predict,
    replay,
    replayed_compute,
    run_steps,
)
from real.validation.summary import summary_lines
from real.validation.traffic import message_bytes, sent_precisions, sync_action, timed_gather, timed_size
from studies import validation
from syncsim import Cluster, Link, Workload, simulate
from syncsim.metrics import step_time_spread
from syncsim.schemes import parse
from tests.unit.fake_validation import fake_study

# What a compute probe of the small model reports (real.calibration.compute_probe.measure_scheme_compute: its
# layers are the model's own, whose tensors' shapes the calibration gives the workload), for calibrations with
# faked probes.
FAKE_COMPUTE = {"compute_time": 2e-3, "jitter": 0.1, "backward_fraction": 0.6, "forward_time": 6e-4,
                "layers": list(param_layers(build("mlp", 0))), "idle_cost": [[2e-3, 1e-4], [8e-3, 4e-4], [30e-3, 5e-4]],
                "meets": 45}


def EVEN_SHARING(*args, **kwargs) -> dict:  # noqa: N802  (a constant's stand-in: measure_sharing faked)
    return {"weight": 1.0, "spread": 0.0, "duplex_stretch": math.nan, "duplex_stretches": []}


def FAKE_WINDOW(bandwidth, folder, size, prefix="sstb", repeats=5) -> dict:  # noqa: N802  (measure_window faked)
    return {"window": 1e3 * size ** 0.5}  # differs with the size, so a test can tell which size was asked


def test_default_grid_covers_every_scheme_kind_and_dedupes_silent_runs():
    configs = validation.grid()
    assert len(configs) >= 24 and len({c.key for c in configs}) == len(configs)
    schemes = {c.scheme for c in configs}
    assert {"ps:mode=async", "ps:staleness=2", "localsgd:period=4", "allreduce:precision=fp16"} <= schemes
    # the compressing and the sharded schemes' few rows: their own blocks (two workers, one rate), no straggler rows
    blocks = validation.COMPRESSED + validation.SHARDED
    extra = [c for c in configs if c.scheme in {str(parse(s)) for s in blocks}]
    assert {(c.scheme, c.world, c.bandwidth, c.model, c.slow) for c in extra} == {
        (str(parse(s)), 2, "200Mbit/s", model, 1.0) for s in blocks for model in validation.MODELS}
    main = [c for c in configs if c not in extra]
    assert {(c.scheme, c.world) for c in main} == {(s, w) for s in validation.SCHEMES for w in validation.WORLDS}
    stragglers = [c for c in configs if c.slow > 1]
    assert {c.scheme for c in stragglers} == set(validation.SCHEMES) and all(c.world >= 2 for c in stragglers)
    # a one-worker run without a server sends nothing: one run, not one per link rate...
    silent = [c for c in configs if c.world == 1 and c.servers == 0 and not c.baseline]
    assert silent and len(silent) == len({(c.scheme, c.model) for c in silent})
    assert all(c.servers == 1 for c in configs if c.scheme.startswith("ps"))
    # ...except the speedup baseline, repeated at every rate and spread over its model's rows: the first
    # repeat before them, one in the middle, the last after them
    for model in validation.MODELS:
        rows = [i for i, c in enumerate(configs) if c.model == model]
        repeats = [i for i in rows if configs[i].baseline]
        assert [configs[i].bandwidth for i in repeats] == list(validation.BANDWIDTHS)
        assert repeats[0] == rows[0] and repeats[-1] == rows[-1]
        assert abs(repeats[1] - (rows[0] + rows[-1]) / 2) <= 1


def test_the_baseline_runs_once_when_the_grid_has_one_rate():
    configs = validation.grid(bandwidths=("200Mbit/s",), models=("mlp",))
    assert [c.bandwidth for c in configs if c.baseline] == ["200Mbit/s"] and configs[0].baseline


def test_a_scheme_with_several_options_stays_one_scheme_in_the_list():
    text = "allreduce:amp=true,precision=fp16, ps:staleness=2,localsgd"
    assert validation._items("--schemes", text) == ("allreduce:amp=true,precision=fp16", "ps:staleness=2", "localsgd")
    assert validation._items("--models", "mlp,lenet") == ("mlp", "lenet")


def test_quick_grid_has_an_asynchronous_row():
    assert any(c.scheme == "ps:mode=async" for c in validation.quick_grid())


@pytest.mark.parametrize("argv,batch", [([], validation.BATCH), (["--quick"], validation.QUICK_BATCH),
                                        (["--quick", "--batch-size", "8"], 8), (["--batch-size", "64"], 64)])
def test_the_quick_preset_takes_its_own_batch_unless_one_is_given(tmp_path, argv, batch):
    assert validation.parse_args([*argv, "--out", str(tmp_path / "v")]).batch_size == batch


def test_config_names_the_bad_field():
    with pytest.raises(ValueError, match="Config.world"):
        Config("allreduce", 0, "1Gbit/s", "mlp")
    with pytest.raises(ValueError, match="Config.model"):
        Config("allreduce", 2, "1Gbit/s", "resnet")
    with pytest.raises(ValueError, match="Config.bandwidth"):
        Config("allreduce", 2, "fast", "mlp")
    with pytest.raises(ValueError, match="Config.slow"):
        Config("allreduce", 2, "1Gbit/s", "mlp", slow=0.5)


def test_link_fits_recover_latency_launch_rate_and_bucket_of_a_token_bucket_link():
    # A tbf link of rate B with a full bucket of b bytes: the first b bytes pass at once, the rest at B;
    # every message also pays alpha, a collective its launch L. Ring all-reduce over p ranks: 2(p-1)
    # messages, 2(p-1)/p n bytes through each link (real.calibrate's model, which syncsim.collectives prices).
    alpha, rate, burst, launch = 150e-6, 25e6, 25_000, 2e-3
    sizes = [2**k for k in range(12, 23)]
    for p in (2, 4):
        sent = 2 * (p - 1) / p
        probe = {"world": p, "pingpong": [(n, alpha + max(0.0, n - burst) / rate) for n in sizes],
                 "allreduce_fp32": [(n, launch + 2 * (p - 1) * alpha + max(0.0, sent * n - burst) / rate)
                                    for n in sizes],
                 "allreduce_fp16": [(n, launch / 2 + 2 * (p - 1) * alpha + max(0.0, sent * n - burst) / (rate / 2))
                                    for n in sizes]}
        fits = fit_links(probe, burst)
        for name, expected_rate, expected_launch in (("pingpong", rate, 0.0), ("allreduce_fp32", rate, launch),
                                                     ("allreduce_fp16", rate / 2, launch / 2)):
            assert fits[name]["bandwidth"] == pytest.approx(expected_rate, rel=1e-9)
            assert fits[name]["alpha"] == pytest.approx(alpha, rel=1e-9)
            assert fits[name]["launch"] == pytest.approx(expected_launch, rel=1e-9, abs=1e-12)
        assert fits["pingpong"]["burst_fitted"] == pytest.approx(burst, rel=1e-6)
        assert fits["allreduce_fp32"]["burst_fitted"] == pytest.approx(burst, rel=1e-6)


def test_a_collective_s_closed_form_passes_through_the_line_of_its_timings_at_the_run_s_size():
    # Basis: on the link L + 2(p-1)α + (2(p-1)/p n - burst)/B holds from a few buckets up, and a gloo
    # all-reduce over four hosts on this machine costs a fixed F below (t = max(F, ring)); the probe times
    # each size five times, and a stall can take most timings of one size (measured at 1 Gbit/s: three of
    # five 512 KiB all-reduces at 23-26 ms, the others 7-12 ms, 1 MiB at 13.5-16.7 ms). A Theil-Sen line
    # through every timing within RATE_WINDOW of the run's size stays on the link's line while more than
    # half of the pairs of timings are undisturbed (here 45 of 75), so the fit recovers B and L exactly
    # and the closed form passes through the link's time at the run's size; a median per size would not.
    p, alpha, rate, burst, launch, fixed, stall = 4, 300e-6, 110e6, 125_000, 2e-3, 5e-3, 15e-3
    sizes = [2**k for k in range(12, 23)]
    sent = 2 * (p - 1) / p

    def ring(n):
        return launch + 2 * (p - 1) * alpha + max(0.0, sent * n - burst) / rate

    def timings(n):
        t = max(fixed, ring(n))
        return [t + stall, t + stall, t, t + stall, t] if n == 2**19 else [t] * 5

    probe = {"world": p, "pingpong": [(n, alpha + max(0.0, n - burst) / rate) for n in sizes],
             "allreduce_fp32": [(n, float(np.median(timings(n))), timings(n)) for n in sizes]}

    def closed_form(fit, n):
        return fit["launch"] + 2 * (p - 1) * fit["alpha"] + max(0.0, sent * n - burst) / fit["bandwidth"]

    for message in (407_080, 1_724_320):
        fit = fit_links(probe, burst, message_bytes=message)["allreduce_fp32"]
        assert 2**19 in fit["rate_sizes"]  # the stalled size is in the window
        assert fit["launch_from"] == "run's size"
        assert fit["bandwidth"] == pytest.approx(rate, rel=1e-9)
        assert fit["launch"] == pytest.approx(launch, rel=1e-9)
        assert closed_form(fit, message) == pytest.approx(ring(message), rel=1e-9)
    # beyond the probe's sizes the launch comes from the small messages, as without a size
    beyond = fit_links(probe, burst, message_bytes=2**24)["allreduce_fp32"]
    assert beyond["launch_from"] == "small messages"
    assert beyond["launch"] == pytest.approx(fixed - 2 * (p - 1) * alpha, rel=1e-9)


def _clean_probe(p: int, alpha: float, rate: float, burst: float, launch: float) -> dict:
    """A probe of a tbf link on which every timing lies on the closed forms (see the test above)."""
    sizes = [2**k for k in range(12, 23)]
    sent = 2 * (p - 1) / p

    def allreduce(n):
        return launch + 2 * (p - 1) * alpha + max(0.0, sent * n - burst) / rate

    return {"world": p, "pingpong": [(n, alpha + max(0.0, n - burst) / rate) for n in sizes],
            "allreduce_fp32": [(n, allreduce(n), [allreduce(n)] * 5) for n in sizes],
            "allreduce_fp16": [(n, allreduce(n), [allreduce(n)] * 5) for n in sizes]}


def test_a_collective_timed_at_the_run_s_size_passes_through_the_trimmed_mean_of_its_timings():
    # Basis: a step time is a mean over steps, so the time a collective adds to it is its expectation,
    # tail included; on this machine small gloo all-reduces are bimodal (most near one time, a quarter to
    # a third some milliseconds longer), and the sweep's medians and Theil-Sen line stand for the main
    # mode only. The probe times the run's own size at_repeats times: the fit's closed form must pass
    # through the mean of those timings with int(AT_TRIM n) cut off each end (here 1 of 100: the 72 ms
    # stall and one of the shortest), whatever the sweep's line says.
    p, alpha, rate, burst, launch = 4, 300e-6, 110e6, 125_000, 2e-3
    probe = _clean_probe(p, alpha, rate, burst, launch)
    message = 407_080
    timings = [6e-3] * 65 + [10e-3] * 34 + [72e-3]
    assert int(AT_TRIM * len(timings)) == 1
    expected = (64 * 6e-3 + 34 * 10e-3) / 98  # sorted, one cut off each end: the tail of 10 ms ones kept
    assert at_size_time(timings) == pytest.approx(expected, rel=1e-12)
    assert at_size_time(timings) > float(np.median(timings))  # the tail counts; a median leaves it out
    probe["at_size"] = [[wire_bytes(message, "fp32"), "fp32", timings], [2**20, "fp32", [1.0] * 20]]
    sent = 2 * (p - 1) / p
    fits = fit_links(probe, burst, message_bytes=message)
    fit = fits["allreduce_fp32"]
    assert fit["launch_from"] == "run's size, timed"
    assert fit["bandwidth"] == pytest.approx(rate, rel=1e-9)  # the rate is still the sweep's
    closed_form = fit["launch"] + 2 * (p - 1) * fit["alpha"] + max(0.0, sent * message - burst) / fit["bandwidth"]
    assert closed_form == pytest.approx(expected, rel=1e-9)
    # another precision's curve and another size are not this one's timings
    assert fits["allreduce_fp16"]["launch_from"] == "run's size"
    assert fits["allreduce_fp16"]["launch"] == pytest.approx(launch, rel=1e-9)
    assert fit_links(probe, burst, message_bytes=message * 2)["allreduce_fp32"]["launch"] == pytest.approx(launch)
    with pytest.raises(ValueError, match="at least one timing"):
        at_size_time([])
    # A line whose rate is too slow for the time at the run's size (at 1 Gbit/s a four-host probe's line
    # through two sizes, one of them stalled, said 19.6 MB/s where the run's 204 kB took 8.2 ms): the
    # form still passes through that time, with no launch and the rate the time implies.
    quick = [2e-3] * AT_REPEATS
    probe["at_size"] = [[wire_bytes(message, "fp32"), "fp32", quick]]
    slow_line = dict(probe, allreduce_fp32=[(n, t * 10, [x * 10 for x in xs]) for n, t, xs in probe["allreduce_fp32"]])
    fit = fit_links(slow_line, burst, message_bytes=message)["allreduce_fp32"]
    assert fit["launch"] == 0.0
    closed_form = 2 * (p - 1) * fit["alpha"] + max(0.0, sent * message - burst) / fit["bandwidth"]
    assert closed_form == pytest.approx(2e-3, rel=1e-9)


def test_a_run_s_own_collective_is_timed_as_often_as_its_seconds_allow_within_the_bounds():
    # enough timings of a fast collective for its tail to weigh in the mean; a slow one keeps the minimum
    assert at_repeats(2e-3) == min(AT_MAX_REPEATS, math.ceil(AT_SECONDS / 2e-3)) == 200
    assert at_repeats(AT_SECONDS / 37.5) == 38
    assert at_repeats(0.07) == AT_REPEATS == at_repeats(5.0)
    assert at_repeats(0.0) == AT_REPEATS  # a clock that did not move: the minimum, not a division by zero


def test_an_all_reducing_run_has_its_own_all_reduce_timed_at_its_wire_size_and_no_other_run_any():
    fp32, fp16 = (wire_bytes(model_bytes("mlp") * r, precision) for r, precision in ((1, "fp32"),
                                                                                                 (0.5, "fp16")))
    assert fp32 == 4 * sum(p.numel() for p in build("mlp", 0).parameters())  # every parameter, 4 bytes each
    assert timed_size(Config("allreduce", 4, "1Gbit/s", "mlp")) == ((fp32, "fp32"),)
    fp16_config = Config("allreduce:precision=fp16", 2, "1Gbit/s", "mlp")
    assert timed_size(fp16_config) == ((fp16, "fp16"),)
    assert timed_size(Config("localsgd:period=4", 2, "1Gbit/s", "mlp")) == ((fp32, "fp32"),)
    # parameter servers' traffic is point to point and one worker sends nothing: none of theirs
    assert timed_size(Config("ps", 2, "1Gbit/s", "mlp")) == ()
    assert timed_size(Config("allreduce", 1, "1Gbit/s", "mlp")) == ()


class ProbeBed:
    """A stand-in testbed for the link probe's launches: a 1 Gbit/s link with a 125 kB bucket, no namespaces."""

    def __init__(self, hosts, bandwidth, prefix):
        self.config = type("C", (), {"burst": 125_000, "bandwidth": 125e6})()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _link_launcher(timings, argvs: list):
    """A stand-in for torchrun_on running the link probe's ranks: each launch's argv goes to ``argvs``; a sweep
    (no --no-sweep) finds a clean two-host link; each --at size is timed at the launch's next of ``timings``
    (AT_REPEATS times), its ranks' exits a quarter of that apart."""
    def torchrun_on(bed, module, argv, log_dir, timeout, agent):
        argvs.append(argv)
        at = argv[argv.index("--at") + 1]
        probe = _clean_probe(2, 1e-4, 110e6, 125_000, 1e-3) if "--no-sweep" not in argv else {"world": 2}
        time = next(timings)
        sizes = [(int(size), precision) for size, precision in (e.split(":") for e in filter(None, at.split(",")))]
        probe["at_size"] = [[size, precision, [time] * AT_REPEATS] for size, precision in sizes]
        probe["at_exits"] = [[size, precision, [[0.0, time / 4]] * AT_REPEATS] for size, precision in sizes]
        Path(argv[argv.index("--probe") + 1]).write_text(json.dumps(probe))
        return [0, 0]

    return torchrun_on


def test_sizes_timed_now_are_timed_at_every_call_never_cached_and_fitted_from_their_own_timings(monkeypatch,
                                                                                                   tmp_path):
    # A collective the cores pace drifts with the machine's load between the study's link probe and a run
    # half an hour later: measure_link's ``now`` sizes are timed at every call (--no-sweep, the sweep
    # still cached), their timings are what the fit passes through, and the cache keeps only its own.
    argvs: list = []
    # the sweep's launch draws the first timing
    monkeypatch.setattr("real.testbed.launcher.torchrun_on", _link_launcher(iter([3e-3, 5e-3, 4e-3]), argvs))
    monkeypatch.setattr("real.testbed.namespaces.Testbed", ProbeBed)
    own = ((407_080, "fp32"),)
    for expected in (5e-3, 4e-3):
        measured = measure_link("1Gbit/s", tmp_path, message_bytes=407_080, now=own)
        assert measured["now"] == [[407_080, "fp32", [expected] * AT_REPEATS]]
        fit = measured["fits"]["allreduce_fp32"]
        assert fit["launch_from"] == "run's size, timed"
        # the closed form (two hosts: 2 hops, half the message each way twice) passes through the fresh time
        closed = fit["launch"] + 2 * fit["alpha"] + max(0.0, 407_080 - 125_000) / fit["bandwidth"]
        assert closed == pytest.approx(expected, rel=1e-9)
    # the sweep once (timing no size of a run), then the run's size alone at each call
    launches = [(argv[argv.index("--at") + 1], "--no-sweep" not in argv) for argv in argvs]
    assert launches == [("", True), ("407080:fp32", False), ("407080:fp32", False)]
    cached = json.loads((tmp_path / "link-1Gbit-s-h2.json").read_text())
    assert cached["result"]["probe"]["at_size"] == []  # the cache keeps no run's timing
    without = measure_link("1Gbit/s", tmp_path, message_bytes=407_080)
    assert without["now"] == [] and without["fits"]["allreduce_fp32"]["launch_from"] != "run's size, timed"
    assert len(launches) == 3  # without ``now`` nothing is timed again
    with pytest.raises(ValueError, match="now entry"):
        measure_link("1Gbit/s", tmp_path, now=((3, "fp16"),))


def test_a_rate_that_depends_on_size_is_fitted_at_the_run_s_message_size():
    # Basis: t = alpha + (n - burst)/B holds piecewise, B = 6 MB/s up to 1 MiB and 4.8 MB/s beyond
    # (as a two-host all-reduce measured at 50 Mbit/s: 5.1 MB/s at 407 kB, 4.4 MB/s at 4 MiB); a fit
    # within RATE_WINDOW of n recovers the B of n's piece, for the ping-pong and, over the run's own
    # number of hosts, the all-reduce.
    alpha, burst = 300e-6, 15_000
    sizes = [2**k for k in range(12, 23)]

    def rate(n):
        return 6e6 if n <= 2**20 else 4.8e6

    curve = [(n, alpha + max(0.0, n - burst) / rate(n)) for n in sizes]
    probe = {"world": 2, "pingpong": curve, "allreduce_fp32": [(n, 2 * alpha + t - alpha) for n, t in curve]}
    unsized = fit_links(probe, burst)
    for name in ("pingpong", "allreduce_fp32"):
        assert 4.8e6 < unsized[name]["bandwidth"] < 6e6  # over every size: a rate of none of them
    for message, expected in ((0.3e6, 6e6), (4.2e6, 4.8e6)):
        fits = fit_links(probe, burst, message_bytes=message)
        for name in ("pingpong", "allreduce_fp32"):
            assert fits[name]["bandwidth"] == pytest.approx(expected, rel=1e-9)
            assert len(fits[name]["rate_sizes"]) >= 2
            assert all(message / RATE_WINDOW <= n <= message * RATE_WINDOW for n in fits[name]["rate_sizes"])


def _collisions(weights: list[float], pattern: str, size: float, rate: float, alpha: float, burst: float) -> list:
    """Trials as the sharing probe records them, from a link whose i-th collision gives the newer flow
    ``weights[i]``, its start offsets cycling through SHARING_OFFSETS; "into" trials with each sender's
    own bucket, as the simulator runs pushes into a server (and fit_sharing replays them)."""
    lone = size / rate
    trials = []
    for i, weight in enumerate(weights):
        fraction = SHARING_OFFSETS[i % len(SHARING_OFFSETS)]
        starts = [10.0, 10.0 + fraction * lone + 1e-6]  # the second flow starts (just) later
        trials.append({"pattern": pattern, "fraction": fraction, "starts": starts,
                       "ends": simulate_collision(starts, size, rate, alpha, burst, weight,
                                                  sender_burst=burst if pattern == "into" else 0.0)})
    return trials


def test_sharing_fit_recovers_each_collisions_weight_their_mean_and_spread():
    # Basis: the fit inverts simulate_collision trial by trial; collisions generated with known weights
    # (lognormal: the newer flow favoured 2x on average into a host, 0.7x out of it, log-sd 0.3) must
    # give those weights back, their geometric means and the log-sd of the sample, with a residual near
    # 0 where equal sharing leaves a clear one.
    size, rate, alpha, burst = 400_000, 23e6, 300e-6, 25_000
    rng = np.random.default_rng(7)
    into, out = 2.0 * np.exp(0.3 * rng.standard_normal(9)), 0.7 * np.exp(0.3 * rng.standard_normal(9))
    trials = _collisions(list(into), "into", size, rate, alpha, burst) + _collisions(list(out), "out", size, rate,
                                                                                      alpha, burst)
    fit = fit_sharing(trials, rate, alpha, burst, size)
    np.testing.assert_allclose(fit["trial_weights"], np.concatenate([into, out]), rtol=0.01)
    logs = np.log(np.concatenate([into, out]))
    assert fit["weight"] == pytest.approx(np.exp(logs.mean()), rel=0.01)
    assert fit["spread"] == pytest.approx(logs.std(ddof=1), abs=0.01)
    assert fit["weights"]["into"] == pytest.approx(np.exp(np.log(into).mean()), rel=0.01)
    assert fit["weights"]["out"] == pytest.approx(np.exp(np.log(out).mean()), rel=0.01)
    assert fit["residual"] < 1e-3 < 0.02 < fit["residual_fair"]
    alike = fit_sharing(_collisions([3.0] * 3, "into", size, rate, alpha, burst), rate, alpha, burst, size)
    assert alike["weight"] == pytest.approx(3.0, rel=0.01) and alike["spread"] < 0.01
    with pytest.raises(ValueError, match="at least 2 trials"):
        fit_sharing(trials[:1], rate, alpha, burst, size)


def test_the_duplex_stretch_is_each_crossings_duration_over_a_lone_transfers_price():
    # Basis: syncsim prices a lone transfer of n bytes on a link with bucket b at alpha + (n - b)/B; a
    # turn whose push took exactly that has stretch 1, one that took 1.5x has 1.5, one per trial (the
    # sample the simulator draws from), their mean beside it. No trials: NaN and an empty sample.
    size, rate, alpha, burst = 400_000, 23e6, 300e-6, 25_000
    lone = alpha + (size - burst) / rate
    stretches, replies = [1.0, 1.5, 1.1, 1.0], [1.02, 1.0, 1.04, 1.0]
    trials = [{"pattern": "turns", "fraction": 0.0, "starts": [5.0 + i, 5.0 + i],
               "ends": [5.0 + i + s * lone, 5.0 + i + r * lone]} for i, (s, r) in enumerate(zip(stretches, replies))]
    fit = fit_duplex(trials, rate, alpha, burst, size)
    np.testing.assert_allclose(fit["duplex_stretches"], stretches, rtol=1e-9)
    assert fit["duplex_stretch"] == pytest.approx(np.mean(stretches), rel=1e-9)
    assert fit["duplex_stretch_reply"] == pytest.approx(np.mean(replies), rel=1e-9)
    none = fit_duplex([], rate, alpha, burst, size)
    assert math.isnan(none["duplex_stretch"]) and math.isnan(none["duplex_stretch_reply"])
    assert none["duplex_stretches"] == []


def test_a_collision_conserves_the_links_work_whatever_the_weight():
    # Basis: processor sharing of any weights is work-conserving, so two flows started together on an
    # idle link of bucket b both end by alpha + (2n - b)/B; the weight only moves the first end.
    size, rate, alpha, burst = 400_000, 23e6, 300e-6, 25_000
    for weight in (0.25, 1.0, 3.0):
        ends = simulate_collision([0.0, 0.0], size, rate, alpha, burst, weight)
        assert max(ends) == pytest.approx(alpha + (2 * size - burst) / rate, rel=1e-9)
    newer_first = simulate_collision([0.0, 0.0], size, rate, alpha, burst, 3.0)
    assert newer_first[1] < newer_first[0]


def test_rows_failures_summary_figure_and_resume(tmp_path, monkeypatch, capsys):
    configs = validation.quick_grid()
    broken = configs[2].key
    calls = fake_study(monkeypatch, fail={broken})
    argv = ["--quick", "--out", str(tmp_path), "--steps", "10", "--steadiness", "2"]
    assert validation.main(argv) == 0
    data = pd.read_csv(tmp_path / "validation.csv", keep_default_na=False, na_values=[""])
    assert set(COLUMNS) <= set(data.columns) and len(data) == len(configs)
    failed = data[data["error"].notna()]
    assert len(failed) == 1 and "injected" in failed["error"].iloc[0]
    assert failed["measured_step_time"].isna().all()
    ok = data[data["error"].isna()]
    # the simulator against a differently seeded simulator: close, not identical, and every figure present
    assert ok["rel_error"].abs().max() < 0.2 and ok["measured_speedup"].notna().all()
    # the jittered simulator standing in for the testbed wanders a little within a run, and says so
    assert ((ok["measured_spread"] > 0) & (ok["measured_spread"] < 0.2)).all()
    async_row = ok[ok["scheme"] == "ps:mode=async"].iloc[0]
    assert async_row["measured_staleness_mean"] > 0 and 0 <= async_row["staleness_distance"] <= 1
    assert (tmp_path / "parity.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "wandered within its own run by a median" in out
    # each run that communicates is replayed with its own compute; the one-worker row has no replay
    communicates = (ok["world"] > 1) | (ok["servers"] > 0)
    replayed = ok["replayed_step_time"]
    assert replayed[communicates].gt(0).all() and replayed[~communicates].isna().all()
    assert "replayed (each run's own compute phases in the simulator" in out
    # the jittered model varies from seed to seed: every row says by how much, the summary too
    assert (ok["predicted_seed_cv"] > 0).all() and "varied from seed to seed by a median" in out
    assert "median |error|" in out and f"over {len(configs) - 1} configurations" in out
    assert "1 configurations failed" in out
    # the machine's own steadiness, timed first on the smaller model (real.testbed.steadiness), and quoted
    kept = json.loads((tmp_path / "steadiness.json").read_text())
    assert kept["model"] == "mlp" and len(kept["step_times"]) == 2
    assert "machine steadiness: mlp's step at batch 256" in out
    # a rerun measures only the failed row again
    calls.clear()
    assert validation.main(argv) == 0
    assert calls == [broken]
    assert len(pd.read_csv(tmp_path / "validation.csv")) == len(configs)


def test_derive_takes_speedups_over_each_models_one_worker_run():
    rows = pd.DataFrame([
        {"scheme": "allreduce", "world": 1, "slow": 1.0, "model": "mlp", "error": np.nan,
         "predicted_step_time": 1.0, "measured_step_time": 1.0, "predicted_throughput": 100.0,
         "measured_throughput": 80.0, "predicted_staleness_mean": 0.0, "measured_staleness_mean": 0.0},
        {"scheme": "ps", "world": 2, "slow": 1.0, "model": "mlp", "error": np.nan,
         "predicted_step_time": 1.1, "measured_step_time": 1.0, "predicted_throughput": 150.0,
         "measured_throughput": 160.0, "predicted_staleness_mean": 1.5, "measured_staleness_mean": 1.0},
    ])
    out = derive(rows)
    assert out["measured_speedup"].tolist() == [1.0, 2.0] and out["predicted_speedup"].tolist() == [1.0, 1.5]
    assert np.isnan(out["speedup_error"].iloc[0])  # the baseline: 1 on both sides by definition
    assert out["speedup_error"].iloc[1] == pytest.approx(-0.25)
    assert out["rel_error"].iloc[1] == pytest.approx(0.1)
    assert np.isnan(out["staleness_mean_error"].iloc[0]) and out["staleness_mean_error"].iloc[1] == 0.5


def test_derive_leaves_the_figures_empty_when_every_row_failed_before_measuring():
    # a study whose first rows all failed in calibration: its rows hold the key and the error only
    rows = pd.DataFrame([{"scheme": "ps", "world": 2, "slow": 1.0, "model": "mlp", "error": "probe failed"},
                         {"scheme": "allreduce", "world": 1, "slow": 1.0, "model": "mlp", "error": "probe failed"}])
    out = derive(rows)
    for column in ("rel_error", "predicted_speedup", "measured_speedup", "speedup_error", "staleness_mean_error"):
        assert out[column].isna().all(), column
    assert out["error"].tolist() == ["probe failed"] * 2
    lines = summary_lines(out)  # and the summary says so in words, never as "nan%"
    assert lines[0] == "step time: no configuration was both predicted and measured"
    assert not any("nan" in line for line in lines), lines


def _fake_links(monkeypatch) -> None:
    """measure_link faked: every link 5 MB/s with 0.1 ms latency, each run's own size timed at 5 ms."""
    fit = {"alpha": 1e-4, "launch": 0.0, "bandwidth": 5e6}
    monkeypatch.setattr("real.calibration.link_probe.measure_link", lambda *a, now, **k: {
        "burst": 15_000, "fits": {"pingpong": fit, "allreduce_fp32": fit, "allreduce_fp16": fit},
        "now": [[size, precision, [5e-3]] for size, precision in now]})


def test_speedups_divide_by_the_median_of_the_baselines_repeats_on_each_side():
    # three repeats of the one-worker all-reduce, one of them caught by a slow spell on the measured side
    # and another mispredicted: each side divides by its own median, 100 predicted and 80 measured
    def row(scheme, world, bandwidth, predicted, measured):
        return {"scheme": scheme, "world": world, "slow": 1.0, "model": "mlp", "bandwidth": bandwidth,
                "error": np.nan, "predicted_step_time": 1.0, "measured_step_time": 1.0,
                "predicted_throughput": predicted, "measured_throughput": measured,
                "predicted_staleness_mean": 0.0, "measured_staleness_mean": 0.0}

    rows = pd.DataFrame([row("allreduce", 1, "50Mbit/s", 140.0, 40.0), row("allreduce", 1, "200Mbit/s", 100.0, 80.0),
                         row("allreduce", 1, "1Gbit/s", 98.0, 81.0), row("ps", 2, "1Gbit/s", 150.0, 160.0),
                         row("allreduce", 2, "1Gbit/s", 180.0, 160.0)])
    out = derive(rows)
    assert out["predicted_speedup"].iloc[3] == pytest.approx(1.5) and out["measured_speedup"].iloc[3] == 2.0
    assert out["speedup_error"].iloc[3] == pytest.approx(-0.25)
    assert out["speedup_error"].iloc[4] == pytest.approx(-0.1)  # two workers all-reducing: no baseline
    assert out["speedup_error"].iloc[:3].isna().all()  # the repeats measure the denominator: no error of theirs
    # a failed repeat is left out of the median: the other two's is their mean
    rows["error"] = rows["error"].astype(object)
    rows.loc[1, "error"] = "run timed out"
    assert derive(rows)["measured_speedup"].iloc[3] == pytest.approx(160.0 / 60.5)


def test_each_repeat_of_the_baseline_gets_a_compute_probe_of_its_own(monkeypatch, tmp_path):
    from real.calibration import compute_probe as calibration

    probe = calibration.measure_scheme_compute  # the real one, before the study's calls are faked
    labels = []

    def measure_compute(model, batch_size, processes, folder, scheme, slow, repeat):
        labels.append(repeat)
        return FAKE_COMPUTE

    _fake_links(monkeypatch)
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", measure_compute)
    args = validation.parse_args(["--out", str(tmp_path / "v")])
    for config in (Config("allreduce", 1, "50Mbit/s", "mlp"),
                   Config("allreduce", 1, "1Gbit/s", "mlp"),
                   Config("localsgd:period=4", 1, "50Mbit/s", "mlp")):
        calibrate(config, args.settings)
    assert labels == ["50Mbit-s", "1Gbit-s", ""]  # the baseline's repeats by their rate; other rows share

    # the probe caches each label under a name of its own: a repeat is measured, not read back
    started = []

    def fork_local(processes, module, argv, log_dir, timeout):
        started.append(Path(argv[1]).name)
        Path(argv[1]).write_text(json.dumps(FAKE_COMPUTE))
        return [0] * processes

    monkeypatch.setattr("real.testbed.launcher.fork_local", fork_local)
    for label in ("50Mbit-s", "1Gbit-s", "50Mbit-s", ""):
        probe("mlp", 32, 1, tmp_path, repeat=label)
    assert len(started) == 3 and len(set(started)) == 3  # the second 50Mbit-s probe was the cached one
    with pytest.raises(ValueError, match="repeat must be letters, digits and dashes"):
        probe("mlp", 32, 1, tmp_path, repeat="../x")


def test_long_runs_run_fewer_steps_and_short_ones_more_in_whole_local_sgd_periods():
    assert run_steps(40, 10.0) == 40
    assert run_steps(40, 45.0) == 24  # 40 x 30/45 = 26.7, down to a multiple of 4
    assert run_steps(40, 600.0) == MIN_STEPS
    assert run_steps(12, 600.0) == 12  # never fewer than asked when that is few already
    assert run_steps(40, 0.5) == 160  # 40 x 2/0.5
    assert run_steps(40, 0.03) == 2668  # 40 x 2/0.03 = 2666.7, up to a multiple of 4
    assert run_steps(40, 1e-6) == MAX_STEPS


def test_every_all_reduce_is_predicted_as_the_ring_gloo_runs():
    # gloo/allreduce.cc runs an unspecified algorithm as RING; the study must not price NCCL's tuner (auto)
    for text in ("allreduce", "allreduce:algorithm=tree,precision=fp16", "localsgd:period=4"):
        spec = as_run_on_gloo(text)
        assert spec.algorithm == "ring"
        assert dataclasses.replace(spec, algorithm=parse(text).algorithm) == parse(text)  # nothing else changed
    assert as_run_on_gloo("ps:mode=async") == parse("ps:mode=async")


def test_a_prediction_pools_one_simulation_per_seed():
    # Two asynchronous workers under a server whose NIC splits colliding flows at random: each seed is one
    # draw of those splits. The prediction is every seed's run pooled (each worker's mean step time over
    # the seeds), and its seed_cv the variation of the seeds' own step times.
    cluster = Cluster.homogeneous(gpus=2, link=Link("50Mbit/s", "100us"), servers=1, jitter=0.2,
                                  server_link=Link("50Mbit/s", "100us", sharing_spread=0.9))
    workload = Workload(param_bytes=4e5, compute_time=2e-3, batch_size=32, name="w")
    runs = [simulate(cluster, workload, "ps:mode=async", steps=40, seed=seed)
            for seed in range(PREDICTION_SEEDS)]
    predicted, seed_cv = predict(runs[0])
    per_worker = np.mean([run.steady.worker_step_times for run in runs], axis=0)
    assert predicted.step_time == pytest.approx(len(per_worker) / np.sum(1 / per_worker))
    assert len(predicted.staleness) == sum(len(run.steady.staleness) for run in runs)
    times = np.array([run.steady.step_time for run in runs])
    assert seed_cv == pytest.approx(times.std() / times.mean()) and seed_cv > 0  # the draws do differ


def test_all_reducing_runs_probe_their_links_over_their_own_workers_and_carry_the_launch(monkeypatch, tmp_path):
    # A ring's chunks and its ranks' contention for the cores depend on p: the probe has the run's hosts
    # (point-to-point traffic, two), and the fitted launch cost reaches the cluster as collective_latency.
    # A top-k run's all-gathers are timed at its k and priced by their own fit (the ping-pong's alpha and
    # rate, their own launch); PowerSGD's two rounds are both timed, and the row records their sum.
    probed = []
    fit = {"alpha": 1e-4, "launch": 3e-3, "bandwidth": 5e6}
    gather_fit = {"alpha": 1e-4, "launch": 4e-3, "bandwidth": 6e6}

    swept, afters = [], []

    def measure_link(bandwidth, folder, prefix, repeats, message_bytes, hosts, now, precisions, gathers, after,
                     keep):
        assert keep == config.name  # the row's own timings are kept under its name, for a re-prediction
        probed.append((hosts, now, gathers))
        swept.append(precisions)
        afters.append(after)
        return {"burst": 15_000, "fits": {"pingpong": fit | {"launch": 0.0, "bandwidth": 6e6}, "allreduce_fp32": fit,
                                          "allreduce_fp16": fit} | ({"allgather_fp32": gather_fit} if gathers else {}),
                "now": [[size, precision, [7e-3] * AT_REPEATS] for size, precision in now],
                "gather_now": [[values, precision, [9e-3] * AT_REPEATS] for values, precision in gathers],
                "exits_now": [[*item, [[0.0, 1e-3], [0.0, 3e-3]]] for item in (*now, *gathers)]}

    monkeypatch.setattr("real.calibration.link_probe.measure_link", measure_link)
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", lambda *a, **k: FAKE_COMPUTE)
    monkeypatch.setattr("real.calibration.sharing_probe.measure_sharing", EVEN_SHARING)
    monkeypatch.setattr("real.testbed.window.measure_window", FAKE_WINDOW)
    monkeypatch.setattr("real.calibration.server_probe.measure_server",
                        lambda *a, **k: {"push_wait": [1.0], "pull": [1.0]})
    args = validation.parse_args(["--out", str(tmp_path / "v")])
    for scheme, world, hosts, launch, at_size in (
            ("allreduce", 4, 4, 3e-3, 7e-3), ("localsgd:period=4", 2, 2, 3e-3, 7e-3), ("allreduce", 1, 2, 3e-3, None),
            ("ps:mode=async", 4, 2, 0.0, None), ("diloco:period=4", 2, 2, 3e-3, 7e-3),
            ("allreduce:compression=powersgd,rank=4", 2, 2, 3e-3, 14e-3), ("topk:ratio=0.01", 4, 4, 4e-3, 9e-3)):
        config = Config(scheme, world, "50Mbit/s", "mlp")
        cluster, _, values = calibrate(config, args.settings)
        # an all-reducing run's own all-reduces, or a top-k run's exchange, are timed next to it, and the row
        # records their time
        assert probed[-1] == (hosts, timed_size(config), timed_gather(config))
        assert cluster.collective_latency == values["link_launch"] == launch
        if at_size is None:
            assert math.isnan(values["link_at_size"]) and math.isnan(values["link_exit_spread"])
        else:
            assert values["link_at_size"] == pytest.approx(at_size)
            # the first rank's lead over the last, averaged over the timings (1 and 3 ms) and the step's
            # collectives, is the row's exit spread, which the shared-host diagnostic gives its cluster
            assert values["link_exit_spread"] == pytest.approx(2e-3)
            host = shared_host(cluster, values)
            assert host.exit_spread == pytest.approx(2e-3) and host.host_cores == len(os.sched_getaffinity(0))
            assert cluster.host_cores is None  # the study's own prediction has no shared host
    assert cluster.inter.bandwidth == values["link_bandwidth"] == 6e6  # top-k's: the all-gather fit's rate
    # the link probe sweeps the precisions the grid's schemes send (the default grid: fp32 and fp16)
    assert set(swept) == {("fp16", "fp32")}
    # the run's own collectives are timed with the ranks busy after them for what they compute before the
    # next: the compute probe's step, times the steps between collectives (local SGD's and DiLoCo's period)
    step = FAKE_COMPUTE["compute_time"]
    assert afters == [step, 4 * step, step, step, 4 * step, step, step]


def test_a_stall_of_the_machine_falls_on_one_timing_per_size_and_the_medians_discard_it():
    # The link probe times every size in turns (real.calibration.timing.interleaved): a stall lasting as
    # many timings as a pass has sizes meets each size at most once, and a median of five or more timings
    # discards one. Timed size by size, the same stall takes all of one size's timings, and its median.
    from real.calibration.link_probe import SWEEP
    from real.calibration.timing import SMALL, SMALL_REPEATS

    rounds = [5 * (SMALL_REPEATS if size <= SMALL else 1) for size in SWEEP]
    shortest_pass = min(sum(r > i for r in rounds) for i in range(max(rounds)))
    calls = sum(rounds) + len(rounds)  # the warm-ups come first
    for length in range(1, shortest_pass + 1):
        for first in range(calls - length + 1):
            clock = iter(range(calls))

            def stalled(k, clock=clock, first=first, length=length):
                return 100.0 if first <= next(clock) < first + length else 1.0

            times = interleaved(rounds, stalled)
            assert [len(t) for t in times] == rounds
            assert all(sorted(t)[len(t) // 2] == 1.0 for t in times), (length, first)


def test_a_straggler_row_probes_its_slowed_worker_and_gives_the_simulator_its_measured_step(monkeypatch, tmp_path):
    # The slowed worker's speed factor is the others' compute over the slowed rank's, both measured by one
    # probe whose last rank is slowed as the run's last worker is (not derived from the forward time).
    asked = []

    def measure_compute(model, batch_size, processes, folder, scheme, slow=1.0, repeat=""):
        asked.append((processes, slow))
        return FAKE_COMPUTE | ({"slowed_time": 7e-3, "slow_forward": 1.1e-3} if slow > 1 else {})

    _fake_links(monkeypatch)
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", measure_compute)
    monkeypatch.setattr("real.calibration.sharing_probe.measure_sharing", EVEN_SHARING)
    monkeypatch.setattr("real.testbed.window.measure_window", FAKE_WINDOW)
    args = validation.parse_args(["--out", str(tmp_path / "v")])
    cluster, workload, values = calibrate(Config("allreduce", 3, "50Mbit/s", "mlp", 3.0), args.settings)
    assert asked == [(3, 3.0), (1, 1.0)]  # and a lone rank, unslowed, for the link probe's after-work
    assert values["slow_forward"] == 1.1e-3  # the forward the probe's slowed rank sized its sleep from
    assert cluster.speed == pytest.approx((1.0, 1.0, 2e-3 / 7e-3)) and workload.compute_time == 2e-3
    assert workload.idle_cost == ((2e-3, 1e-4), (8e-3, 4e-4), (30e-3, 5e-4))  # the probe's, as measured
    cluster, _, values = calibrate(Config("allreduce", 3, "50Mbit/s", "mlp"), args.settings)
    assert asked[-2:] == [(3, 1.0), (1, 1.0)] and cluster.speed is None  # every worker at nominal speed
    assert math.isnan(values["slow_forward"])


@pytest.mark.parametrize("forward,expected", [(1.1e-3, ((2, 3.0, 1.1e-3),)), (None, ((2, 3.0),))])
def test_a_straggler_row_s_run_sleeps_from_the_forward_its_probe_timed(monkeypatch, tmp_path, forward, expected):
    # The simulator's speed factor is the probe's slowed step, which holds the probe's sleep: the run's
    # slowed worker must sleep as long, so it is given the forward that sleep was sized from
    # (--slow RANK:F:FORWARD) rather than timing its own (which differed by a tenth or more).
    import real.testbed

    ran = []

    class FakeBed:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def run(bed, cfg, timeout, agent):
        ran.append(cfg)
        return 1, "stopped here: the test reads the config only"

    monkeypatch.setattr(real.testbed, "Testbed", FakeBed)
    monkeypatch.setattr(real.testbed, "run", run)
    args = validation.parse_args(["--out", str(tmp_path / "v")])
    with pytest.raises(RuntimeError, match="stopped here"):
        measure(Config("allreduce", 3, "50Mbit/s", "mlp", 3.0), args.settings, tmp_path / "r", 8,
                           slow_forward=forward)
    assert ran[0].slow == expected  # the last worker, slowed threefold


def test_the_compute_probe_reports_its_last_rank_apart_when_it_is_slowed(monkeypatch, tmp_path):
    from real.calibration import compute_probe as calibration

    before = [[2e-3, 2e-3], [2e-3, 2e-3], [2e-3, 2e-3]]  # each step's paired back-to-back step before its gap
    ranks = [{"steps": [1e-3, 3e-3], "forward": [2e-4, 2e-4], "backward": [6e-4, 6e-4], "layers": [8],
              "meetings": 7, "before_idle": before, "after_idle": [[2e-3, 3e-3], [3e-3, 3e-3], [1e-3, 1e-3]]},
             {"steps": [2e-3, 2e-3], "forward": [4e-4, 4e-4], "backward": [1e-3, 1e-3], "layers": [8],
              "meetings": 7, "before_idle": before, "after_idle": [[2e-3, 3e-3], [4e-3, 4e-3], [1e-3, 1e-3]]},
             {"steps": [9e-3, 11e-3], "forward": [3e-4, 3e-4], "backward": [9e-3, 9e-3], "layers": [8],
              "meetings": 7, "before_idle": [[9e-3], [9e-3], [9e-3]], "after_idle": [[50e-3], [50e-3], [50e-3]],
              "slow_forward": 2.5e-4, "slow_wait": 1.5e-3}]
    given = []

    def time_steps(model, batch_size, scheme, folder, slow):
        given.append(slow)
        return ranks[0]

    class Dist:  # rank 0 of three, gathering the ranks above
        init_process_group = destroy_process_group = staticmethod(lambda *a, **k: None)
        get_rank = staticmethod(lambda: 0)
        get_world_size = staticmethod(lambda: 3)

        @staticmethod
        def all_gather_object(out, mine):
            out[:] = ranks

    monkeypatch.setattr(calibration, "time_worker_steps", time_steps)
    monkeypatch.setattr("torch.distributed", Dist)
    out = tmp_path / "c.json"
    calibration.compute_rank(str(out), "mlp", 32, "allreduce", slow=3.0)
    result = json.loads(out.read_text())
    assert given == [1.0]  # rank 0 is not the last: it runs unslowed
    assert result["processes"] == 3 and result["slow"] == 3.0 and result["meets"] == 7
    assert result["slowed_time"] == pytest.approx(10e-3)  # the last rank's mean step
    assert (result["slow_forward"], result["slow_wait"]) == (2.5e-4, 1.5e-3)  # its sleep, and what sized it
    assert result["compute_time"] == pytest.approx(2e-3) and result["forward_time"] == pytest.approx(3e-4)
    assert result["per_rank"] == pytest.approx([2e-3, 2e-3])
    # the idle cost is the unslowed ranks' mean step after each gap less the mean of the steps paired with
    # them before it (2 ms), none below zero; the slowed rank's steps are left out of it as out of compute_time
    gaps = [gap for gap, _ in result["idle_cost"]]
    assert gaps == list(calibration.IDLE_GAPS)
    assert [extra for _, extra in result["idle_cost"]] == pytest.approx([0.5e-3, 1.5e-3, 0.0])


def test_idle_cost_needs_timings_after_every_gap():
    from real.calibration.compute_fit import IDLE_GAPS, idle_cost

    before = [[1e-3]] * len(IDLE_GAPS)
    assert idle_cost(before, [[2e-3]] * len(IDLE_GAPS)) == [(gap, pytest.approx(1e-3)) for gap in IDLE_GAPS]
    assert idle_cost([], []) == []  # a scheme without servers: its workers never idle
    with pytest.raises(ValueError, match="timings after each of"):
        idle_cost(before[1:], [[2e-3]] * (len(IDLE_GAPS) - 1))
    with pytest.raises(ValueError, match="timings after each of"):
        idle_cost(before, [[2e-3]] * (len(IDLE_GAPS) - 1) + [[]])
    with pytest.raises(ValueError, match="each paired with one before it"):
        idle_cost([[1e-3, 1e-3]] * len(IDLE_GAPS), [[2e-3]] * len(IDLE_GAPS))


def test_a_machine_that_drifts_between_the_probe_s_phases_shows_no_idle_cost():
    # The back-to-back phase ran at 1 ms a step; seconds later the machine was slower, and every step around
    # the gaps took 2 ms, before a gap as after it. Idling cost nothing: each step after a gap is compared
    # with its paired step before the gap, not with the phase before (which would say 1 ms of idle cost).
    from real.calibration.compute_fit import IDLE_GAPS, summarise_compute

    rank = {"steps": [1e-3] * 4, "forward": [3e-4] * 4, "backward": [6e-4] * 4, "layers": [8], "meetings": 0,
            "before_idle": [[2e-3] * 3] * len(IDLE_GAPS), "after_idle": [[2e-3] * 3] * len(IDLE_GAPS)}
    result = summarise_compute([rank], "mlp", 32, "ps", 1.0)
    assert result["compute_time"] == pytest.approx(1e-3)
    assert [cost for _, cost in result["idle_cost"]] == [0.0] * len(IDLE_GAPS)
    # and what idling does cost is the paired difference, gap by gap (a mean over the ranks' pairs)
    other = rank | {"before_idle": [[2e-3, 4e-3, 3e-3]] * len(IDLE_GAPS),
                    "after_idle": [[2.5e-3, 4.5e-3, 3.5e-3], [3e-3, 5e-3, 4e-3], [4e-3, 6e-3, 5e-3]]}
    result = summarise_compute([rank, other], "mlp", 32, "ps", 1.0)
    # rank 0 adds 0 to each gap, the other 0.5, 1 and 2 ms: over six pairs, 0.25, 0.5 and 1 ms
    assert [cost for _, cost in result["idle_cost"]] == pytest.approx([0.25e-3, 0.5e-3, 1e-3])


def test_schemes_whose_workers_do_the_same_work_share_one_compute_probe(tmp_path, monkeypatch):
    # A synchronous, an asynchronous and an SSP parameter server differ in how the servers apply a push
    # and when a worker waits: their workers compute, push and pull the same tensors, which is what the
    # probe times (its FreeNetwork waits for nothing). Anything that changes a worker's own work (the wire
    # precision, autocast, DDP's buckets, how often local SGD averages) gets a probe of its own.
    from real.calibration import compute_probe as calibration
    from real.calibration.compute_fit import worker_work

    servers = {worker_work(s) for s in ("ps", "ps:mode=async", "ps:staleness=2", "ps:staleness=5")}
    assert len(servers) == 1
    others = ["allreduce", "allreduce:precision=fp16", "allreduce:amp=true", "allreduce:bucket_bytes=1000000",
              "localsgd:period=4", "localsgd:period=8", "ps:precision=fp16", "ps:amp=true"]
    assert len({worker_work(s) for s in others} | servers) == len(others) + 1
    started = []

    def fork_local(processes, module, argv, log_dir, timeout):
        started.append(argv[argv.index("--scheme") + 1])
        Path(argv[1]).write_text(json.dumps(FAKE_COMPUTE))
        return [0] * processes

    monkeypatch.setattr("real.testbed.launcher.fork_local", fork_local)
    for scheme in ("ps", "ps:mode=async", "ps:staleness=2", "localsgd:period=4"):
        calibration.measure_scheme_compute("mlp", 32, 2, tmp_path, scheme=scheme)
    assert started == ["ps", "localsgd:period=4"]  # the asynchronous and SSP servers' workers reuse the first


def test_a_resumed_study_fills_in_the_drift_of_rows_measured_before_it_was_recorded(tmp_path, monkeypatch):
    configs = validation.quick_grid()
    calls = fake_study(monkeypatch, fail=set())
    argv = ["--quick", "--out", str(tmp_path), "--steps", "20"]
    assert validation.main(argv) == 0
    csv = tmp_path / "validation.csv"
    # an older study's table: no measured_spread column; one run's trace kept, the others' gone
    pd.read_csv(csv).drop(columns="measured_spread").to_csv(csv, index=False)
    shutil.rmtree(tmp_path / "runs")
    kept = configs[1]
    cluster = Cluster.homogeneous(kept.world, Link("20MB/s", "100us"), servers=kept.servers, jitter=0.1)
    workload = Workload(param_bytes="400kB", compute_time="2ms", batch_size=validation.QUICK_BATCH)
    steps = int(pd.read_csv(csv).set_index(list(KEY)).loc[kept.key, "run_steps"])
    trace = simulate(cluster, workload, kept.scheme, steps=steps, seed=3).trace
    (tmp_path / "runs" / kept.name).mkdir(parents=True, exist_ok=True)
    trace.to_csv(tmp_path / "runs" / kept.name / "trace.csv", index=False)
    calls.clear()
    assert validation.main(argv) == 0
    assert calls == []  # nothing measured again
    data = pd.read_csv(csv, keep_default_na=False, na_values=[""]).set_index(list(KEY))
    assert data.loc[kept.key, "measured_spread"] == pytest.approx(
        step_time_spread(trace, SPREAD_WINDOWS, steps, kept.world))
    others = [c.key for c in configs if c.key != kept.key]
    assert data.loc[others, "measured_spread"].isna().all()


def test_the_summary_counts_the_rows_within_the_targets_bounds_and_gives_each_link_s_median():
    # |errors| 0.05, 0.12, 0.30 at 1 Gbit/s and 0.02, 0.10 at 50 Mbit/s (the bounds are inclusive); one
    # failed row counts nowhere; staleness errors 0.1 and 0.25 on the two rows that have one
    errors = [("1Gbit/s", -0.05, np.nan), ("1Gbit/s", 0.12, 0.1), ("1Gbit/s", -0.30, -0.25), ("50Mbit/s", 0.02, np.nan),
              ("50Mbit/s", 0.10, np.nan), ("50Mbit/s", np.nan, np.nan)]
    frame = pd.DataFrame([{"scheme": "ps", "world": 2, "bandwidth": rate, "model": "mlp", "slow": 1.0,
                           "rel_error": e, "speedup_error": e, "staleness_mean_error": s, "staleness_distance": 0.1,
                           "predicted_step_time": 1.0, "measured_step_time": 1.0,
                           "error": "" if not np.isnan(e) else "RuntimeError: injected"} for rate, e, s in errors])
    lines = summary_lines(frame)
    assert "step time: 3 configurations within 10%, 4 within 15%; median |error| by link " \
           "50Mbit/s 6.0%, 1Gbit/s 12.0%" in lines
    assert any("over 2 asynchronous or SSP configurations (1 within 20%)" in line for line in lines)
    assert lines[0] == "step time: median |error| 10.0%, max 30.0% over 5 configurations"
    assert not any("dropped" in line for line in lines)  # rows measured before drops were counted: no claim
    frame["dropped"] = [0, 0, 0, 0, 0, np.nan]
    assert "the testbed's shapers dropped no packet in any of 5 runs" in summary_lines(frame)
    frame.loc[[1, 2], "dropped"] = [12, 137]
    assert ("the testbed's shapers dropped packets in 2 of 5 runs (at most 137 in one): steps there include "
            "TCP's recoveries") in summary_lines(frame)


def test_the_summary_gives_how_far_apart_the_baseline_s_repeats_were_measured_and_probed():
    # three repeats of one model's baseline, one failed (its figures count nowhere), and one other row;
    # the other model has one repeat only: no spread to give
    def row(scheme, world, model, measured, probed, error=""):
        return {"scheme": scheme, "world": world, "bandwidth": "1Gbit/s", "model": model, "slow": 1.0,
                "rel_error": 0.0, "speedup_error": np.nan, "staleness_mean_error": np.nan, "staleness_distance": np.nan,
                "predicted_step_time": probed, "measured_step_time": measured, "compute_time": probed, "error": error}

    frame = pd.DataFrame([row("allreduce", 1, "mlp", 2.0e-3, 1.5e-3), row("allreduce", 1, "mlp", 2.5e-3, 2.1e-3),
                          row("allreduce", 1, "mlp", 9.0e-3, 9.0e-3, error="RuntimeError: injected"),
                          row("allreduce", 2, "mlp", 9.0e-3, 0.5e-3), row("allreduce", 1, "lenet", 20e-3, 20e-3)])
    lines = [line for line in summary_lines(frame) if line.startswith("repeatability")]
    assert lines == ["repeatability: mlp's one-worker baseline, run 2 times, measured 2.00-2.50 ms (25% apart), "
                     "its compute probes 1.50-2.10 ms (40% apart): one configuration measured again on this machine"]


def test_the_link_sweep_times_the_precisions_asked_for_and_sweeps_again_only_for_one_it_lacks(monkeypatch,
                                                                                              tmp_path):
    # A sweep's all-reduces at each wire precision are a quarter of its time each; a study sweeps only
    # the precisions its schemes send (fp32 always: the plain "allreduce" curve), and a cached sweep is
    # measured again only when a precision asked for is missing from it, keeping those it had.
    sweeps = []

    def torchrun_on(bed, module, argv, log_dir, timeout, agent):
        precisions = argv[argv.index("--precisions") + 1].split(",")
        sweeps.append(precisions)
        clean = _clean_probe(2, 1e-4, 110e6, 125_000, 1e-3)
        curve = clean["allreduce_fp32"]
        probe = {"world": 2, "pingpong": clean["pingpong"], "at_size": []}
        probe |= {f"allreduce_{precision}": curve for precision in precisions}
        Path(argv[argv.index("--probe") + 1]).write_text(json.dumps(probe))
        return [0, 0]

    monkeypatch.setattr("real.testbed.launcher.torchrun_on", torchrun_on)
    monkeypatch.setattr("real.testbed.namespaces.Testbed", ProbeBed)
    first = measure_link("1Gbit/s", tmp_path, message_bytes=407_080, precisions=("fp16",))
    assert sweeps == [["fp32", "fp16"]] and set(first["fits"]) == {"pingpong", "allreduce_fp32", "allreduce_fp16"}
    measure_link("1Gbit/s", tmp_path, message_bytes=407_080, precisions=("fp32",))
    assert len(sweeps) == 1  # the cache has it
    again = measure_link("1Gbit/s", tmp_path, message_bytes=407_080, precisions=("bf16",))
    assert sweeps[1] == ["fp32", "fp16", "bf16"] and "allreduce_bf16" in again["fits"]
    with pytest.raises(ValueError, match="precisions must be among"):
        measure_link("1Gbit/s", tmp_path, precisions=("fp8",))
    # the study asks for the precisions its grid's schemes send
    configs = [Config("allreduce:precision=fp16", 2, "1Gbit/s", "mlp"),
               Config("ps", 2, "1Gbit/s", "mlp")]
    assert sent_precisions(configs) == ("fp16", "fp32")


def test_a_run_s_compute_is_replayed_with_its_gaps_and_its_held_pushes():
    """replayed_compute: each compute phase, plus the gap since the worker's previous phase ended, plus
    how much longer than its worker's median push the step's push took (hand-made trace)."""
    rows = []
    for worker, pushes in ((0, (0.001, 0.001, 0.006)), (1, (0.002, 0.002, 0.002))):
        t = 0.0
        for step, push in enumerate(pushes):
            gap = 0.0005 * step  # a pause before computing (taking the pulled parameters in)
            compute = 0.003 + 0.001 * worker
            rows += [(worker, step, "compute", t + gap, t + gap + compute)]
            t += gap + compute
            rows += [(worker, step, "push", t, t + push), (worker, step, "pull", t + push, t + push + 0.01)]
            t += push + 0.01
    trace = pd.DataFrame(rows, columns=["worker", "step", "kind", "start", "end"]).sample(frac=1, random_state=1)
    table = replayed_compute(trace, 3, 2)
    expected = [[0.003, 0.004], [0.0035, 0.0045], [0.004 + 0.005, 0.005]]  # worker 0's last push held 5 ms
    np.testing.assert_allclose(table, expected, rtol=0, atol=1e-12)
    assert replayed_compute(trace[trace["step"] < 2], 3, 2) is None  # a missing step: no table


def test_a_sharded_step_s_compute_is_replayed_without_the_collectives_inside_it():
    """replayed_compute: a compute row that collectives run inside (ZeRO-3's and FSDP's gathers and
    reduce-scatters, issued from the forward's and backward's hooks) counts its seconds outside them, two
    overlapping collectives once (their union), a collective after the row not at all, nor an overlapped
    all-reduce that starts inside it (the backward computes on beside it) (hand-made trace)."""
    rows = []
    for worker in (0, 1):
        for step in range(2):
            t = 0.1 * step + 0.01 * worker
            rows += [(worker, step, "compute", t, t + 0.020),                 # the step: 20 ms wall
                     (worker, step, "allgather", t + 0.001, t + 0.004),      # 3 ms inside
                     (worker, step, "allgather", t + 0.003, t + 0.006),      # overlaps it: 2 ms more
                     (worker, step, "reducescatter", t + 0.015, t + 0.025),  # 5 ms of it inside
                     (worker, step, "allreduce", t + 0.018, t + 0.040)]      # from inside it to after it
    trace = pd.DataFrame(rows, columns=["worker", "step", "kind", "start", "end"]).sample(frac=1, random_state=2)
    # step 0: 20 − (5 + 5) = 10 ms; step 1 adds its gap: it starts 60 ms after the worker's last row ended
    np.testing.assert_allclose(replayed_compute(trace, 2, 2), [[0.010, 0.010], [0.070, 0.070]], rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec", ["allreduce", "allreduce:bucket_bytes=100000", "zero:stage=3", "fsdp"])
def test_the_model_measured_against_itself_replays_to_no_error(spec):
    """The simulator's own trace as the 'measured' run: its compute replayed (the draws of jitter and a
    straggler, nothing else) gives back its step time exactly, a sharded step's too (its compute rows span
    the gathers that stall them, which the replay leaves out); a run that communicates nothing has no
    replay."""
    cluster = Cluster(nodes=2, inter=Link(bandwidth=2e7, latency=1e-4), jitter=0.3, speed=(1.0, 0.5))
    workload = Workload(param_bytes=4e5, compute_time=0.003, batch_size=32, layers=(1e5, 1e5, 2e5))
    run = simulate(cluster, workload, spec, steps=30, seed=5)
    replayed = replay(cluster, workload, parse(spec), run.trace, 30, 2)
    assert replayed == pytest.approx(run.steady.step_time, rel=1e-12)
    alone = Cluster(nodes=1, jitter=0.3)
    one = simulate(alone, workload, "allreduce", steps=10)
    assert math.isnan(replay(alone, workload, parse("allreduce"), one.trace, 10, 1))


def test_a_parameter_server_row_gets_the_server_s_own_time_per_request_from_its_probe(monkeypatch, tmp_path):
    # The server probe times one worker's push-and-wait and pull at the run's payload; the simulator is given
    # the per-request time that makes its own price of the two equal to their means
    # (real.calibration.server_fit.fit_service).
    # Here the timings are made from that price plus a known 0.8 ms per request, so it is recovered exactly.
    _fake_links(monkeypatch)  # every link 5 MB/s, 0.1 ms; bucket 15 kB
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", lambda *a, **k: FAKE_COMPUTE)
    monkeypatch.setattr("real.calibration.sharing_probe.measure_sharing", EVEN_SHARING)
    monkeypatch.setattr("real.testbed.window.measure_window", FAKE_WINDOW)
    asked = []
    alpha, rate, burst, service = 1e-4, 5e6, 15_000, 0.8e-3

    def measure_server(bandwidth, folder, size, precision, prefix):
        asked.append((bandwidth, size, precision))
        wire = (size - burst) / rate
        return {"push_wait": [3 * alpha + wire + service] * 3, "pull": [2 * alpha + wire + service] * 3}

    monkeypatch.setattr("real.calibration.server_probe.measure_server", measure_server)
    args = validation.parse_args(["--out", str(tmp_path / "v")])
    cluster, _, values = calibrate(Config("ps:mode=async", 2, "50Mbit/s", "mlp"), args.settings)
    assert asked == [("50Mbit/s", wire_bytes(model_bytes("mlp"), "fp32"), "fp32")]  # the run's payload
    assert cluster.server_service == values["server_service"] == pytest.approx(service, rel=1e-9)
    cluster, _, values = calibrate(Config("allreduce", 2, "50Mbit/s", "mlp"), args.settings)
    assert len(asked) == 1 and cluster.server_service == values["server_service"] == 0.0  # no server, no probe


def test_a_parameter_server_row_with_workers_gets_the_window_its_probe_read_at_the_run_s_message(monkeypatch,
                                                                                                   tmp_path):
    # A reply's acknowledgements wait behind the pushes coming in, so it sends a window per queueing delay
    # (Link.window): the window is read on the testbed at the row's rate and gradient size (real.testbed.window);
    # a lone worker's server, whose replies cross no push, and a row without a server probe nothing.
    _fake_links(monkeypatch)
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", lambda *a, **k: FAKE_COMPUTE)
    monkeypatch.setattr("real.calibration.sharing_probe.measure_sharing", EVEN_SHARING)
    monkeypatch.setattr("real.calibration.server_probe.measure_server",
                        lambda *a, **k: {"push_wait": [1.0], "pull": [1.0]})
    asked = []

    def measure_window(bandwidth, folder, size, prefix="sstb", repeats=5):
        asked.append((bandwidth, size))
        return FAKE_WINDOW(bandwidth, folder, size)

    monkeypatch.setattr("real.testbed.window.measure_window", measure_window)
    settings = validation.parse_args(["--out", str(tmp_path / "v")]).settings
    for rate in ("200Mbit/s", "1Gbit/s"):
        cluster, _, _ = calibrate(Config("ps:mode=async", 4, rate, "mlp"), settings)
        assert cluster.server_net.window == FAKE_WINDOW(rate, None, model_bytes("mlp"))["window"]
    assert asked == [("200Mbit/s", model_bytes("mlp")), ("1Gbit/s", model_bytes("mlp"))]
    for config in (Config("ps", 1, "200Mbit/s", "mlp"), Config("allreduce", 4, "200Mbit/s", "mlp")):
        cluster, _, _ = calibrate(config, settings)
        assert len(asked) == 2 and (cluster.servers == 0 or cluster.server_net.window == 0.0)


# -- the compressing schemes' rows ------------------------------------------------------------------------------
def test_the_compressing_schemes_list_on_one_command_line_as_three():
    text = "allreduce:compression=powersgd,rank=4,topk:ratio=0.01,diloco:period=4"
    assert validation._items("--schemes", text) == tuple(validation.COMPRESSED)
    args = validation.parse_args(["--schemes", text, "--worlds", "2", "--bandwidths", "200Mbit/s,1Gbit/s",
                                  "--models", "mlp", "--slow", "1", "--out", "/tmp/unused-validation"])
    assert {c.scheme for c in args.configs} == {"allreduce", "allreduce:compression=powersgd,rank=4", "topk",
                                               "diloco:period=4"}


def test_the_default_grid_has_the_compressing_rows_and_a_named_grid_runs_what_it_names(tmp_path):
    out = str(tmp_path / "v")
    default = validation.parse_args(["--out", out]).configs
    assert {c.key for c in default} == {c.key for c in validation.grid()}
    assert sum(c.scheme == "topk" for c in default) == len(validation.MODELS)
    named = validation.parse_args(["--out", out, "--schemes", "allreduce,ps"]).configs
    assert {c.scheme for c in named} == {"allreduce", "ps"}
    # other models, the same default schemes and rates: their compressing rows too
    assert sum(c.scheme == "topk" for c in validation.parse_args(["--out", out, "--models", "mlp"]).configs) == 1


def test_a_run_s_collectives_are_timed_as_the_executor_plans_them_for_the_model_s_tensors():
    # PowerSGD's P and Q rounds are sized by the model's own matrices (real.models.param_shapes), as the
    # executor builds its plan: the small model's (128, 784) and (10, 128) weights at rank 4, its biases sent
    # as they are. Top-k sends k of the n values with an int32 index each; DiLoCo its pseudo-gradient.
    from syncsim.schemes.topk import top_k

    n = 101_770
    powersgd = Config("allreduce:compression=powersgd,rank=4", 2, "200Mbit/s", "mlp")
    p_bytes = 4 * (128 + 10 + 128 * 4 + 10 * 4)  # biases, then P of each matrix (rows x rank)
    q_bytes = 4 * (784 * 4 + 128 * 4)  # Q of each matrix (cols x rank)
    assert timed_size(powersgd) == ((p_bytes, "fp32"), (q_bytes, "fp32"))
    assert timed_gather(powersgd) == () and message_bytes(powersgd) == q_bytes
    topk = Config("topk:ratio=0.01", 4, "200Mbit/s", "mlp")
    k = top_k(n, 0.01)
    assert timed_size(topk) == () and timed_gather(topk) == ((k, "fp32"),)
    assert message_bytes(topk) == k * (4 + 4)
    bf16 = Config("topk:ratio=0.1,precision=bf16", 2, "200Mbit/s", "mlp")
    assert timed_gather(bf16) == ((top_k(n, 0.1), "bf16"),)
    diloco = Config("diloco:period=4", 2, "200Mbit/s", "mlp")
    assert timed_size(diloco) == ((4 * n, "fp32"),)
    streaming = Config("diloco:period=4,fragments=4", 2, "200Mbit/s", "mlp")
    assert timed_size(streaming) == ((4 * (n // 4), "fp32"),)  # one fragment a period, most often
    for scheme in validation.COMPRESSED:  # one worker sends nothing
        assert timed_size(Config(scheme, 1, "200Mbit/s", "mlp")) == ()
        assert timed_gather(Config(scheme, 1, "200Mbit/s", "mlp")) == ()


def test_the_calibrated_workload_has_the_model_s_shapes_and_leaves_the_compressors_to_the_compute_probe(
        monkeypatch, tmp_path):
    # The compute probe timed the executor's whole step, compressor included: the workload must not price
    # that work again (compress_flops, scan_rate unset), and the simulator must send PowerSGD's rounds at
    # the sizes the run sends them (the model's own shapes).
    _fake_links(monkeypatch)
    monkeypatch.setattr("real.calibration.link_probe.measure_link", lambda *a, now, gathers, **k: {
        "burst": 15_000, "fits": {name: {"alpha": 1e-4, "launch": 0.0, "bandwidth": 5e6}
                                  for name in ("pingpong", "allreduce_fp32", "allreduce_fp16", "allgather_fp32")},
        "now": [[size, precision, [5e-3]] for size, precision in now],
        "gather_now": [[values, precision, [5e-3]] for values, precision in gathers]})
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", lambda *a, **k: FAKE_COMPUTE)
    args = validation.parse_args(["--out", str(tmp_path / "v")])
    for scheme in validation.COMPRESSED:
        config = Config(scheme, 2, "200Mbit/s", "mlp")
        cluster, workload, _ = calibrate(config, args.settings)
        assert workload.shapes == ((128, 784), (128,), (10, 128), (10,))
        assert workload.compress_flops is None and workload.scan_rate is None
        trace = simulate(cluster, workload, as_run_on_gloo(scheme), steps=8).trace
        sent = trace[trace["kind"].isin(["allreduce", "allgather", "outer"])].groupby("kind")["bytes"]
        expected = {"allreduce:compression=powersgd,rank=4": {"allreduce": {2760, 14592}},
                    "topk": {"allgather": {8144}}, "diloco:period=4": {"outer": {407_080}}}[str(parse(scheme))]
        assert {kind: set(sizes.astype(int)) for kind, sizes in sent} == expected, scheme


def test_powersgd_s_two_rounds_share_one_launch_with_which_their_forms_pass_through_their_timed_total():
    # Basis: the simulator prices every all-reduce of a run with one launch L; a PowerSGD step sends two
    # (P with the uncompressed values, then Q). With both timed at their sizes, L is what makes the closed
    # forms' total equal the timed total: here L + 2 alpha + max(0, n - burst)/B each, on two hosts.
    p, alpha, rate, burst, launch = 2, 1e-4, 25e6, 25_000, 1e-3
    probe = _clean_probe(p, alpha, rate, burst, launch)
    sizes = (2760, 40_000)  # one within the bucket, one beyond
    timed = (1.6e-3, 2.9e-3)
    probe["at_size"] = [[size, "fp32", [t] * AT_REPEATS] for size, t in zip(sizes, timed)]
    fit = fit_links(probe, burst, message_bytes=max(sizes), sizes=sizes)["allreduce_fp32"]
    assert fit["launch_from"] == "run's sizes, timed"

    def form(n):
        return fit["launch"] + 2 * (p - 1) * fit["alpha"] + max(0.0, 2 * (p - 1) / p * n - burst) / fit["bandwidth"]

    assert form(sizes[0]) + form(sizes[1]) == pytest.approx(sum(timed), rel=1e-9)
    # one of them not timed: the launch is fitted at the run's message size, as for a single all-reduce
    probe["at_size"] = probe["at_size"][1:]
    single = fit_links(probe, burst, message_bytes=max(sizes), sizes=sizes)["allreduce_fp32"]
    assert single["launch_from"] == "run's size, timed" and form(sizes[1]) != pytest.approx(2.9e-3)
    assert single["launch"] + 2 * alpha + (40_000 - burst) / single["bandwidth"] == pytest.approx(2.9e-3)


@pytest.mark.parametrize("sizes,timed", [((2760, 14_592), (0.5e-3, 0.7e-3)), ((14_592,), (0.6e-3,))])
def test_collectives_faster_than_the_ping_pong_s_hops_get_the_latency_their_time_implies(sizes, timed):
    # Measured at 200 Mbit/s: the ping-pong's small messages took a median 1.16 ms one way, a 4 kB two-host
    # all-reduce (two hops) about 0.5 ms. Within the bucket a collective costs its hops and its launch only,
    # so with the ping-pong's alpha no launch >= 0 lets the forms pass through the timed times: the hops then
    # get the latency those times imply, and no launch.
    p, alpha, rate, burst = 2, 1.16e-3, 23e6, 25_000
    probe = _clean_probe(p, alpha, rate, burst, 0.0)
    probe["at_size"] = [[size, "fp32", [t] * AT_REPEATS] for size, t in zip(sizes, timed)]
    extra = {"sizes": sizes} if len(sizes) > 1 else {}
    fit = fit_links(probe, burst, message_bytes=max(sizes), **extra)["allreduce_fp32"]
    assert fit["launch"] == 0.0 and fit["alpha"] < alpha
    assert sum(2 * (p - 1) * fit["alpha"] for _ in sizes) == pytest.approx(sum(timed), rel=1e-9)
    # top-k's exchange alike: one hop on two hosts
    probe["at_gather"] = [[1018, "fp32", [0.4e-3] * AT_REPEATS]]
    gather = fit_links(probe, burst, gather=1018)["allgather_fp32"]
    assert gather["launch"] == 0.0 and gather["alpha"] == pytest.approx(0.4e-3, rel=1e-9)


@pytest.mark.parametrize("world", [2, 4])
def test_top_k_s_exchange_is_fitted_as_the_simulator_prices_an_all_gather_on_the_ping_pong_s_link(world):
    # Basis: syncsim prices top-k's exchange as one ring all-gather (syncsim.collectives.allgather_time) of
    # k (4 + value bytes) per rank on the cluster's link. The probe times the executor's exchange (k int32
    # indices, then k values) at the run's k; on the ping-pong's alpha and rate the fit's launch makes the
    # simulator's own price of it equal the exchange's timed mean.
    from real.calibration.messages import gather_bytes
    from syncsim.collectives import allgather_time

    alpha, rate, burst = 1e-4, 25e6, 25_000
    probe = _clean_probe(world, alpha, rate, burst, 1e-3)
    k = 4311
    timings = [3e-3] * 30 + [5e-3] * 10
    probe["at_gather"] = [[k, "fp32", timings], [k, "bf16", [1.0] * 20], [17, "fp32", [1.0] * 20]]
    fits = fit_links(probe, burst, message_bytes=gather_bytes(k, "fp32"), gather=k)
    fit = fits["allgather_fp32"]
    assert fit["alpha"] == fits["pingpong"]["alpha"] and fit["bandwidth"] == fits["pingpong"]["bandwidth"]
    assert gather_bytes(k, "fp32") == k * 8 and gather_bytes(k, "bf16") == k * 6
    cluster = Cluster.homogeneous(world, Link(fit["bandwidth"], fit["alpha"]), collective_latency=fit["launch"])
    priced = allgather_time(cluster, gather_bytes(k, "fp32")) - min(burst, (world - 1) * k * 8) / fit["bandwidth"]
    assert priced == pytest.approx(at_size_time(timings), rel=1e-9)
    assert fits["allgather_bf16"]["launch"] >= 0  # another precision's exchange: its own fit
    assert "allgather_fp32" not in fit_links(probe, burst, gather=None)  # no run's k: no fit


def test_the_link_probe_times_a_top_k_run_s_exchange_at_every_call_and_never_caches_it(monkeypatch, tmp_path):
    launches = []

    def torchrun_on(bed, module, argv, log_dir, timeout, agent):
        gather = argv[argv.index("--gather") + 1] if "--gather" in argv else ""
        launches.append((gather, "--no-sweep" not in argv))
        probe = _clean_probe(2, 1e-4, 110e6, 125_000, 1e-3) if "--no-sweep" not in argv else {"world": 2}
        probe["at_size"] = []
        probe["at_gather"] = [[int(v), precision, [4e-3] * AT_REPEATS]
                              for v, precision in (e.split(":") for e in filter(None, gather.split(",")))]
        Path(argv[argv.index("--probe") + 1]).write_text(json.dumps(probe))
        return [0, 0]

    monkeypatch.setattr("real.testbed.launcher.torchrun_on", torchrun_on)
    monkeypatch.setattr("real.testbed.namespaces.Testbed", ProbeBed)
    for _ in range(2):
        measured = measure_link("1Gbit/s", tmp_path, message_bytes=8144, gathers=((1018, "fp32"),))
        assert measured["gather_now"] == [[1018, "fp32", [4e-3] * AT_REPEATS]]
        assert measured["fits"]["allgather_fp32"]["launch_from"] == "run's size, timed"
    assert launches == [("", True), ("1018:fp32", False), ("1018:fp32", False)]
    cached = json.loads((tmp_path / "link-1Gbit-s-h2.json").read_text())["result"]  # real.calibration.cache
    assert cached["probe"].get("at_gather", []) == []
    with pytest.raises(ValueError, match="gathers entry"):
        measure_link("1Gbit/s", tmp_path, gathers=((0, "fp32"),))


def test_the_run_s_own_sizes_are_timed_with_the_ranks_busy_after_them_and_a_bad_after_is_named(monkeypatch,
                                                                                                tmp_path):
    # measure_link's ``after`` (the run's compute step) reaches the ranks timing the run's own sizes as
    # --after; the sweep, which times no run's size, is launched without it.
    argvs: list = []
    monkeypatch.setattr("real.testbed.launcher.torchrun_on", _link_launcher(itertools.repeat(4e-3), argvs))
    monkeypatch.setattr("real.testbed.namespaces.Testbed", ProbeBed)
    measure_link("1Gbit/s", tmp_path, message_bytes=407_080, now=((407_080, "fp32"),), after=2.5e-3)
    sweep, now = argvs
    assert "--after" not in sweep
    assert float(now[now.index("--after") + 1]) == 2.5e-3
    for bad in (-1e-3, 61.0, float("nan"), "2ms"):
        with pytest.raises(ValueError, match="after must be between 0 and 60 seconds"):
            measure_link("1Gbit/s", tmp_path, now=((407_080, "fp32"),), after=bad)


def test_a_row_s_own_timings_are_timed_afresh_online_and_read_back_offline(monkeypatch, tmp_path):
    # measure_link's ``keep`` stores the run's own timings (real.calibration.cache.recorded): online each
    # call times them again (a resumed study must not take a minutes-old timing), offline() reads the last
    # call's back without a launch, and a row that kept none is NotCached there.
    from real.calibration.cache import NotCached, offline

    argvs: list = []
    monkeypatch.setattr("real.testbed.launcher.torchrun_on", _link_launcher(iter([3e-3, 5e-3, 4e-3]), argvs))
    monkeypatch.setattr("real.testbed.namespaces.Testbed", ProbeBed)
    own = ((407_080, "fp32"),)
    for expected in (5e-3, 4e-3):
        assert measure_link("1Gbit/s", tmp_path, message_bytes=407_080, now=own, keep="row")["now"][0][2][0] == expected
    with offline():
        again = measure_link("1Gbit/s", tmp_path, message_bytes=407_080, now=own, keep="row")
        assert again["now"] == [[407_080, "fp32", [4e-3] * AT_REPEATS]]
        assert again["exits_now"] == [[407_080, "fp32", [[0.0, 1e-3]] * AT_REPEATS]]  # kept beside them
        with pytest.raises(NotCached):
            measure_link("1Gbit/s", tmp_path, message_bytes=407_080, now=own, keep="another-row")
    assert [argv[argv.index("--at") + 1] for argv in argvs] == ["", "407080:fp32", "407080:fp32"]


def test_a_run_computes_its_period_between_collectives():
    # steps_per_sync: the steps of a worker's plan over STEPS per step holding a collective: every step for
    # an all-reduce (PowerSGD's two rounds, top-k's exchange too), the period for local SGD's averaging
    # and DiLoCo's outer step; 1 where there is no collective between workers (a server, one worker).
    from real.validation.traffic import steps_per_sync

    for scheme, world, want in (("allreduce", 2, 1.0), ("allreduce:compression=powersgd,rank=4", 2, 1.0),
                                ("topk:ratio=0.01", 2, 1.0), ("localsgd:period=4", 4, 4.0),
                                ("diloco:period=4", 2, 4.0), ("localsgd:period=4", 1, 1.0), ("ps", 2, 1.0)):
        assert steps_per_sync(Config(scheme, world, "1Gbit/s", "mlp")) == want, scheme


def test_the_link_probe_s_after_option_is_checked(tmp_path, capsys):
    from real.calibration.ranks import main

    for bad in ("-0.001", "61"):
        with pytest.raises(SystemExit) as exit_:
            main(["--probe", str(tmp_path / "probe.json"), "--after", bad])
        assert exit_.value.code == 2 and "--after must be between 0 and 60 seconds" in capsys.readouterr().err


def test_the_link_probe_s_gather_option_names_a_bad_entry():
    from real.calibration.messages import parse_gather

    assert parse_gather("1018:fp32,17:bf16") == [(1018, "fp32"), (17, "bf16")] and parse_gather("") == []
    for bad in ("0:fp32", "12:fp8", "x:fp32", "12", "-3:fp16"):
        with pytest.raises(ValueError, match="--gather"):
            parse_gather(bad)


# -- loss curves --------------------------------------------------------------------------------------------------
def _write_run(folder: Path, scheme: str, world: int, steps: int, batch: int, lr: float, losses) -> None:
    """A run's output folder as real.run leaves it, for what the loss comparison reads: summary.json's config,
    updates.csv (the simulator's, of the same plan: the executor writes the same rows) and each worker's
    result with its logged losses."""
    run = simulate(Cluster.homogeneous(world, Link("1GB/s", "10us")), Workload(param_bytes=407_080, compute_time=1e-3,
                                                                               batch_size=batch), scheme, steps=steps)
    (folder / "ranks").mkdir(parents=True)
    config = {"scheme": scheme, "world": world, "servers": 0, "model": "mlp", "data": "synthetic", "seed": 0,
              "lr": lr, "steps": steps, "batch_size": batch}
    (folder / "summary.json").write_text(json.dumps({"config": config}))
    run.updates.to_csv(folder / "updates.csv", index=False)
    for worker in range(world):
        (folder / "ranks" / f"result-rank{worker}.json").write_text(json.dumps(
            {"rank": worker, "role": "worker", "losses": [float(x) for x in np.asarray(losses)[:, worker]]}))
    (folder / "ranks" / f"result-rank{world}.json").write_text(json.dumps({"rank": world, "role": "server"}))


def _reference_losses(scheme: str, world: int, steps: int, batch: int, lr: float, mean: bool = True) -> np.ndarray:
    """Each worker's minibatch loss at each step, written here in plain float32 torch from the schemes'
    definitions (no replay, no executor): synchronous SGD on the mean gradient, or local SGD averaging the
    replicas every second step. ``mean`` False sums the gradients instead (a fault the comparison must see)."""
    import torch
    import torch.nn.functional as F

    from real.data import load

    data = load("synthetic", 0)
    nets = [build("mlp", 0) for _ in range(world)]
    losses = np.zeros((steps, world))
    for step in range(steps):
        grads = []
        for worker, net in enumerate(nets):
            x, y = data.batch(worker, step, world, batch)
            net.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            losses[step, worker] = float(loss.detach())
            grads.append([p.grad.clone() for p in net.parameters()])
        with torch.no_grad():
            if scheme == "allreduce":
                total = [sum(g[i] for g in grads) / (world if mean else 1) for i in range(len(grads[0]))]
                for net in nets:
                    for p, g in zip(net.parameters(), total):
                        p -= lr * g
            else:  # localsgd:period=2: a local step each, then the replicas' mean at every second step
                for net, g in zip(nets, grads):
                    for p, gi in zip(net.parameters(), g):
                        p -= lr * gi
                if step % 2 == 1:
                    for params in zip(*(net.parameters() for net in nets)):
                        average = sum(p.detach().clone() for p in params) / world
                        for p in params:
                            p.copy_(average)
    return losses


@pytest.mark.parametrize("scheme", ["allreduce", "localsgd:period=2"])
def test_a_run_s_logged_losses_agree_with_its_schedule_replayed_and_a_wrong_run_s_do_not(tmp_path, scheme):
    # The replay (syncsim.convergence on real.replay's model and data) of a run's updates must predict the
    # losses the run logged, step by step, to float32 drift (the ranks float32, the replay float64: ~1e-7
    # relative over a few steps); a run that summed where it should average is far off from step 1 on.
    steps, batch, lr = 6, 16, 0.05
    good, wrong = tmp_path / "good", tmp_path / "wrong"
    _write_run(good, scheme, 2, steps, batch, lr, _reference_losses(scheme, 2, steps, batch, lr))
    compared, median, top = loss_agreement(measured_losses(good),
                                                      replayed_losses(good, steps))
    assert compared == steps and top <= 1e-5 and median <= top
    # the replay stops once the first steps asked for are taken; more than the run has: the run's
    replayed = replayed_losses(good, 3)
    assert replayed.shape == (3, 2) and np.isfinite(replayed).all()
    assert replayed_losses(good, 100).shape == (steps, 2)
    figures = loss_figures(good, 4)
    assert figures["loss_steps"] == 4 and figures["loss_rel_max"] <= 1e-5
    assert loss_figures(good, 0)["loss_steps"] == 0
    if scheme == "allreduce":
        _write_run(wrong, scheme, 2, steps, batch, lr, _reference_losses(scheme, 2, steps, batch, lr, mean=False))
        assert loss_figures(wrong, steps)["loss_rel_max"] > 1e-3


def test_loss_agreement_compares_finite_pairs_and_counts_one_sided_divergence_as_infinitely_apart():
    measured = np.array([[2.0, 2.0], [1.0, 4.0], [np.nan, 1.0]])
    replayed = np.array([[2.0, 2.2], [1.0, 4.0], [np.nan, 1.0]])
    steps, median, top = loss_agreement(measured, replayed)
    assert steps == 3 and top == pytest.approx(0.1) and median == 0.0  # the pair both NaN is left out
    _, _, top = loss_agreement(measured, np.array([[2.0, 2.0], [1.0, np.inf], [np.nan, 1.0]]))
    assert top == math.inf
    assert loss_agreement(measured[:1], replayed)[0] == 1  # as many steps as both have
    steps, median, top = loss_agreement(np.full((2, 1), np.nan), np.full((2, 1), np.nan))
    assert steps == 2 and math.isnan(median) and math.isnan(top)


def test_the_summary_gives_the_loss_curves_agreement_and_a_table_by_scheme():
    def row(scheme, median, top, error=""):
        return {"scheme": scheme, "world": 2, "bandwidth": "200Mbit/s", "model": "mlp", "slow": 1.0,
                "rel_error": 0.01, "speedup_error": np.nan, "staleness_mean_error": np.nan,
                "staleness_distance": np.nan, "predicted_step_time": 1.0, "measured_step_time": 1.0,
                "loss_steps": 40, "loss_rel_median": median, "loss_rel_max": top, "error": error}

    frame = pd.DataFrame([row("topk", 1e-7, 2e-6), row("topk", 3e-7, 5e-6), row("diloco:period=4", 2e-4, 1.7e-2),
                          row("allreduce", np.nan, np.nan), row("ps", 1.0, 9.0, error="RuntimeError: injected")])
    lines = summary_lines(frame)
    line = next(line for line in lines if line.startswith("loss curves: each run's"))
    assert "first 40 steps" in line and "median 3e-07" in line and "max 0.017 over 3 configurations" in line
    start = lines.index(next(line for line in lines if line.startswith("loss curves, |replayed")))
    table = lines[start + 1:]
    assert len(table) == 4 and table[0].startswith("| scheme")
    assert table[2].split("|")[1:5] == [" topk            ", "    2e-07 ", "    5e-06 ", "    2 "]
    assert "diloco:period=4" in table[3] and not any("| ps " in t for t in table)  # the failed row nowhere
    assert not any(line.startswith("loss") for line in summary_lines(frame.drop(columns=[
        "loss_steps", "loss_rel_median", "loss_rel_max"])))


def test_a_resumed_study_compares_the_loss_curves_of_rows_measured_before_they_were(tmp_path, monkeypatch):
    configs = validation.quick_grid()
    fake_study(monkeypatch, fail=set())
    argv = ["--quick", "--out", str(tmp_path), "--steps", "8", "--steadiness", "0"]
    assert validation.main(argv) == 0
    csv = tmp_path / "validation.csv"
    pd.read_csv(csv).drop(columns=["loss_steps", "loss_rel_median", "loss_rel_max"]).to_csv(csv, index=False)
    for config in configs[1:]:  # the first run's outputs are gone
        (tmp_path / "runs" / config.name / "summary.json").write_text("{}")
    (tmp_path / "runs" / configs[0].name / "trace.csv").unlink()
    assert validation.main(argv) == 0
    data = pd.read_csv(csv, keep_default_na=False, na_values=[""]).set_index(list(KEY))
    assert math.isnan(data.loc[configs[0].key, "loss_rel_max"])
    assert (data.loc[[c.key for c in configs[1:]], "loss_rel_max"] == 2e-6).all()


# -- the sharded schemes: rows a command line can name, none in the default grid ---------------------
SHARDED = ("zero:stage=1", "zero:stage=2", "zero:stage=3,precision=bf16", "fsdp", "fsdp:reshard=false")


def test_sharded_schemes_are_rows_the_study_accepts_and_three_are_in_the_default_grid(tmp_path):
    from syncsim.schemes import SHARDED_ACTIONS

    args = validation.parse_args(["--schemes", ",".join(SHARDED), "--worlds", "2", "--bandwidths", "200Mbit/s",
                                  "--models", "mlp", "--slow", "1", "--out", str(tmp_path / "v")])
    assert args.schemes == SHARDED  # "precision=bf16" continues the scheme before it
    configs = validation.configurations(args)  # each checked as its run will be given it (RunConfig)
    assert [c.scheme for c in configs if not c.baseline] == [str(parse(s)) for s in SHARDED]

    def sharded(scheme):
        return any(issubclass(kind, SHARDED_ACTIONS) for kind in parse(scheme).policy(4.0).action_types(2))

    in_grid = {(c.scheme, c.world, c.bandwidth, c.slow) for c in validation.grid() if sharded(c.scheme)}
    assert in_grid == {(str(parse(s)), 2, "200Mbit/s", 1.0) for s in validation.SHARDED}


def test_a_sharded_row_is_priced_with_the_traffic_its_own_collectives_were_timed_at(monkeypatch, tmp_path):
    # Basis: fit_traffic's factors make the simulator's price of the step's collectives equal the timed ones
    # (tests/unit/test_sharded_probe.py); calibrate gives the row's cluster those factors and records them,
    # and leaves every other row on NCCL's ring (1).
    from real.calibration.sharded_fit import simulated_collectives

    _fake_links(monkeypatch)
    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", lambda *a, **k: FAKE_COMPUTE)
    asked = []

    def measure_sharded(bandwidth, folder, scheme, model, world, prefix):
        asked.append((bandwidth, scheme, model, world))
        return {"reducescatter": [spent["reducescatter"]] * 15, "allgather": [spent["allgather"]] * 15}

    monkeypatch.setattr("real.calibration.sharded_probe.measure_sharded", measure_sharded)
    settings = validation.parse_args(["--out", str(tmp_path / "v")]).settings
    config = Config("fsdp", 2, "200Mbit/s", "mlp")
    plain, workload, _ = calibrate(Config("allreduce", 2, "200Mbit/s", "mlp"), settings)
    spent = simulated_collectives(plain.replace(reducescatter_traffic=2.1, allgather_traffic=1.05), workload, "fsdp")
    cluster, _, values = calibrate(config, settings)
    assert asked == [("200Mbit/s", "fsdp", "mlp", 2)]
    assert (cluster.reducescatter_traffic, cluster.allgather_traffic) == pytest.approx((2.1, 1.05), rel=1e-6)
    assert (values["reducescatter_traffic"], values["allgather_traffic"]) == (cluster.reducescatter_traffic,
                                                                                cluster.allgather_traffic)
    assert (plain.reducescatter_traffic, plain.allgather_traffic) == (1.0, 1.0)
    one, _, _ = calibrate(Config("fsdp", 1, "200Mbit/s", "mlp"), settings)  # one worker: no collective, not probed
    assert (one.reducescatter_traffic, one.allgather_traffic) == (1.0, 1.0) and len(asked) == 1


@pytest.mark.parametrize("scheme", SHARDED)
def test_a_sharded_run_is_timed_by_the_all_reduce_of_its_gradient(scheme):
    from syncsim.schemes import ReduceScatterGradients

    config = Config(scheme, 2, "200Mbit/s", "mlp")
    spec = parse(scheme)
    gradient = model_bytes("mlp") * spec.wire_ratio
    action = sync_action(config)
    assert isinstance(action, ReduceScatterGradients) and action.nbytes == gradient
    assert (config.servers, config.link_hosts) == (0, 2)
    assert message_bytes(config) == gradient
    assert timed_size(config) == ((wire_bytes(gradient, spec.precision), spec.precision),)
    assert timed_gather(config) == ()
    # one worker sends nothing over the links
    assert timed_size(Config(scheme, 1, "200Mbit/s", "mlp")) == ()


def test_a_scheme_the_executor_does_not_run_is_refused_before_any_row_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        validation.parse_args(["--schemes", "zero:stage=1,precision=bf16", "--worlds", "2", "--bandwidths",
                               "200Mbit/s", "--models", "mlp", "--slow", "1", "--out", str(tmp_path / "v")])
    assert "ZeroRedundancyOptimizer" in capsys.readouterr().err


def test_the_testbed_s_check_becomes_the_study_s_quick_preset_without_importing_it(monkeypatch):
    # python -m real.testbed --check is python -m studies.validation --quick (with the testbed's prefix and
    # the options after --): the process is replaced by the study, run as its own program
    import sys

    from real.testbed.__main__ import main as testbed

    became = []

    def execv(path, argv):
        became.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr("os.execv", execv)
    monkeypatch.setattr("real.testbed.__main__.raise_on_signals", lambda: None)  # this process's handlers kept
    with pytest.raises(SystemExit):
        testbed(["--check", "--prefix", "sstbchk", "--", "--steps", "12"])
    assert became == [[sys.executable, "-m", "studies.validation", "--quick", "--prefix", "sstbchk", "--steps", "12"]]


def test_the_run_s_own_collectives_are_timed_followed_by_a_lone_rank_s_work(monkeypatch, tmp_path):
    # calibrate hands the link probe (``after``) what a run's rank computes between its collectives in its
    # own core's time: the one-rank compute probe of the row's scheme times the steps between collectives,
    # not the all-at-once probe's step, which on a shared machine is slower by the contention. Never the
    # speedup baseline's repeat at the row's rate (a label), which is timed just before its own run; a row
    # that times no collective of its own asks no one-rank probe.
    probes, afters = [], []

    def measure_compute(model, batch_size, processes, folder, scheme="allreduce", slow=1.0, repeat=""):
        probes.append((processes, scheme, repeat))
        return FAKE_COMPUTE | {"compute_time": 1e-3 if processes == 1 else 2.7e-3}

    def measure_link(*args, now, after=0.0, **kwargs):
        afters.append(after)
        fit = {"alpha": 1e-4, "launch": 0.0, "bandwidth": 5e6}
        return {"burst": 15_000, "fits": {"pingpong": fit, "allreduce_fp32": fit, "allreduce_fp16": fit},
                "now": [[size, precision, [5e-3]] for size, precision in now]}

    monkeypatch.setattr("real.calibration.compute_probe.measure_scheme_compute", measure_compute)
    monkeypatch.setattr("real.calibration.link_probe.measure_link", measure_link)
    monkeypatch.setattr("real.calibration.sharing_probe.measure_sharing", EVEN_SHARING)
    monkeypatch.setattr("real.testbed.window.measure_window", FAKE_WINDOW)
    settings = validation.parse_args(["--out", str(tmp_path / "v")]).settings
    calibrate(Config("allreduce", 4, "1Gbit/s", "mlp"), settings)
    calibrate(Config("localsgd:period=4", 4, "1Gbit/s", "mlp"), settings)
    assert afters == pytest.approx([1e-3, 4e-3])
    localsgd = str(parse("localsgd:period=4"))
    assert probes == [(4, "allreduce", ""), (1, "allreduce", ""), (4, localsgd, ""), (1, localsgd, "")]
    monkeypatch.setattr("real.calibration.server_probe.measure_server", lambda *a, **k: {
        "push_wait": [1e-2] * 3, "pull": [1e-2] * 3})
    probes.clear()
    calibrate(Config("ps", 4, "1Gbit/s", "mlp"), settings)
    assert [p[0] for p in probes] == [4]


def test_workers_that_meet_are_simulated_with_the_jitter_that_makes_their_slowest_as_late_as_the_probe_s():
    # A collective waits for the slowest worker: where a scheme's workers meet, the simulator gets the jitter
    # whose slowest of the row's workers, over the steps between meetings, lies as far above the mean as the
    # compute probe's slowest rank did (meeting_excess); elsewhere the probe's own spread of steps.
    from real.validation.calibration import meeting_jitter
    from syncsim.compute import jitter_for_slowest

    probe = {"jitter": 0.4, "meeting_excess": 0.2}
    assert meeting_jitter(Config("allreduce", 4, "1Gbit/s", "mlp"), probe) == jitter_for_slowest(0.2, 4, 1)
    # local SGD's workers meet every fourth step: the slowest of four sums of four draws
    local = meeting_jitter(Config("localsgd:period=4", 4, "1Gbit/s", "mlp"), probe)
    assert local == jitter_for_slowest(0.2, 4, 4) and local > jitter_for_slowest(0.2, 4, 1)
    # a parameter server's workers never meet (the probe reports no excess); a straggler row's slowed rank is
    # priced by its speed factor and leaves too few ranks to say how late the slowest is; one worker meets nobody
    assert meeting_jitter(Config("ps", 2, "1Gbit/s", "mlp"), {"jitter": 0.4, "meeting_excess": None}) == 0.4
    assert meeting_jitter(Config("allreduce", 2, "200Mbit/s", "mlp", slow=3.0), probe) == 0.4
    assert meeting_jitter(Config("allreduce", 1, "1Gbit/s", "mlp"), probe) == 0.4
