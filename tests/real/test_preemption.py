"""real.testbed.preemption: a training step timed while saturating flows cross the testbed's shapers."""

from __future__ import annotations

import pytest

from real.testbed.preemption import StepTiming, _carried, main, tail_share, time_beside_busy, time_under_traffic


def test_tail_share_counts_steps_over_four_times_the_median():
    # median 1.0; 4.0 is not over four times it, 4.1 and 10 are: 2 of 7
    assert tail_share([1.0, 0.9, 1.0, 4.0, 4.1, 1.0, 10.0]) == pytest.approx(2 / 7)
    assert tail_share([1.0] * 5) == 0.0


def test_carried_is_the_bytes_a_sink_logged_inside_the_timing_over_its_time():
    # Logged (time, bytes so far); inside [10, 12]: 10.0 -> 1,000 B and 12.0 -> 5,000 B: 2,000 B/s.
    log = [[9.0, 0], [10.0, 1000], [11.0, 3000], [12.0, 5000], [13.0, 90000]]
    assert _carried(log, 10.0, 12.0) == pytest.approx(2000.0)
    assert _carried(log, 10.5, 10.9) == 0.0  # no two entries inside: nothing to tell


def test_the_line_names_the_rate_and_what_the_flows_carried():
    timing = StepTiming("200Mbit/s", (1e-3,) * 9 + (5e-3,), 4.5e7)
    assert timing.line() == ("200Mbit/s: 10 steps, median 1.000 ms, p99 4.64 ms, max 5.0 ms, over 4x the median "
                             "10.00%, the flows carried 360 Mbit/s")
    assert StepTiming("no traffic", (1e-3,) * 4).line() == ("no traffic: 4 steps, median 1.000 ms, p99 1.00 ms, "
                                                            "max 1.0 ms, over 4x the median 0.00%")


def test_busy_processes_run_beside_the_timed_step_and_are_gone_after(monkeypatch):
    # The busy processes are started before the timer and killed after it, whatever the timer does.
    import subprocess

    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    timing = time_beside_busy(2, 2.0)
    assert timing.label == "2 busy processes beside it" and len(timing.step_times) > 50
    assert timing.carried is None
    busy = [p for p in started if p.args[-1] == "_busy"]
    assert len(busy) == 2 and all(p.returncode is not None for p in busy)


@pytest.mark.parametrize("argv, message", [
    (["--seconds", "1"], "--seconds must be between 2 and 600, got 1"),
    (["--rates", "fast"], "--rates"),
    (["--rates", "0"], "--rates '0': TestbedConfig.bandwidth must be at least 1kbit/s"),
    (["--competitors", "1,9"], "--competitors must be between 0 and 8, got 9"),
    (["--competitors", "two"], "--competitors: not an integer: 'two'"),
])
def test_the_command_refuses_bad_input_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.testbed
def test_steps_are_timed_while_both_flows_fill_their_shapers():
    # Basis: a tbf shaper passes at most its rate (plus one bucket), so the two flows together carry at
    # most twice the link's 6.25 MB/s; sending without pause, they reach most of it within a second or
    # two (over 12 s they carried 93 % of it here, over 2 s 69 %), so over 3 s at least half.
    timing = time_under_traffic("50Mbit/s", 3.0, prefix="sstbpre")
    assert len(timing.step_times) > 100
    assert 0.5 * 2 * 6.25e6 < timing.carried < 1.05 * 2 * 6.25e6
