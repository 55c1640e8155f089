"""The staleness study's quick grid end to end: CSVs first, the figure from the CSV."""

import math

import pandas as pd
import pytest

from studies import staleness


@pytest.mark.slow
def test_quick_staleness_study_writes_summary_curves_and_figure(tmp_path, capsys):
    assert staleness.main(["--quick", "--out", str(tmp_path), "--jobs", "1"]) == 0
    summary = pd.read_csv(tmp_path / "summary.csv")
    curves = pd.read_csv(tmp_path / "curves.csv")
    assert {"throughput", "steps_to_target", "time_to_target", "mean_staleness"} <= set(summary.columns)
    assert len(summary) == len(staleness.quick().runs())
    async_rows = summary[summary["scheme"] == "ps:mode=async"]
    assert (async_rows["mean_staleness"] > 0).all()
    assert (summary.loc[summary["scheme"] == "allreduce", "mean_staleness"] == 0).all()
    # every time to target is a point of that run's curve
    for row in summary.itertuples():
        if math.isfinite(row.time_to_target):
            run = curves[(curves["scheme"] == row.scheme) & (curves["straggler_prob"] == row.straggler_prob)]
            assert row.time_to_target in set(run["time"])
    (tmp_path / "staleness.png").unlink()
    staleness.plot(tmp_path / "curves.csv", tmp_path)   # the figure needs nothing but the CSV
    assert (tmp_path / "staleness.png").stat().st_size > 10_000
    assert "s→target" in capsys.readouterr().out


def test_study_configs_validate_on_construction():
    with pytest.raises(ValueError, match="Study.target"):
        staleness.Study(target=1.5)
    with pytest.raises(ValueError, match="unknown scheme 'gossip'"):
        staleness.Study(schemes=("gossip",))
