"""real.testbed.counterflow: one transfer at a server's host timed while others cross it the other way."""

from __future__ import annotations

import math
import statistics

import pytest

from real.testbed.counterflow import LEAD, Crossing, main, measure, predicted_reply


def test_the_stretch_is_each_condition_s_mean_over_the_mean_with_none_the_other_way():
    crossing = Crossing("1Gbit/s", 1000, {"reply": [[1.0, 3.0], [3.0, 3.0], [6.0, 2.0]],
                                           "push": [[2.0, 2.0], [2.0, 2.0], [3.0, 3.0]]})
    assert crossing.stretches("reply") == pytest.approx([1.0, 1.5, 2.0])
    assert crossing.stretches("push") == pytest.approx([1.0, 1.0, 1.5])
    assert crossing.line("reply") == ("1Gbit/s, 1,000 B: a reply with 0-2 pushes coming in took 2000.0 / 3000.0 / "
                                      "4000.0 ms (means of 2), stretch 1.00 / 1.50 / 2.00")
    assert "a push with 0-2 replies going out" in crossing.line("push")


# Basis: syncsim's price of the trial (Link.window: a reply sends its window W per queueing delay of the pushes
# it waits behind). Two pushes of n bytes start at 0, each sent at the link's rate B, the reply LEAD = L
# later; each push queues B/2 a second until it holds W, so the queue is B·t until t = 2W/B, 2W until the
# pushes' last W bytes go (each at B/2), then drains to 0 as they end at 2T (T = n/B). With B·L/2 <= W <=
# B·L the reply starts with the cap W/t binding: it sends W·ln(2W/BL) until 2W/B, B/2 over the plateau,
# W·ln 2 while the queue drains to W, then W at B; what is left after 2T, W(1 - ln(4W/BL)), at B. At
# W = B·L/2 its time is 2T - L + W(1 - ln 2)/B: a stretch of 2 - (L/T)(1 + ln 2)/2. One push (a sender no
# faster than the link) or none queues nothing; started T apart, the pushes never queue.
def test_the_simulator_prices_the_trial_s_reply_by_its_window_per_queueing_delay():
    rate, size = 125e6, 1_724_320
    lone = size / rate
    together = Crossing("1Gbit/s", size, {"reply": [[lone]] * 3, "push": [[lone]] * 3})
    window = rate * LEAD / 2
    x = LEAD / lone
    assert together.predicted(window) == pytest.approx([1.0, 1.0, 2 - x * (1 + math.log(2)) / 2], rel=1e-9)
    assert together.predicted(0.0) == pytest.approx([1.0, 1.0, 1.0], rel=1e-9)
    assert predicted_reply(rate, size, 2, lone, window) == pytest.approx(lone, rel=1e-9)
    staggered = Crossing("1Gbit/s", size, together.times, stagger=5e-3)
    assert staggered.line("reply", window).startswith("1Gbit/s, 1,724,320 B: a reply with 0-2 pushes coming in "
                                                      "started 5 ms apart took 13.8 / 13.8 / 13.8 ms")
    priced = f"; syncsim (Link.window 62 kB) 1.00 / 1.00 / {staggered.predicted(window)[2]:.2f}"
    assert staggered.line("reply", window).endswith(priced)
    assert "syncsim" not in staggered.line("push", window)


# Basis: the same window, two replies timed together (until both are in). Each gets B/2 of the outgoing link
# while both go, and its window over the queue of two pushes' windows, 2W/B, lets it send B/2 too: the pair
# loses nothing to two pushes (on the testbed they stretched it 1.06 times, one reply 1.70; docs/log.md).
def test_two_replies_timed_together_lose_nothing_to_two_pushes():
    rate, size = 125e6, 1_724_320
    lone = size / rate
    pair = Crossing("1Gbit/s", size, {"reply": [[2 * lone]] * 3, "push": [[2 * lone]] * 3}, timed=2)
    assert pair.predicted(rate * LEAD / 2) == pytest.approx([1.0, 1.0, 1.0], rel=1e-9)
    assert pair.predicted(rate * LEAD / 2) != pytest.approx(
        Crossing("1Gbit/s", size, pair.times).predicted(rate * LEAD / 2), rel=1e-3)  # one reply does lose
    assert pair.line("reply").startswith("1Gbit/s, 1,724,320 B: 2 replies together with 0-2 pushes coming in took")
    assert pair.line("push").startswith("1Gbit/s, 1,724,320 B: 2 pushes together with 0-2 replies going out took")


@pytest.mark.parametrize("argv, message", [
    (["--others", "0"], "--others must be between 1 and 6, got 0"),
    (["--others", "7"], "--others must be between 1 and 6, got 7"),
    (["--repeats", "0"], "--repeats must be between 1 and 1,000, got 0"),
    (["--rates", "fast"], "--rates"),
    (["--rates", "0"], "--rates '0': TestbedConfig.bandwidth must be at least 1kbit/s"),
    (["--sizes", "2"], "--sizes must be at least 4 bytes each, got 2"),
    (["--sizes", ","], "--rates and --sizes must each name at least one value"),
    (["--stagger", "2s"], "--stagger times must each be 0 to 1000 ms, got 2000 ms"),
    (["--stagger", ","], "--stagger must name at least one time"),
    (["--timed", "0"], "--timed must be between 1 and 3, got 0"),
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
    # other way (0-2), one timing per trial; the median of three, since one trial in a full suite on this
    # machine's two cores can meet one of its stalls (docs/real.md, "The machine's own steadiness").
    crossing = measure("200Mbit/s", 400_000, others=2, repeats=3, prefix="sstbcft")
    for direction in ("reply", "push"):
        assert [len(times) for times in crossing.times[direction]] == [3, 3, 3]
        assert 12e-3 < statistics.median(crossing.times[direction][0]) < 20e-3


@pytest.mark.testbed
def test_two_transfers_timed_together_take_the_shaper_s_time_for_both():
    # Basis: as above, two 400 kB messages through one 200 Mbit/s shaper (the server's, out or in) take
    # about (800 - 25) kB / 25 MB/s = 31 ms: each direction's pair alone within 27-40 ms, timed until both
    # are in (a single one would take half).
    crossing = measure("200Mbit/s", 400_000, others=1, repeats=3, prefix="sstbcft", timed=2)
    for direction in ("reply", "push"):
        assert [len(times) for times in crossing.times[direction]] == [3, 3]
        assert 27e-3 < statistics.median(crossing.times[direction][0]) < 40e-3
