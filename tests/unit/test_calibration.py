"""real.calibration: the cache (a probe's result measured once per SCHEMA_VERSION), the ranks' command line, and
fits that import no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from real.calibration import compute_probe
from real.calibration.cache import SCHEMA_VERSION, cached, slug, store
from real.calibration.compute_fit import worker_work
from real.calibration.ranks import main as ranks_main

RESULT = {"compute_time": 2e-3, "meets": 45}


def _counting(result: dict):
    calls = []

    def measure() -> dict:
        calls.append(1)
        return result

    return measure, calls


def test_a_result_is_measured_once_and_kept_with_its_schema_version(tmp_path):
    path = tmp_path / "probe.json"
    measure, calls = _counting(RESULT)
    assert cached(path, measure) == RESULT and cached(path, measure) == RESULT
    assert len(calls) == 1
    assert json.loads(path.read_text()) == {"schema_version": SCHEMA_VERSION, "result": RESULT}


@pytest.mark.parametrize("kept", [RESULT, {"schema_version": SCHEMA_VERSION - 1, "result": RESULT},
                                  {"schema_version": SCHEMA_VERSION + 1, "result": RESULT}, [1, 2]])
def test_a_file_of_another_schema_version_is_measured_again(tmp_path, kept):
    # a file without a version (as the cache wrote before it kept one) or of another version may lack what
    # this code records, or have measured it differently
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(kept))
    fresh = RESULT | {"compute_time": 3e-3}
    measure, calls = _counting(fresh)
    assert cached(path, measure) == fresh and len(calls) == 1
    assert cached(path, measure) == fresh and len(calls) == 1  # now of this version: kept


def test_store_replaces_a_cached_result(tmp_path):
    path = tmp_path / "link.json"
    store(path, RESULT)
    assert cached(path, lambda: pytest.fail("measured although cached")) == RESULT
    assert slug("200Mbit/s") == "200Mbit-s" and slug("ps:mode=async") == "ps-mode-async"


def test_a_compute_probe_is_forked_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    started = []

    def fork_local(processes, module, argv, log_dir, timeout):
        started.append((processes, module))
        Path(argv[1]).write_text(json.dumps(RESULT))
        return [0] * processes

    monkeypatch.setattr("real.testbed.launcher.fork_local", fork_local)
    assert compute_probe.measure_scheme_compute("mlp", 32, 2, tmp_path) == RESULT
    assert compute_probe.measure_scheme_compute("mlp", 32, 2, tmp_path) == RESULT
    assert started == [(2, "real.calibration")]
    name = f"compute-mlp-b32-p2-{worker_work('allreduce')}.json"
    assert json.loads((tmp_path / name).read_text())["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("argv, option", [
    (["--server", "s.json", "--precision", "fp8"], "--precision"),
    (["--server", "s.json", "--size", "0"], "--size"),
    (["--sharing", "s.json", "--size", "2"], "--size"),
    (["--machine", "m.json", "--powersgd-rank", "0"], "--powersgd-rank"),
    (["--probe", "p.json", "--at", "3:fp16"], "--at"),
    (["--probe", "p.json", "--compute", "c.json"], "--compute"),
])
def test_the_ranks_command_line_names_the_bad_option(argv, option, capsys, monkeypatch):
    for name in ("link_probe.link_rank", "compute_probe.compute_rank", "sharing_probe.sharing_rank",
                 "server_probe.server_rank", "machine_probe.machine_rank"):
        monkeypatch.setattr(f"real.calibration.{name}", lambda *a, **k: pytest.fail("a probe ran on bad input"))
    with pytest.raises(SystemExit) as exit_:
        ranks_main(argv)
    assert exit_.value.code == 2 and option in capsys.readouterr().err


def test_the_ranks_command_line_starts_the_probe_it_names(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr("real.calibration.server_probe.server_rank", lambda *a: ran.append(("server", a)))
    monkeypatch.setattr("real.calibration.machine_probe.machine_rank", lambda *a, **k: ran.append(("machine", a, k)))
    out = str(tmp_path / "out.json")
    assert ranks_main(["--server", out, "--size", "407080", "--precision", "fp16", "--repeats", "3"]) == 0
    assert ranks_main(["--machine", out, "--model", "mlp", "--powersgd-rank", "2"]) == 0
    assert ran == [("server", (out, 407080, "fp16", 3, 0.0)), ("machine", (out, 5, "mlp", 32), {"powersgd_rank": 2})]


def test_the_pure_fits_import_neither_torch_nor_the_testbed():
    # they run wherever the simulator does (a study's fit, a unit test), on timings a probe wrote earlier
    modules = ["fits", "link_fit", "sharing_fit", "server_fit", "compute_fit", "messages", "cache"]
    code = ("import sys\n" + "".join(f"import real.calibration.{m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('real.testbed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("scheme, processes, together", [
    ("fsdp", 2, True), ("zero:stage=3", 4, True), ("zero:stage=2", 2, True), ("fsdp:reshard=false", 2, True),
    ("fsdp", 1, False), ("zero:stage=1", 2, False), ("allreduce", 2, False), ("ps", 2, False),
    ("localsgd:period=4", 2, False)])
def test_only_schemes_that_shard_their_gradients_are_probed_on_one_group(scheme, processes, together):
    # FSDP2 (gradients sharded) skips its collectives and the work around them on a one-rank group, so its
    # probe runs the ranks together; ZeRO-1's ZeroRedundancyOptimizer and every other scheme keep a group each
    from real.calibration.compute_probe import probed_together
    from syncsim.schemes import parse

    assert probed_together(parse(scheme), processes) is together


def test_a_step_is_timed_less_the_collective_calls_within_it():
    # each span counts for the part of it inside the window: a collective begun before the window, or one
    # running past its end, only for its overlap
    from real.calibration.compute_probe import within

    spans = [(1.0, 1.25), (2.0, 2.5), (3.0, 4.0)]
    assert within(spans, 0.0, 10.0) == pytest.approx(1.75)
    assert within(spans, 1.1, 2.25) == pytest.approx(0.15 + 0.25)
    assert within(spans, 2.5, 3.0) == 0.0 and within([], 0.0, 1.0) == 0.0
    # spans that overlap count once (their union), in any order: 1.0-1.5 and 1.25-2.0 cover 1.0 s
    assert within([(1.25, 2.0), (1.0, 1.5)], 0.0, 10.0) == pytest.approx(1.0)
    assert within([(1.25, 2.0), (1.0, 1.5)], 1.4, 1.6) == pytest.approx(0.2)
