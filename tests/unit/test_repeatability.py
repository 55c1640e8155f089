"""The repeatability study: the validation run several times, summarised per configuration (no testbed here)."""

from __future__ import annotations

import pandas as pd
import pytest

from studies import repeatability, validation

KEY_A = {"scheme": "ps", "world": 2, "servers": 1, "bandwidth": "200Mbit/s", "model": "mlp", "slow": 1.0}
KEY_B = {"scheme": "allreduce", "world": 1, "servers": 0, "bandwidth": "200Mbit/s", "model": "mlp", "slow": 1.0}


def _row(key: dict, repeat: int, measured: float, predicted: float, compute: float = 1e-3, error: str = "") -> dict:
    return key | {"repeat": repeat, "measured_step_time": measured, "predicted_step_time": predicted,
                  "rel_error": predicted / measured - 1, "compute_time": compute, "measured_spread": 0.02 * repeat,
                  "error": error}


def test_summarise_gives_each_configuration_the_variation_of_its_repeats():
    rows = [_row(KEY_A, i, m, 1.0) for i, m in enumerate((1.0, 1.2, 0.8), start=1)]
    rows += [_row(KEY_B, i, 2.0, p, compute=c) for i, (p, c) in enumerate(((2.0, 1.0), (2.2, 1.1)), start=1)]
    rows.append(_row(KEY_B, 3, 9.0, 9.0, error="RuntimeError: rank 1 failed"))  # a failed repeat counts for nothing
    table = repeatability.summarise(pd.DataFrame(rows)).set_index("scheme")
    a, b = table.loc["ps"], table.loc["allreduce"]
    # sample standard deviation over the mean: (1.0, 1.2, 0.8) has mean 1.0 and s = 0.2
    assert a["repeats"] == 3 and a["measured_mean"] == pytest.approx(1.0)
    assert a["measured_cv"] == pytest.approx(0.2) and a["predicted_cv"] == pytest.approx(0.0)
    assert (a["error_min"], a["error_median"], a["error_max"]) == pytest.approx((1 / 1.2 - 1, 0.0, 1 / 0.8 - 1))
    assert a["measured_spread"] == pytest.approx(0.04)  # the median of 0.02, 0.04, 0.06
    # (2.0, 2.2): mean 2.1, s = 0.1414..; the failed third repeat is left out
    assert b["repeats"] == 2 and b["measured_cv"] == pytest.approx(0.0)
    assert b["predicted_cv"] == pytest.approx(pd.Series([2.0, 2.2]).std() / 2.1)
    assert b["compute_cv"] == pytest.approx(pd.Series([1.0, 1.1]).std() / 1.05)
    lines = repeatability.summary_lines(repeatability.summarise(pd.DataFrame(rows)))
    assert "median 10.0%, max 20.0% over 2 configurations x 3 repeats" in lines[0]


def test_the_study_repeats_the_validation_in_folders_of_its_own_and_writes_its_tables(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_validation(argv):
        calls.append(argv)
        out = tmp_path / argv[argv.index("--out") + 1].split("/")[-1]
        out.mkdir(parents=True, exist_ok=True)
        i = len(calls)
        rows = [_row(KEY_A, 0, 1.0 + 0.1 * i, 1.0), _row(KEY_B, 0, 2.0, 2.0 + 0.1 * i)]
        pd.DataFrame(rows).drop(columns="repeat").to_csv(out / "validation.csv", index=False)
        return 0

    monkeypatch.setattr(validation, "main", fake_validation)
    assert repeatability.main(["--times", "3", "--out", str(tmp_path), "--prefix", "sstbr"]) == 0
    assert calls == [["--quick", "--out", str(tmp_path / f"repeat-{i}"), "--prefix", "sstbr"] for i in (1, 2, 3)]
    repeats = pd.read_csv(tmp_path / "repeats.csv")
    assert sorted(repeats["repeat"].unique()) == [1, 2, 3] and len(repeats) == 6
    table = pd.read_csv(tmp_path / "repeatability.csv")
    assert list(table.columns) == list(repeatability.COLUMNS) and len(table) == 2
    assert (tmp_path / "repeatability.png").stat().st_size > 5_000
    assert "measured step time repeats within" in capsys.readouterr().out


def test_a_failing_validation_stops_the_study_with_its_exit_code(tmp_path, monkeypatch):
    monkeypatch.setattr(validation, "main", lambda argv: 3)
    assert repeatability.main(["--times", "2", "--out", str(tmp_path), "--full"]) == 3
    assert not (tmp_path / "repeats.csv").exists()


@pytest.mark.parametrize("argv,message", [(["--times", "1"], "--times"), (["--times", "x"], "--times")])
def test_bad_options_are_refused_naming_them(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        repeatability.main(argv + ["--out", str(tmp_path)])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
