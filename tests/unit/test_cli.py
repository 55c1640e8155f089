"""The ``syncsim`` command line: answers, files, exit codes."""

import json
import subprocess
import sys

import pytest

from syncsim.cli import main

BASE = ["--cluster", "a100-100g", "--gpus", "16", "--workload", "resnet50", "--steps", "20"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_prints_the_headline_figures(capsys):
    code, out, err = run(capsys, "simulate", *BASE, "--scheme", "allreduce")
    assert code == 0 and err == ""
    for word in ("step time", "throughput", "speedup", "staleness", "collectives"):
        assert word in out


def test_simulate_json_matches_the_python_api(capsys):
    from syncsim import Cluster, Workload, simulate

    code, out, _ = run(capsys, "simulate", *BASE, "--scheme", "ps:staleness=2", "--json")
    row = json.loads(out)
    expected = simulate(Cluster.preset("a100-100g", gpus=16, servers=2), Workload.preset("resnet50"),
                        "ps:staleness=2", steps=20)
    assert code == 0 and row["servers"] == 2 and row["servers_added"] is True
    assert row["step_time"] == pytest.approx(expected.step_time)
    assert row["max_staleness"] == int(expected.updates["staleness"].max()) > 0


def test_compare_target_and_trace(capsys, tmp_path):
    code, out, _ = run(capsys, "compare", *BASE, "--scheme", "allreduce", "--scheme", "ps:mode=async",
                       "--target", "accuracy=0.5", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["scheme"] for r in rows] == ["allreduce", "ps:mode=async"]
    assert all(r["target"] == "accuracy=0.5" and r["time_to_target"] > 0 for r in rows)
    trace = tmp_path / "t.json"
    code, out, _ = run(capsys, "simulate", *BASE, "--scheme", "allreduce", "--trace", str(trace))
    assert code == 0 and json.loads(trace.read_text())["traceEvents"]


def test_cluster_and_workload_files(capsys, tmp_path):
    cluster = tmp_path / "c.toml"
    cluster.write_text('nodes = 2\ngpus_per_node = 4\nnics_per_node = 2\n'
                       'intra = { bandwidth = "100GB/s", latency = "2us" }\n'
                       'inter = { bandwidth = "25Gbit/s", latency = "10us" }\n')
    workload = tmp_path / "w.toml"
    workload.write_text('[workload]\nparam_bytes = "100MiB"\ncompute_time = "50ms"\nbatch_size = 32\n')
    code, out, _ = run(capsys, "simulate", "--cluster", str(cluster), "--workload", str(workload),
                       "--scheme", "allreduce", "--json")
    row = json.loads(out)
    assert code == 0 and (row["gpus"], row["batch_size"]) == (8, 32)


def test_presets_list_every_preset_with_a_source(capsys):
    from syncsim.cluster import CLUSTER_PRESETS
    from syncsim.workload import WORKLOAD_PRESETS

    code, out, _ = run(capsys, "presets", "--json")
    listed = json.loads(out)
    assert code == 0 and set(listed["clusters"]) == set(CLUSTER_PRESETS)
    assert set(listed["workloads"]) == set(WORKLOAD_PRESETS)
    assert all(len(note) > 20 for note in listed["clusters"].values())


@pytest.mark.parametrize("argv, words", [
    (["simulate", *BASE, "--scheme", "allreduce:algorithm=butterfly"], "algorithm"),
    (["simulate", *BASE, "--scheme", "allreduce", "--steps", "0"], "--steps"),
    (["simulate", "--cluster", "tpu", "--workload", "resnet50", "--scheme", "ps"], "--cluster 'tpu'"),
    (["simulate", *BASE, "--scheme", "allreduce", "--target", "accuracy=2"], "--target"),
    (["simulate", *BASE, "--scheme", "allreduce", "--target", "bleu=3"], "--target"),
    (["simulate", *BASE, "--scheme", "allreduce", "--trace", "/no/such/folder/t.json"], "does not exist"),
    (["compare", *BASE, "--scheme", "allreduce", "--scheme", "ps:mode=sometimes"], "mode"),
    (["simulate", *BASE, "--scheme", "allreduce", "--servers", "-1"], "--servers"),
    (["simulate", "--cluster", "/no/such.toml", "--workload", "resnet50", "--scheme", "ps"], "cannot read"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and words in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_module_entry_point_and_help():
    proc = subprocess.run([sys.executable, "-m", "syncsim", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "exit codes" in proc.stdout and "syncsim simulate" in proc.stdout
