import json

import pandas as pd
import pytest

from studies import scaling
from syncsim import Cluster, Link, Workload, simulate, speedup


@pytest.mark.slow
def test_scaling_quick_writes_csv_figures_and_trace(tmp_path, capsys):
    assert scaling.main(["--quick", "--out", str(tmp_path), "--jobs", "1"]) == 0
    data = pd.read_csv(tmp_path / "scaling.csv")
    study = scaling.quick()
    assert len(data) == len(study.runs())
    # tidy: one row per configuration, spec fields as columns
    assert not data.duplicated(["cluster", "workload", "scheme", "gpus"]).any()
    assert {"scheme.precision", "scheme.period", "speedup", "efficiency", "step_time"} <= set(data.columns)
    for figure in ("scaling.png", "efficiency.png"):
        assert (tmp_path / figure).stat().st_size > 10_000
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"compute", "push", "pull", "wait"}
    out = capsys.readouterr().out
    assert "speedup at 64 GPUs" in out
    # the large model on the sharded schemes, with its memory per GPU: data parallelism does not fit, FSDP does
    large = data[data["workload"] == "llama2-7b"]
    assert len(large) == len(study.clusters) * len(study.sharded_schemes) * len(study.gpus)
    assert (large["memory_per_gpu"] > 0).all() and large["memory_complete"].all()
    assert not large.loc[large["scheme"] == "allreduce:precision=bf16", "fits"].astype(bool).any()
    assert large.loc[(large["scheme"] == "fsdp:precision=bf16") & (large["gpus"] >= 4), "fits"].astype(bool).all()
    assert "large model, sharded schemes" in out and "119.7 GiB!" in out


def test_scaling_table_gives_the_large_models_memory_and_marks_what_does_not_fit():
    study = scaling.Study(gpus=(8,), steps=4, workloads=(), schemes=(), replay_gpus=0, clusters=("h100-400g",))
    rows = pd.DataFrame([scaling.simulate_run(run) for run in study.runs()])
    lines = scaling.table(rows, study).splitlines()
    by_scheme = {next(t for t in line.split() if t in study.sharded_schemes): line for line in lines if " x, " in line}
    # state per GPU: 16 bytes per parameter for data parallelism (119.7 GiB), 16/8 sharded over 8 GPUs plus the
    # gathered units and the 19.3 GiB of activations for FSDP
    assert by_scheme["allreduce:precision=bf16"].endswith("119.7 GiB!")
    assert by_scheme["fsdp:precision=bf16"].endswith("33.0 GiB")
    assert "zero:stage=1,precision=bf16" in by_scheme  # spelt as the study names it, not canonically ("zero:...")


def test_scaling_rejects_bad_jobs(capsys):
    with pytest.raises(SystemExit):
        scaling.main(["--jobs", "0"])
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_chrome_trace_is_valid_json(tmp_path):
    res = simulate(Cluster.homogeneous(4, Link("10GB/s", "1us")), Workload("10MiB", "10ms"), "allreduce", steps=3)
    path = res.to_chrome_trace(tmp_path / "t.json", max_workers=2)
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 2 * 3 * 2  # 2 workers x 3 steps x (compute, allreduce)
    assert all(e["dur"] >= 0 and e["tid"] in (0, 1) for e in spans)


def test_speedup_helper_and_single_gpu_baseline():
    workload = Workload("10MiB", "10ms", batch_size=16)
    one = simulate(Cluster.homogeneous(1, Link("10GB/s")), workload, "allreduce", steps=5)
    assert one.speedup == pytest.approx(1.0) and one.throughput == pytest.approx(1600.0)
    cluster = Cluster.homogeneous(8, Link("10GB/s", "1us"))
    assert speedup(cluster, workload, "allreduce", steps=5) == simulate(cluster, workload, "allreduce", 5).speedup


def test_speedup_is_the_function_whatever_was_imported_first():
    import importlib

    import syncsim

    for module in ("syncsim.engine", "syncsim.result", "syncsim.cluster"):
        importlib.import_module(module)
    assert callable(syncsim.speedup) and syncsim.speedup.__name__ == "speedup"


def test_summary_row_has_spec_fields():
    res = simulate(Cluster.homogeneous(2, Link("10GB/s")), Workload("1MiB", "1ms"), "localsgd:period=2", steps=4)
    row = res.summary()
    assert row["scheme"] == "localsgd:period=2" and row["scheme.period"] == 2 and row["gpus"] == 2


def test_bench_quick_prints_figures(capsys):
    from syncsim import bench

    bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "GPU-steps/s" in out and "applied updates/s" in out and "b = " in out


def test_precision_study_separates_compute_from_wire(tmp_path):
    # Basis: 16-bit on the wire halves the bytes (2 of fp32's 4 per value); autocast changes compute time,
    # not bytes; a step is never slower with fewer bytes or faster compute (same cluster, same noise draws).
    from studies import precision

    assert precision.main(["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    data = pd.read_csv(tmp_path / "precision.csv")
    key = ["cluster", "workload", "gpus", "compute"]
    wide = data.pivot_table(index=key, columns="precision", values="wire_bytes_per_step")
    assert (wide["fp16"] == wide["fp32"] / 2).all() and (wide["bf16"] == wide["fp16"]).all()
    step = data.pivot_table(index=["cluster", "workload", "gpus", "precision"], columns="compute",
                            values="step_time")
    assert (step["autocast"] < step["fp32"]).all()
    by_wire = data.pivot_table(index=key, columns="precision", values="step_time")
    assert (by_wire["fp16"] <= by_wire["fp32"] * (1 + 1e-12)).all()
    assert (tmp_path / "precision.png").exists()


def test_precision_measure_asks_the_validation_for_every_format(monkeypatch, tmp_path):
    # --measure is studies.validation over the formats, not a second runner: its arguments must parse
    # into one configuration per format and link (plus the one-worker baseline), with no straggler rows.
    from studies import precision, validation

    seen = []
    monkeypatch.setattr(validation, "main", lambda argv: seen.append(argv) or 0)
    assert precision.measure(tmp_path / "measured") == 0
    configs = validation.parse_args(seen[0]).configs
    formats = {(c.scheme, c.bandwidth) for c in configs if c.world == precision.MEASURED_WORKERS}
    assert len(formats) == len(precision.MEASURED_SCHEMES) * len(precision.MEASURED_RATES)
    assert all(c.slow == 1.0 for c in configs) and {c.world for c in configs} == {1, precision.MEASURED_WORKERS}


def test_measured_verdict_divides_fp32_by_each_format_per_link():
    from studies import precision

    rows = [("allreduce", 0.40, 0.50), ("allreduce:precision=fp16", 0.20, 0.25), ("allreduce:amp=true", 0.5, 0.8)]
    frame = pd.DataFrame([{"scheme": s, "world": 2, "bandwidth": "50Mbit/s", "link_bandwidth": 6e6,
                           "predicted_step_time": p, "measured_step_time": m, "error": ""} for s, p, m in rows])
    text = precision.measured_verdict(frame)
    assert "fp32/fp16 x2.00 (x2.00)" in text and "autocast/fp32 x0.62 (x0.80)" in text


def test_precision_measure_without_a_testbed_stops_before_any_work(monkeypatch, tmp_path, capsys):
    from studies import precision

    monkeypatch.setattr("real.testbed.unavailable", lambda: "the testbed needs root")
    out = tmp_path / "out"
    assert precision.main(["--measure", "--quick", "--out", str(out)]) == 2
    assert "--measure: the testbed needs root" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())
