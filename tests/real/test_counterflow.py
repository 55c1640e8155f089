"""real.testbed.counterflow: one transfer at a server's host timed while others cross it the other way."""

from __future__ import annotations

import pytest

from real.testbed.counterflow import Crossing, main, measure


def test_the_stretch_is_each_condition_s_mean_over_the_mean_with_none_the_other_way():
    crossing = Crossing("1Gbit/s", 1000, {"reply": [[1.0, 3.0], [3.0, 3.0], [6.0, 2.0]],
                                           "push": [[2.0, 2.0], [2.0, 2.0], [3.0, 3.0]]})
    assert crossing.stretches("reply") == pytest.approx([1.0, 1.5, 2.0])
    assert crossing.stretches("push") == pytest.approx([1.0, 1.0, 1.5])
    assert crossing.line("reply") == ("1Gbit/s, 1,000 B: a reply with 0-2 pushes coming in took 2000.0 / 3000.0 / "
                                      "4000.0 ms (means of 2), stretch 1.00 / 1.50 / 2.00")
    assert "a push with 0-2 replies going out" in crossing.line("push")


@pytest.mark.parametrize("argv, message", [
    (["--others", "0"], "--others must be between 1 and 6, got 0"),
    (["--others", "7"], "--others must be between 1 and 6, got 7"),
    (["--repeats", "0"], "--repeats must be between 1 and 1,000, got 0"),
    (["--rates", "fast"], "--rates"),
    (["--rates", "0"], "--rates '0': TestbedConfig.bandwidth must be at least 1kbit/s"),
    (["--sizes", "2"], "--sizes must be at least 4 bytes each, got 2"),
    (["--sizes", ","], "--rates and --sizes must each name at least one value"),
])
def test_the_command_refuses_bad_input_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.testbed
def test_a_transfer_with_nothing_the_other_way_takes_the_shaper_s_time_for_its_bytes():
    # Basis: a tbf shaper passes one bucket at once and the rest at its rate, so a 400 kB message at
    # 200 Mbit/s (25 MB/s, a 25 kB bucket) takes about (400 - 25) kB / 25 MB/s = 15 ms plus TCP's and gloo's
    # own few hundred microseconds: each direction alone within 12-20 ms. One list per number of flows the
    # other way (0-2), one timing per trial.
    crossing = measure("200Mbit/s", 400_000, others=2, repeats=2, prefix="sstbcft")
    for direction in ("reply", "push"):
        assert [len(times) for times in crossing.times[direction]] == [2, 2, 2]
        assert all(12e-3 < t < 20e-3 for t in crossing.times[direction][0])
