"""The sweep runner: cache and resume, parallel processes, and a real Dask cluster giving the same CSV."""

from dataclasses import dataclass

import pandas as pd
import pytest

from studies import sweep


@dataclass(frozen=True)
class Point:
    x: int
    label: str = "a"


def square(point: Point) -> dict:
    return {"x": point.x, "y": point.x**2, "label": point.label}


def frame(point: Point) -> dict:
    return {"curve": pd.DataFrame({"t": [0.0, 1.0], "v": [point.x, point.x + 0.5]}), "inf": float("inf")}


CALLS: list[int] = []
FAIL_FROM = {"x": 2}


def interruptible(point: Point) -> dict:
    """square, but 'interrupted' at x >= FAIL_FROM["x"]; records what it computed."""
    if point.x >= FAIL_FROM["x"]:
        raise RuntimeError("interrupted")
    CALLS.append(point.x)
    return square(point)


def must_not_run(point: Point) -> dict:
    raise AssertionError("a cached configuration was computed again")


def test_results_in_order_and_a_rerun_computes_nothing(tmp_path):
    points = [Point(x) for x in range(6)]
    first = sweep.run(square, points, study="s", out=tmp_path, jobs=2)
    assert first == [square(p) for p in points]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 6
    # same study, same function name, same code: served from the cache, the function never runs
    must_not_run.__qualname__, must_not_run.__module__ = square.__qualname__, square.__module__
    try:
        assert sweep.run(must_not_run, points, study="s", out=tmp_path, jobs=1) == first
    finally:
        must_not_run.__qualname__ = "must_not_run"


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path):
    points = [Point(x) for x in range(4)]
    CALLS.clear()
    with pytest.raises(RuntimeError, match="interrupted"):
        sweep.run(interruptible, points, study="r", out=tmp_path, jobs=1)
    assert CALLS == [0, 1] and len(list((tmp_path / "cache").glob("*.json"))) == 2
    FAIL_FROM["x"] = 99  # the cause is gone: the rerun computes only what was not finished
    try:
        results = sweep.run(interruptible, points, study="r", out=tmp_path, jobs=1)
    finally:
        FAIL_FROM["x"] = 2
    assert CALLS == [0, 1, 2, 3] and [r["y"] for r in results] == [0, 1, 4, 9]


def test_keys_follow_fields_function_and_code():
    assert sweep.config_key("s", Point(1)) != sweep.config_key("s", Point(2))
    assert sweep.config_key("s", Point(1)) != sweep.config_key("t", Point(1))
    assert sweep.config_key("s", Point(1), square) != sweep.config_key("s", Point(1), frame)
    assert sweep.config_key("s", Point(1, "a")) == sweep.config_key("s", Point(1, "a"))
    assert sweep.code_version().startswith(__import__("syncsim").__version__ + "+")


def test_frames_and_infinities_survive_the_cache(tmp_path):
    sweep.run(frame, [Point(3)], study="f", out=tmp_path)
    cached = sweep.run(frame, [Point(3)], study="f", out=tmp_path)[0]
    pd.testing.assert_frame_equal(cached["curve"], frame(Point(3))["curve"])
    assert cached["inf"] == float("inf")


def test_no_scheduler_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no Dask scheduler answers"):
        sweep.run(square, [Point(1)], study="d", out=tmp_path, scheduler="tcp://127.0.0.1:9")


@pytest.mark.slow
def test_dask_cluster_gives_the_local_csv(tmp_path):
    import distributed  # in the dev extra: the Dask path is tested, not skipped

    from studies import scaling

    assert scaling.main(["--quick", "--jobs", "1", "--out", str(tmp_path / "local")]) == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        assert scaling.main(["--quick", "--scheduler", c.scheduler_address, "--out", str(tmp_path / "dask")]) == 0
    local = pd.read_csv(tmp_path / "local" / "scaling.csv")
    remote = pd.read_csv(tmp_path / "dask" / "scaling.csv")
    assert len(local) == len(scaling.quick().runs()) == 64  # 48 small-model runs and 16 of the large model
    pd.testing.assert_frame_equal(local, remote)
