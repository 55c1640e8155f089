"""real.testbed.steadiness: the machine's own speed, timed in windows, and how it changes with a lag."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from real.testbed.steadiness import Steadiness, main, measure_steadiness, relative_changes


def test_relative_changes_closed_form():
    # |t[i+lag]/t[i] - 1| by hand: 2/1, 1/2, 2/1 less one at lag 1; equal pairs at lag 2
    assert relative_changes([1.0, 2.0, 1.0, 2.0], 1).tolist() == [1.0, 0.5, 1.0]
    assert relative_changes([1.0, 2.0, 1.0, 2.0], 2).tolist() == [0.0, 0.0]
    assert len(relative_changes([1.0, 2.0], 2)) == 0  # no pair that far apart
    with pytest.raises(ValueError, match="lag"):
        relative_changes([1.0, 2.0], 0)


@given(st.lists(st.floats(1e-4, 1e-2), min_size=2, max_size=40), st.floats(0.5, 2.0), st.integers(1, 5))
def test_changes_do_not_depend_on_the_machines_absolute_speed(times, scale, lag):
    # Invariant: a ratio of two windows' times is the same however fast the machine is overall, so a
    # machine uniformly k times slower is exactly as steady (the figures are relative by construction).
    base = relative_changes(times, lag)
    np.testing.assert_allclose(relative_changes(np.asarray(times) * scale, lag), base, rtol=1e-9, atol=1e-12)


@given(st.floats(1e-4, 1e-2), st.integers(2, 30))
def test_a_steady_machine_changes_by_nothing(time, windows):
    steady = Steadiness("mlp", 32, 1.0, (time,) * windows)
    assert steady.spread == pytest.approx(0.0, abs=1e-12)
    change = steady.change(1.0)
    assert change["median"] == pytest.approx(0.0, abs=1e-12) and change["over_15"] == 0.0


def test_a_slow_spell_shows_in_the_spread_and_the_lagged_change():
    # Ten 1-s windows at 1 ms, a 3-s spell at 1.5 ms (windows 4-6): 50 % apart. The five pairs 5 s
    # apart, by hand: (0,5) and (1,6) into the spell +50 %, (4,9) out of it 1/1.5 - 1 = -33 %,
    # (2,7) and (3,8) outside it 0: median 33 %, max 50 %, three of five over 15 %.
    times = (1e-3,) * 4 + (1.5e-3,) * 3 + (1e-3,) * 3
    steady = Steadiness("mlp", 32, 1.0, times)
    assert steady.spread == pytest.approx(0.5)
    assert steady.lag_windows(5.0) == 5
    np.testing.assert_allclose(relative_changes(times, 5), [0.5, 0.5, 0.0, 0.0, 1 / 3])
    change = steady.change(5.0)
    assert change["median"] == pytest.approx(1 / 3) and change["max"] == pytest.approx(0.5)
    assert change["over_15"] == pytest.approx(0.6)
    line = steady.line(5.0)
    assert "1.00-1.50 ms (50% apart)" in line and "5 s later" in line


def test_windows_round_the_lag():
    assert Steadiness("mlp", 32, 2.0, (1.0, 1.0)).lag_windows(5.0) == 2  # 5 s is 2.5 windows: 2 (even)
    assert Steadiness("mlp", 32, 2.0, (1.0, 1.0)).lag_windows(0.1) == 1  # never less than one window


@pytest.mark.parametrize("window,times", [(0.0, (1.0, 1.0)), (-1.0, (1.0, 1.0)), (1.0, (1.0,)),
                                          (1.0, (1.0, 0.0)), (1.0, (1.0, math.nan))])
def test_bad_steadiness_is_refused(window, times):
    with pytest.raises(ValueError, match="Steadiness"):
        Steadiness("mlp", 32, window, times)


def test_json_round_trip():
    steady = Steadiness("lenet", 64, 0.5, (1e-3, 2e-3, 1.5e-3))
    assert Steadiness.from_json(steady.to_json()) == steady


def test_measure_times_real_windows_and_restores_threads():
    threads = torch.get_num_threads()
    seen = []
    steady = measure_steadiness("mlp", 8, seconds=1.0, window=0.25, progress=seen.append)
    assert len(steady.step_times) == 4 and list(steady.step_times) == seen
    assert all(0 < t < 0.25 for t in steady.step_times)  # a window holds at least one step
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("kwargs,named", [({"model": "resnet"}, "model"), ({"batch_size": 0}, "batch_size"),
                                          ({"window": 0.0}, "window"), ({"window": 1.0, "seconds": 1.0}, "window")])
def test_measure_refuses_bad_arguments(kwargs, named):
    with pytest.raises(ValueError, match=named):
        measure_steadiness(**kwargs)


def test_command_line_writes_the_windows(tmp_path, capsys):
    out = tmp_path / "steadiness.json"
    assert main(["--seconds", "2", "--window", "0.5", "--lag", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "mlp" and len(data["step_times"]) == 4
    assert "1 s later its speed had changed by a median" in capsys.readouterr().out
