"""real.validation.verdict: the validation study judges its targets only on a steady machine and the full grid."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from real.testbed.steadiness import Steadiness
from real.validation import verdict

KEY = ("scheme", "world", "servers", "bandwidth", "model", "slow")
STEADY = Steadiness("mlp", 32, 1.0, (1e-3,) * 20)  # the same speed in every window: no pair moved
# Speed 1.0, 1.3, 1.0 ... in spells of 5 windows: every pair 5 s apart moved by 30 % or 23 %
UNSTEADY = Steadiness("mlp", 32, 1.0, tuple(1e-3 * (1.0 if (i // 5) % 2 == 0 else 1.3) for i in range(20)))


def _frame(errors, speedups=None, stale=None, failed=()):
    rows = []
    for i, error in enumerate(errors):
        rows.append({"scheme": "ps", "world": 2, "servers": 1, "bandwidth": ("50Mbit/s", "1Gbit/s")[i % 2],
                     "model": "mlp", "slow": 1.0 + i, "rel_error": error,
                     "speedup_error": speedups[i] if speedups is not None else error,
                     "staleness_mean_error": stale[i] if stale is not None else np.nan,
                     "error": "RuntimeError: injected" if i in failed else ""})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("n", range(0, 11))
def test_the_sign_test_is_the_binomial_tail_counted_over_every_sign_pattern(n):
    # Independent of the closed form: enumerate all 2**n equally likely sign patterns (p = 1/2 each) and
    # count those at least as lopsided as k:n-k, i.e. whose smaller side is at most min(k, n-k).
    for k in range(n + 1):
        smaller = min(k, n - k)
        lopsided = sum(min(sum(p), n - sum(p)) <= smaller for p in itertools.product((0, 1), repeat=n))
        assert verdict.sign_test(k, n - k) == pytest.approx(min(1.0, lopsided / 2**n) if n else 1.0, rel=1e-12)


def test_six_misses_of_one_sign_are_a_bias_and_five_are_not_yet():
    assert verdict.sign_test(6, 0) == pytest.approx(2 / 64) and 2 / 64 < verdict.SIGN_LEVEL
    assert verdict.sign_test(0, 5) == pytest.approx(2 / 32) and 2 / 32 > verdict.SIGN_LEVEL
    assert verdict.sign_test(3, 3) == 1.0


def test_the_steadiness_gate_and_the_grid_decide_whether_the_targets_are_judged():
    frame = _frame([0.01, -0.02])
    keys = set(frame[list(KEY)].itertuples(index=False, name=None))
    assert verdict.judgeable(frame, STEADY, keys, KEY) is None
    assert "not timed" in verdict.judgeable(frame, None, keys, KEY)
    why = verdict.judgeable(frame, UNSTEADY, keys, KEY)
    assert why.startswith("the machine was not steady") and "in 100% of its windows" in why
    assert "1 of its 3 configurations missing" in verdict.judgeable(frame, STEADY, keys | {("x",) * 6}, KEY)
    assert "1 configurations failed" in verdict.judgeable(_frame([0.01, -0.02], failed=(1,)), STEADY, keys, KEY)
    # the bound is strict: a machine with exactly STEADY_SHARE of its pairs over 15 % is not steady
    times = [1e-3] * 26
    times[25] = 1.2e-3  # one pair of 21 (windows 20 and 25) moved by 20 %: 4.8 %, under 5 %
    assert verdict.judgeable(frame, Steadiness("mlp", 32, 1.0, tuple(times)), keys, KEY) is None
    times = [1e-3] * 25
    times[24] = 1.2e-3  # one pair of 20: exactly 5 %
    assert "not steady" in verdict.judgeable(frame, Steadiness("mlp", 32, 1.0, tuple(times)), keys, KEY)


def _with_baselines(frame, measured):
    """``frame`` and one-worker all-reduce rows (each model's speedup baseline) measured ``measured`` s."""
    base = [{"scheme": "allreduce", "world": 1, "servers": 0, "bandwidth": rate, "model": "mlp", "slow": 1.0,
             "rel_error": 0.0, "speedup_error": np.nan, "staleness_mean_error": np.nan, "error": "",
             "measured_step_time": t, "compute_time": t} for rate, t in zip(("50Mbit/s", "200Mbit/s", "1Gbit/s"),
                                                                              measured)]
    return pd.concat([frame.assign(measured_step_time=5e-3, compute_time=1e-3), pd.DataFrame(base)],
                     ignore_index=True)


def test_the_repeat_bound_is_where_one_prediction_stops_fitting_every_repeat():
    # Closed form: p within 15 % of runs a < b needs 0.85 b <= p <= 1.15 a. Checked by search over p.
    def fits(ratio):
        return any(abs(p - 1.0) <= 0.15 + 1e-12 and abs(p / ratio - 1) <= 0.15 + 1e-12
                   for p in np.linspace(0.8, 1.6, 160_001))
    assert verdict.REPEAT_SPREAD == pytest.approx(1.15 / 0.85 - 1)
    assert fits((1 + verdict.REPEAT_SPREAD) * (1 - 1e-4))
    assert not fits((1 + verdict.REPEAT_SPREAD) * (1 + 1e-4))


def test_baselines_that_moved_during_the_grid_withhold_the_verdict_whatever_the_steady_minute():
    # The steadiness minute at the start read steady; the same configuration, run at the grid's start,
    # middle and end, measured 1.0, 1.3 and 1.4 ms: 40 % apart, past the 35 % any one prediction can span.
    frame = _with_baselines(_frame([0.01, -0.02]), (1.0e-3, 1.3e-3, 1.4e-3))
    keys = set(frame[list(KEY)].itertuples(index=False, name=None))
    why = verdict.judgeable(frame, STEADY, keys, KEY)
    assert why == ("the machine moved during the grid: mlp's one-worker baseline, run 3 times, measured "
                   "1.00-1.40 ms (40% apart; within 35% one prediction can lie within 15% of every repeat), so "
                   "a row's miss may be the machine's, not the model's")
    assert verdict.verdict_lines(frame, STEADY, keys, KEY)[0] == f"targets: not judged: {why}"
    # 1.0-1.3 ms (30 % apart) is within the bound: judged, and the head says how far the repeats lay
    held = _with_baselines(_frame([0.01, -0.02]), (1.0e-3, 1.3e-3, 1.2e-3))
    assert verdict.judgeable(held, STEADY, keys, KEY) is None
    head = verdict.verdict_lines(held, STEADY, keys, KEY)[0]
    assert head.startswith("targets: ") and head.endswith(
        " (the machine was steady: 0% of windows moved by more than 15%, and its baselines' repeats lay within "
        "30% of each other)")
    # a failed repeat is no measurement of the machine
    failed = _with_baselines(_frame([0.01, -0.02]), (1.0e-3, 1.3e-3, 1.4e-3))
    failed.loc[failed.index[-1], "error"] = "RuntimeError: injected"
    assert "configurations failed" in verdict.judgeable(failed, STEADY, keys, KEY)


def test_a_steady_run_states_each_target_met_or_missed_with_its_value():
    # step time |errors| 0.01, 0.02, 0.03, 0.12, 0.20 (median 3 %: met at the bound; max 20 %: missed);
    # speedups 0.0-0.04 (met); staleness 0.25 on one row (missed); misses beyond 10 %: one each sign
    frame = _frame([0.01, -0.02, 0.03, -0.12, 0.20], speedups=[0.0, 0.01, 0.02, 0.03, 0.04],
                   stale=[np.nan, 0.05, -0.25, np.nan, np.nan])
    lines = verdict.verdict_lines(frame, STEADY, wall_seconds=29 * 60.0)
    assert lines[0] == ("targets: 2 of 7 missed (the machine was steady: 0% of windows moved by more than 15%)")
    assert lines[1:] == [
        "  met: step time median |error| 3.0% (bound 3%)",
        "  MISSED: step time max |error| 20.0% (bound 15%)",
        "  met: speedup median |error| 2.0% (bound 5%)",
        "  met: speedup max |error| 4.0% (bound 15%)",
        "  MISSED: staleness mean max |error| 25.0% (bound 20%)",
        "  met: step time misses beyond 10%: 1 under-, 1 over-predicted (sign test p = 1; a bias below 0.05)",
        "  met: grid wall time 29.0 min (bound 30 min)"]


def test_one_signed_misses_are_judged_a_bias_and_an_unsteady_run_gives_figures_without_a_verdict():
    frame = _frame([-0.11, -0.12, -0.13, -0.14, -0.15, -0.11, 0.0])
    lines = verdict.verdict_lines(frame, STEADY)
    assert "  MISSED: step time misses beyond 10%: 6 under-, 0 over-predicted (sign test p = 0.031; " \
           "a bias below 0.05)" in lines
    assert not any("wall time" in line for line in lines)  # unknown: not judged
    unsteady = verdict.verdict_lines(frame, UNSTEADY)
    assert unsteady[0].startswith("targets: not judged: the machine was not steady")
    assert not any("met" in line.split(":")[0] or "MISSED" in line for line in unsteady[1:])
    assert "  step time max |error| 15.0% (bound 15%)" in unsteady


def test_a_caller_can_withhold_the_verdict_of_a_steady_run_saying_why():
    # A re-prediction of a steady run's rows is not that run's own figures: the verdict is withheld with
    # the caller's reason, the figures still shown against their bounds.
    frame = _frame([0.01, -0.02, 0.03, -0.12, 0.20])
    lines = verdict.verdict_lines(frame, STEADY, not_judged="re-predicted")
    assert lines[0] == "targets: not judged: re-predicted"
    assert "  step time max |error| 20.0% (bound 15%)" in lines
    assert not any("MISSED" in line or line.startswith("  met") for line in lines)


def test_the_results_table_gives_each_scheme_and_link_its_median_max_and_rows():
    frame = pd.DataFrame([
        {"scheme": "ps", "bandwidth": "1Gbit/s", "rel_error": -0.10, "error": ""},
        {"scheme": "ps", "bandwidth": "1Gbit/s", "rel_error": 0.02, "error": ""},
        {"scheme": "ps", "bandwidth": "1Gbit/s", "rel_error": 0.04, "error": ""},
        {"scheme": "ps", "bandwidth": "50Mbit/s", "rel_error": math.nan, "error": "RuntimeError: injected"},
        {"scheme": "allreduce", "bandwidth": "50Mbit/s", "rel_error": 0.01, "error": ""},
    ])
    table = verdict.error_table(frame)
    assert [cell.strip() for cell in table[0].strip("|").split("|")] == ["scheme", "50Mbit/s", "1Gbit/s"]
    rows = {cells[0]: cells[1:] for cells in
            ([cell.strip() for cell in line.strip("|").split("|")] for line in table[2:])}
    assert rows == {"ps": ["-", "4.0% / 10.0% (3)"], "allreduce": ["1.0% / 1.0% (1)", "-"]}
    assert verdict.error_table(frame.iloc[3:4]) == []  # nothing finished: no table
