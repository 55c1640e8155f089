"""studies.tradeoffs: the quick study end to end, and its pure pieces against closed forms."""

import math

import pandas as pd
import pytest

from studies import tradeoffs


@pytest.mark.slow
def test_tradeoffs_quick_writes_csvs_figure_and_crossovers(tmp_path, capsys):
    assert tradeoffs.main(["--quick", "--out", str(tmp_path), "--jobs", "1"]) == 0
    study = tradeoffs.quick()
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == len(study.schemes) * len(study.rates) * study.seeds
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert len(summary) == len(study.schemes) * len(study.rates)
    assert (tmp_path / "tradeoffs.png").stat().st_size > 10_000
    # a scheme synchronising every step is slower per step on a slower link; steps to target do not
    # depend on the link (the update order of these schemes does not)
    base = summary[summary.scheme == "allreduce"].sort_values("rate_bytes")
    assert base.step_time.is_monotonic_decreasing
    assert runs.groupby(["scheme", "seed"]).steps_to_target.nunique().max() == 1
    # all-reduce against itself is 1 at every rate
    assert (base.vs_allreduce == 1.0).all()
    out = capsys.readouterr().out
    assert "× all-reduce" in out and "beats allreduce" in out


def test_crossover_is_where_the_log_log_lines_meet():
    # scheme B takes 2 s at 10 GB/s and 1 s at 1 GB/s; all-reduce 1 s and 4 s: log(B/A) goes from log 2
    # to log(1/4) over log rate, so it is 0 at a fraction log 2 / (log 2 + log 4) = 1/3 of the way down
    # from 10 GB/s in log space: 10 GB/s × 10^(-1/3)
    summary = pd.DataFrame({
        "scheme": ["allreduce", "allreduce", "B", "B"], "rate_bytes": [1e10, 1e9, 1e10, 1e9],
        "time_to_target": [1.0, 4.0, 2.0, 1.0]})
    cross = tradeoffs.crossovers(summary)
    assert len(cross) == 1
    row = cross.iloc[0]
    assert row.rate_bytes == pytest.approx(1e10 * 10 ** (-1 / 3), rel=1e-12)
    assert bool(row.faster_below)


def test_no_crossover_when_one_scheme_is_always_faster():
    summary = pd.DataFrame({"scheme": ["allreduce"] * 3 + ["B"] * 3, "rate_bytes": [1e9, 1e10, 1e11] * 2,
                            "time_to_target": [3.0, 2.0, 1.0, 1.0, 0.9, 0.5]})
    assert tradeoffs.crossovers(summary).empty


def test_interval_is_students_t_over_the_seeds():
    # five values with mean 3 and sample sd sqrt(2.5); t(0.975, 4) = 2.7764451051977987
    mean, low, high = tradeoffs.interval(pd.Series([1.0, 2.0, 3.0, 4.0, 5.0]))
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert (mean, low, high) == pytest.approx((3.0, 3.0 - half, 3.0 + half), rel=1e-12)
    assert tradeoffs.interval(pd.Series([1.0, math.inf])) == (math.inf, math.inf, math.inf)


def test_each_scheme_takes_its_own_optimisers_grid():
    assert tradeoffs.optimiser("diloco:period=16") == "adamw"
    assert tradeoffs.optimiser("diloco:period=16,inner=sgd") == "sgd"
    assert tradeoffs.optimiser("topk:ratio=0.01") == "sgd"


def test_bad_study_fields_are_named():
    with pytest.raises(ValueError, match="learning_rates"):
        tradeoffs.Study(learning_rates={"sgd": (0.0,), "adamw": (0.01,)})
    with pytest.raises(ValueError, match="seeds"):
        tradeoffs.Study(seeds=1)
    with pytest.raises(ValueError, match="rates"):
        tradeoffs.Study(rates=("fast",))
