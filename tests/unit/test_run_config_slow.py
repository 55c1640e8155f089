"""``--slow RANK:FACTOR[:FORWARD]``: what a run's straggler is told, read back exactly by its ranks."""

from __future__ import annotations

import dataclasses

import pytest

from real.config import Failure, RunConfig, Slowdown


def test_a_slowed_rank_keeps_its_forward_through_the_command_line(tmp_path):
    # the launcher writes the options back (to_argv) and every rank parses them (from_argv): the forward a
    # calibration timed must reach the rank exactly, or the run sleeps other than its prediction assumed
    cfg = RunConfig(world=3, model="mlp", out=str(tmp_path), slow="2:3:0.0041234567890123,0:1.5")
    again = RunConfig.from_argv(cfg.to_argv())
    assert again == cfg
    assert (again.slow_factor(2), again.slow_forward(2)) == (3.0, 0.0041234567890123)
    assert (again.slow_factor(0), again.slow_forward(0)) == (1.5, None)  # sized from its own warm forward
    assert (again.slow_factor(1), again.slow_forward(1)) == (1.0, None)  # not slowed


@pytest.mark.parametrize("slow,named", [
    ("1:2,1:3", "slowed twice"),
    ("2:2:0.004", "is a server"),  # rank 2 of 2 workers + 1 server: a server runs no forward
])
def test_a_slow_option_that_cannot_be_carried_out_is_refused_by_name(tmp_path, slow, named):
    with pytest.raises(ValueError, match=named) as refused:
        RunConfig(scheme="ps", world=2, servers=1, model="mlp", out=str(tmp_path), slow=slow)
    assert "RunConfig.slow" in str(refused.value)


def test_a_rank_told_to_fail_twice_is_refused_by_name(tmp_path):
    # a rank fails once: given two entries it would follow the first and silently drop the second
    with pytest.raises(ValueError, match="named twice") as refused:
        RunConfig(world=3, model="mlp", steps=10, out=str(tmp_path), fail="1:5,1:7:hang")
    assert "RunConfig.fail" in str(refused.value)
    cfg = RunConfig(world=3, model="mlp", steps=10, out=str(tmp_path), fail="1:5,2:7:hang")
    assert (cfg.failure(1), cfg.failure(2)) == ((5, "crash"), (7, "hang"))


def test_slow_and_fail_entries_read_by_name_are_kept_as_given(tmp_path):
    # the named records are a view: the stored entries (what to_argv writes and summary.json records via
    # dataclasses.asdict) keep the fields given, two or three
    cfg = RunConfig(world=3, model="mlp", steps=10, out=str(tmp_path), slow="2:3:0.25,0:1.5", fail="1:5,2:7:hang")
    assert cfg.slowdowns == (Slowdown(2, 3.0, 0.25), Slowdown(0, 1.5, None))
    assert cfg.failures == (Failure(1, 5, "crash"), Failure(2, 7, "hang"))
    assert cfg.slow == ((2, 3.0, 0.25), (0, 1.5)) and cfg.fail == ((1, 5), (2, 7, "hang"))
    assert dataclasses.asdict(cfg)["slow"] == ((2, 3.0, 0.25), (0, 1.5))
    assert cfg.to_argv()[cfg.to_argv().index("--slow") + 1] == "2:3.0:0.25,0:1.5"
    assert cfg.to_argv()[cfg.to_argv().index("--fail") + 1] == "1:5,2:7:hang"
