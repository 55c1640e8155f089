"""syncsim against published measurements (studies.published, data in tests/data/published)."""

import json
import math
import re

import pandas as pd
import pytest

from studies.published.components import INTRA
from studies.published.dataset import DATA, HOST_STAGED, OUTSIDE, SHARDED_SCHEMES, Dataset, host_staged, load
from studies.published.predict import predict, training_rows
from studies.published.rows import simulated_steps, sync_period
from studies.published.sharded import SHARDED_WHAT, calibration_rows, sharded_rows
from studies.published.study import main
from studies.published.summary import bounded, calibrating, summary
from syncsim.decoders import DECODERS, decoder_params, decoder_train_flops_per_token
from syncsim.schemes import parse
from syncsim.units import parse_bandwidth
from syncsim.workload import PEAK_FLOPS


@pytest.fixture(scope="module")
def predictions() -> pd.DataFrame:
    return predict(load())


def test_every_dataset_states_source_hardware_and_model():
    for meta_path in sorted(DATA.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        assert meta["id"] == meta_path.stem and meta_path.with_suffix(".csv").exists()
        assert meta["source"].get("url") or meta["source"].get("repo"), meta["id"]
        rows = pd.read_csv(meta_path.with_suffix(".csv"))
        predicted = (meta["kind"] == "nccl-allreduce" or "single_gpu_images_per_s" in meta["model"]
                     or "compute" in meta["model"])
        # the intra-node component is named wherever a prediction crosses it (one GPU per node crosses none)
        needs_intra = predicted and (rows["gpus_per_node"] > 1).any()
        assert meta["hardware"]["gpus_per_node"], meta["id"]
        assert meta["model"]["intra"] in INTRA or (not needs_intra and meta["model"]["intra"] is None), \
            meta["id"]
        labels = meta["model"].get("outside") or []
        labels = [labels] if isinstance(labels, str) else labels
        assert set(labels) <= set(OUTSIDE), meta["id"]
        # GPUDirect RDMA, where stated, is a fact with its evidence; host staging is never a hand-set label
        gdr = meta["hardware"].get("gpudirect_rdma")
        assert gdr in (None, True, False) and (gdr is None or meta["hardware"]["gpudirect_rdma_source"]), meta["id"]
        # runs across nodes (or on a node count the source leaves unstated) state their links' rate, per
        # dataset or per row, or are outside the model for not stating it
        if (rows["nodes"] > 1).any() or rows["nodes"].isna().any():
            stated = meta["hardware"]["nic_rate"] or ("nic_rate" in rows and rows["nic_rate"].notna().all())
            assert (stated and meta["hardware"]["nics_per_node"]) or "unknown-link" in labels, meta["id"]
        if meta["kind"] == "training-scaling" and not predicted:
            assert meta["model"]["no_prediction"], meta["id"]  # the summary says why there is no prediction


def test_every_row_is_predicted_and_reported(predictions):
    rows = sum(len(pd.read_csv(p)) for p in DATA.glob("*.csv"))
    single_gpu = sum((pd.read_csv(p)["gpus"] <= 1).sum() for p in DATA.glob("*.csv")
                     if "gpus" in pd.read_csv(p, nrows=0).columns)
    assert len(predictions) == rows - single_gpu
    inside = predictions[predictions["in_model"]]
    assert inside["predicted"].notna().all() and (inside["predicted"] > 0).all()
    assert (predictions.loc[~predictions["in_model"], "reason"] != "").all()


# The targets on bandwidth-bound rows inside the model: median |error| <= 8 % (met) and
# every row within 15 % (not met: the two medium sizes, 64 and 128 MiB, of the single-node A100
# curve come out 23 % fast — NCCL's ring has not reached its full rate there, which a latency +
# bandwidth model does not capture). The max is guarded at today's 25 % so that it cannot get worse.
# Three datasets since the host-staging rule put hkbu-2080ti-8x4-1x10gbe (no GPUDirect) outside.
def test_published_bandwidth_bound_rows_within_bounds(predictions):
    rows = bounded(predictions)
    assert len(rows) >= 30 and rows["dataset"].nunique() >= 3
    errors = rows["rel_error"].abs()
    assert errors.median() <= 0.08
    assert errors.max() <= 0.25
    assert (errors > 0.15).sum() <= 2


def test_two_node_tree_beats_the_network_as_published(predictions):
    # aws-p4de: 2 nodes, 4 x 100G EFA each; NCCL's tree sends half of a ring's bytes over the
    # network on two nodes, so busbw exceeds the NICs' aggregate (78 GB/s measured over 4 x 12).
    p4de = predictions[(predictions["dataset"] == "aws-p4de-a100-2x8-4efa") & predictions["bandwidth_bound"]]
    assert (p4de["algorithm"] == "tree").all()
    busbw = p4de["size"] / p4de["predicted"] * 2 * 15 / 16
    assert (busbw > 4 * 12e9).all()


def test_study_writes_csv_and_figure(tmp_path, capsys):
    assert main(["--out", str(tmp_path)]) == 0
    data = pd.read_csv(tmp_path / "published.csv")
    assert {"dataset", "measured", "predicted", "rel_error", "algorithm", "bandwidth_bound", "in_model",
            "source"} <= set(data.columns)
    assert (tmp_path / "parity.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "median |error|" in out and "nan" not in out.lower()


# -- the host-staging rule: one rule from the stated hardware, the same for every dataset -------------
def by_id(name: str) -> Dataset:
    return next(ds for ds in load() if ds.id == name)


def test_host_staging_is_one_rule_for_every_dataset():
    # the two runs of one cluster without GPUDirect RDMA (100G InfiniBand, 10 GbE TCP) get one verdict,
    # whichever of them the model happens to match; a cluster with GPUDirect RDMA gets the other
    ib, tcp = by_id("hkbu-2080ti-8x4-1ib100"), by_id("hkbu-2080ti-8x4-1x10gbe")
    assert ib.outside_model() == tcp.outside_model() == HOST_STAGED
    assert by_id("moc-h100-2x1-1roce400-nogdr").outside_model() == HOST_STAGED
    gdr = by_id("horovod416-resnet101-v100-2x8-roce40")
    assert gdr.hardware["gpudirect_rdma"] is True and gdr.outside_model() is None
    # the same cluster stated with GPUDirect RDMA, or run on one node, is inside
    assert not host_staged(ib.hardware | {"gpudirect_rdma": True}, ib.rows)
    assert not host_staged(ib.hardware, ib.rows.assign(nodes=1))
    for ds in load():  # and no dataset is put outside for host staging any other way
        staged = ds.hardware.get("gpudirect_rdma") is False and (ds.rows["nodes"] > 1).any()
        assert (HOST_STAGED in (ds.outside_model() or "")) == staged, ds.id


def test_dataset_labels_follow_the_hardware_alike():
    for ds in load():
        labels = ds.model.get("outside") or []
        labels = [labels] if isinstance(labels, str) else labels
        if ds.meta["kind"] == "nccl-allreduce":  # NCCL runs NVLS on every multi-GPU NVSwitch-3 node
            nvswitch3 = ds.model["intra"] in ("H100", "H200") and (ds.rows["gpus_per_node"] > 1).any()
            assert ("nvls" in labels) == nvswitch3, ds.id
        assert ("cube-mesh" in labels) == ("cube-mesh" in ds.hardware["intra"]), ds.id
        # a multi-node dataset without a stated link rate, per dataset or per row, is outside for that alone
        crosses = (ds.rows["nodes"] > 1).any() or ds.rows["nodes"].isna().any()
        rated = bool(ds.hardware["nic_rate"]) or ("nic_rate" in ds.rows and ds.rows["nic_rate"].notna().all())
        assert ("unknown-link" in labels) == (crosses and not rated), ds.id


# -- the summary, on frames small enough to work out by hand --------------------------------------
def frame(*rows: tuple) -> pd.DataFrame:
    """(dataset, what, rel_error, bandwidth_bound, reason, no_prediction) per row; measured 1."""
    return pd.DataFrame([
        {"dataset": d, "kind": "nccl-allreduce" if what == "allreduce seconds" else "training-scaling",
         "what": what, "size": 2.0**27, "measured": 1.0, "predicted": 1.0 + err, "rel_error": err,
         "algorithm": "ring", "bandwidth_bound": bound, "in_model": not reason, "reason": reason,
         "no_prediction": why, "source": "s"}
        for d, what, err, bound, reason, why in rows])


AR, EFF, NAN = "allreduce seconds", "scaling efficiency", math.nan


def test_summary_never_prints_nan():
    text = summary(frame(("in", AR, 0.02, True, "", ""),
                         ("latency", AR, 0.4, False, "not modelled", ""),
                         ("latency", AR, -0.2, False, "not modelled", ""),
                         ("unpredicted", EFF, NAN, False, "fsdp", "no single-GPU run"),
                         ("unpredicted", EFF, NAN, False, "fsdp", "no single-GPU run")))
    assert "nan" not in text.lower()
    assert "  outside the model: latency (not modelled): no bandwidth-bound rows; median error +10.0% over its " \
           "2 rows" in text.splitlines()
    assert "  outside the model: unpredicted (fsdp): no prediction: no single-GPU run (2 rows)" in text.splitlines()
    assert "not bandwidth-bound, in-model rows, scaling efficiency: no rows" in text.splitlines()
    # nothing inside the model at all: still no NaN
    empty = summary(frame(("x", AR, NAN, True, "fsdp", "none")))
    assert "nan" not in empty.lower() and empty.splitlines()[0] == "bandwidth-bound, in-model rows: no rows"


def test_summary_reports_the_rows_that_are_not_bandwidth_bound():
    text = summary(frame(("a", AR, 0.10, False, "", ""), ("a", AR, -0.30, False, "", ""),
                         ("b", AR, 0.20, False, "", ""),
                         ("c", EFF, -0.05, False, "", ""), ("c", EFF, 0.15, False, "", ""),
                         ("a", AR, 0.90, True, "", ""),              # bandwidth-bound: the headline's
                         ("d", AR, 0.80, False, "nvls", "")))        # outside: its own line
    lines = text.splitlines()
    # |errors| 0.10, 0.30, 0.20 -> median 20 %, max 30 %; 0.05, 0.15 -> median 10 %, max 15 %
    assert "not bandwidth-bound, in-model rows, all-reduce time: median |error| 20.0%, max 30.0% over 3 rows " \
           "of 2 datasets" in lines
    assert "not bandwidth-bound, in-model rows, scaling efficiency: median |error| 10.0%, max 15.0% over 2 " \
           "rows of 1 dataset" in lines
    assert lines[0] == "bandwidth-bound, in-model rows: median |error| 90.0%, max 90.0% over 1 row of 1 dataset"


def test_summary_gives_the_headline_with_each_outside_dataset_included():
    text = summary(frame(("in", AR, 0.01, True, "", ""), ("in", AR, 0.03, True, "", ""),
                         ("in", AR, -0.05, True, "", ""),
                         ("p", AR, 0.5, True, "nvls", ""), ("p", AR, -0.6, True, "nvls", ""),
                         ("p", AR, 0.9, False, "nvls", ""),          # not bandwidth-bound: not counted
                         ("q", AR, -0.02, True, "staged", ""),
                         ("r", AR, 0.7, False, "staged", "")))       # no bandwidth-bound rows: no line
    lines = text.splitlines()
    assert lines[0] == "bandwidth-bound, in-model rows: median |error| 3.0%, max 5.0% over 3 rows of 1 dataset"
    # with p: 0.01, 0.03, 0.05, 0.5, 0.6 -> median 5 %, max 60 %; with q: 0.01, 0.02, 0.03, 0.05 -> 2.5 %, 5 %
    assert [line for line in lines if line.startswith("  with ")] == [
        "  with p included: median |error| 5.0%, max 60.0% over 5 rows",
        "  with q included: median |error| 2.5%, max 5.0% over 4 rows"]


def test_summary_gives_every_excluded_dataset_its_headline(predictions):
    outside = predictions[~predictions["in_model"] & predictions["bandwidth_bound"] & predictions["predicted"].notna()]
    shown = {line.split()[1] for line in summary(predictions).splitlines() if line.startswith("  with ")}
    assert shown == set(outside["dataset"]) and {"hkbu-2080ti-8x4-1ib100", "hkbu-2080ti-8x4-1x10gbe"} <= shown


# -- schemes beyond all-reduce : DiLoCo, local SGD, PowerSGD measured on stated hardware -------
NEW_SCHEME_DATASETS = {
    "dilocomeasured-diloco-l40s-4x1-tcshaped": 16, "dilocomeasured-localsgd-l40s-4x1-tcshaped": 16,
    "intellect1-diloco-h100x8-internet": 3, "opendiloco-1b-h100x8-internet": 1,
    "pytorch74148-powersgd-resnet50-v100-2gpn": 3,
}


@pytest.mark.parametrize("name, count", sorted(NEW_SCHEME_DATASETS.items()))
def test_scheme_datasets_load_and_name_their_source(name, count):
    ds = by_id(name)
    assert len(ds.rows) == count and ds.meta["kind"] == "training-scaling"
    src = ds.meta["source"]
    assert ds.source.startswith("https://") and src["title"] and src["where"] and src["quote"]
    # every row names the scheme it ran, in the grammar; its measured figure is an efficiency in (0, 1]
    assert ds.rows["scheme"].notna().all()
    for scheme in ds.rows["scheme"]:
        parse(scheme)
    assert ((ds.rows["efficiency"] > 0) & (ds.rows["efficiency"] <= 1)).all()
    assert {parse(s).name for s in ds.rows["scheme"]} <= {"diloco", "localsgd", "allreduce"}


def test_scheme_rows_are_predicted_or_outside_with_a_reason(predictions):
    for name, count in NEW_SCHEME_DATASETS.items():
        rows = predictions[predictions["dataset"] == name]
        assert len(rows) == count, name
        assert set(rows["scheme"]) == set(by_id(name).rows["scheme"]), name  # each row's own scheme ran
        for r in rows.itertuples(index=False):
            assert (math.isfinite(r.predicted) and r.predicted > 0) or r.no_prediction, name
            assert r.in_model or r.reason, name
    # the shaped-link datasets are predicted row by row, at each row's own link rate and scheme
    shaped = predictions[predictions["dataset"].str.startswith("dilocomeasured-")]
    assert shaped["predicted"].notna().all() and set(shaped["nic_rate"]) == {"50Mbit/s", "200Mbit/s", "1Gbit/s",
                                                                             "5Gbit/s"}
    # NCCL over TCP sockets without GPUDirect RDMA: outside by the one host-staging rule, yet reported
    assert (shaped["reason"] == HOST_STAGED).all()
    # more bandwidth, or a longer period, never lowers the predicted efficiency
    for scheme, group in shaped.groupby("scheme"):
        by_rate = group.assign(rate=group["nic_rate"].map(lambda r: parse_bandwidth(r, "rate"))).sort_values("rate")
        assert by_rate["predicted"].is_monotonic_increasing, scheme


def test_a_row_scheme_and_link_rate_reach_the_simulator():
    ds = by_id("dilocomeasured-diloco-l40s-4x1-tcshaped")
    slow, fast = (training_rows(Dataset(ds.id, ds.meta, ds.rows[ds.rows["nic_rate"] == rate]))
                  for rate in ("50Mbit/s", "5Gbit/s"))
    for a, b in zip(slow, fast):
        assert a["scheme"] == b["scheme"] and a["predicted"] < b["predicted"]
    # ten sync periods: the steady state (after the first tenth) holds whole periods
    assert simulated_steps("diloco:period=128") == 1280 and simulated_steps("allreduce") == 20
    assert sync_period("localsgd:period=32") == 32 and sync_period("topk:ratio=0.01") == 1


# -- sharded data parallelism : FSDP and ZeRO throughput measured on stated clusters ------------------
SHARDED_DATASETS = {
    "torchtitan-llama31-8b-h100-grandteton": 6, "trainy-llama31-8b-h200-fp8allgather": 2,
    "torchtitan-llama-a100x64-unknownlink": 8, "llmfoundry-mpt-a100-40gb-roce1600": 39,
    "llmfoundry-mpt-a100-80gb-roce1600": 11, "llmfoundry-mpt-h100-unknownlink": 38,
    "ibmcloud-fsdp-t5-a100-2x100gbe-tcp": 3, "ibm-fsdp-llama2-a100x128-400g": 4, "ibm-fsdp-llama2-h100x96-800g": 4,
    "fsdppaper-a100-2tbps-roce": 3, "zeropaper-zerodp-v100-dgx2-8x100ib": 1,
    "zeropaper-zero100b-mp-v100-dgx2-8x100ib": 1,
}


def schemes_of(ds: Dataset) -> set[str]:
    rows = set(ds.rows["scheme"].dropna()) if "scheme" in ds.rows else set()
    return rows | ({ds.model["scheme"]} if ds.model.get("scheme") else set())


SHARDED_PREDICTED = {"torchtitan-llama31-8b-h100-grandteton", "trainy-llama31-8b-h200-fp8allgather",
                     "fsdp-qwen7b-ndh100v5-8x400ib", "fsdp-qwen7b-ndh100v5-tcp-frontend"}


@pytest.mark.parametrize("name, count", sorted(SHARDED_DATASETS.items()))
def test_sharded_datasets_load_and_name_their_source(name, count):
    ds = by_id(name)
    assert len(ds.rows) == count and ds.meta["kind"] == "training-scaling"
    src = ds.meta["source"]
    assert ds.source.startswith("https://") and src["title"] and src["where"] and src["quote"] and src["date"]
    if src.get("repo"):  # a repository file is cited at the commit its rows were read from
        assert len(src["commit"]) == 40 and src["commit"] in src["url"] and src["path"]
    # every row ran a sharded scheme in the grammar: zero:stage=N or fsdp:reshard=true|false (with its precision)
    assert ds.rows["scheme"].notna().all()
    for scheme in schemes_of(ds):
        assert re.fullmatch(r"(fsdp:reshard=(true|false)|zero:stage=[123])(,precision=(bf16|fp16))?", scheme), scheme
        assert parse(scheme).name in SHARDED_SCHEMES
    # the hardware as stated, and either the rule's inputs (model.compute) or why there is no prediction
    assert ds.hardware["gpu"] and ds.hardware["nic"] and isinstance(ds.hardware["intra"], str)
    assert ds.model["measured"] and (("compute" in ds.model) != bool(ds.model.get("no_prediction")))
    assert ("compute" in ds.model) == (name in SHARDED_PREDICTED)
    # every derived column is named in the assumptions; a row's measured figure is in the CSV as printed
    measured = [c for c in ds.rows.columns if c.endswith("_as_printed")]
    assert measured and ds.rows[measured].notna().any(axis=1).all()
    if ds.rows["throughput_samples_per_s"].notna().any():
        assert any("throughput_samples_per_s is DERIVED" in a for a in ds.meta["assumptions"])


def test_sharded_tables_are_copied_consistently():
    # the llm-foundry rows as printed: global batch = microbatch x accumulation x GPUs, T/s/GPU = T/s / GPUs
    for name in ("llmfoundry-mpt-a100-40gb-roce1600", "llmfoundry-mpt-a100-80gb-roce1600",
                 "llmfoundry-mpt-h100-unknownlink"):
        r = by_id(name).rows
        assert (r["batch_per_gpu"] * r["grad_accum"] * r["gpus"] == r["global_batch_size"]).all(), name
        assert ((r["tokens_per_s"] / r["gpus"] - r["tokens_per_s_per_gpu"]).abs() <= 1).all(), name
        assert ((r["tokens_per_s"] / r["seq_len"] - r["samples_per_s_as_printed"]).abs() <= 1).all(), name
        assert set(r["scheme"]) == {"fsdp:reshard=true"} | ({"fsdp:reshard=false"} if "h100" in name else set())
        assert (r["scheme"] == r["sharding_strategy"].map({"FULL_SHARD": "fsdp:reshard=true",
                                                            "SHARD_GRAD_OP": "fsdp:reshard=false"})).all(), name
    # derived samples/s follow the stated tokens per GPU and sequence length
    for name in ("torchtitan-llama31-8b-h100-grandteton", "trainy-llama31-8b-h200-fp8allgather"):
        r = by_id(name).rows
        derived = r["tokens_per_s_per_gpu"] * r["gpus"] / r["seq_len"]
        assert ((r["throughput_samples_per_s"] / derived - 1).abs() < 1e-5).all(), name
        assert (r["nodes"] * r["gpus_per_node"] == r["gpus"]).all(), name
    # the technique is the printed table's Techniques column
    r = by_id("torchtitan-llama31-8b-h100-grandteton").rows
    assert (r["configuration"].str.split(": ").str[1] == r["technique"]).all()


def test_sharded_rows_are_predicted_or_carry_a_reason(predictions):
    for name in sorted(set(SHARDED_DATASETS) | SHARDED_PREDICTED):
        ds, rows = by_id(name), predictions[predictions["dataset"] == name]
        assert len(rows) == len(ds.rows) and (rows["what"] == SHARDED_WHAT).all(), name
        assert set(rows["scheme"]) == schemes_of(ds), name
        assert rows["in_model"].all() or rows["reason"].all(), name
        if "compute" in ds.model:  # every row simulated; one calibration row per technique
            assert (rows["predicted"] > 0).all() and (rows["no_prediction"] == "").all(), name
            techniques = ds.rows["technique"].nunique() if "technique" in ds.rows else 1
            assert rows["calibration"].sum() == techniques, name
        else:
            assert rows["predicted"].isna().all() and (rows["no_prediction"] == ds.model["no_prediction"]).all(), name


# -- the compute-time rule for sharded datasets: FLOPs / (peak x one efficiency calibrated on the smallest row) -----
def test_sharded_rule_calibrates_each_technique_on_its_smallest_row(predictions):
    ds = by_id("torchtitan-llama31-8b-h100-grandteton")
    rows = predictions[predictions["dataset"] == ds.id].reset_index(drop=True)
    # the 8-GPU row of each technique calibrates it; the 128-GPU row of the same technique shares its efficiency
    assert calibration_rows(ds.rows) == {"FSDP": 0, "FSDP + torch.compile": 1,
                                                     "FSDP + torch.compile + Float8": 2}
    assert list(rows["calibration"]) == [True] * 3 + [False] * 3
    assert list(rows["compute_efficiency"][:3]) == list(rows["compute_efficiency"][3:])
    # e is the calibration row's model-FLOP utilisation: tokens/s x 6N + 12LHQT over the datasheet peak; the source
    # states "33% to 39% MFU" against the SXM peak for these runs
    flops = decoder_train_flops_per_token("llama3.1-8b", 8192)
    assert rows["compute_efficiency"][0] == pytest.approx(5762 * flops / PEAK_FLOPS["H100-SXM"])
    assert [round(e, 2) for e in rows["compute_efficiency"][:2]] == [0.34, 0.39]
    # calibration rows are reported but never counted
    assert not bounded(rows.assign(bandwidth_bound=True))["calibration"].any()


def test_the_peak_cancels_and_no_row_tunes_its_own_efficiency(monkeypatch):
    ds = by_id("fsdp-qwen7b-ndh100v5-8x400ib")
    before = sharded_rows(ds)
    monkeypatch.setitem(PEAK_FLOPS, "H100-SXM", 2 * PEAK_FLOPS["H100-SXM"])
    after = sharded_rows(ds)
    # a peak twice as high halves the calibrated efficiency and leaves every prediction as it was
    assert [a["compute_efficiency"] for a in after] == pytest.approx([b["compute_efficiency"] / 2 for b in before])
    assert [a["predicted"] for a in after] == pytest.approx([b["predicted"] for b in before], rel=1e-9)
    # a row's measurement reaches its prediction only through the calibration row: changing a predicted row's
    # measured throughput changes its error, never its prediction
    changed = ds.rows.copy()
    changed.loc[3, "throughput_samples_per_s"] *= 0.5
    moved = sharded_rows(Dataset(ds.id, ds.meta, changed))
    assert [m["predicted"] for m in moved] == pytest.approx([b["predicted"] for b in before], rel=1e-9)
    assert moved[3]["measured"] == pytest.approx(before[3]["measured"] / 2)


def test_the_flop_count_reproduces_the_mfu_the_sources_state():
    # torchtitan's 2024 table (64 A100, MFU against 312 TFLOPS) counted the input embedding in N as well: with it,
    # our parameter counts and 6N + 12LHQT give every printed MFU to its printed 0.1 %
    ds = by_id("torchtitan-llama-a100x64-unknownlink")
    names = {"Llama 3 8B": "llama3.1-8b", "Llama 3 70B": "llama3-70b", "Llama 2 13B": "llama2-13b",
             "Llama 2 70B": "llama2-70b"}
    for r in ds.rows.itertuples(index=False):
        decoder = DECODERS[names[r.model]]
        flops = decoder_train_flops_per_token(names[r.model], r.seq_len) + 6 * decoder["vocab"] * decoder["hidden"]
        mfu = r.tokens_per_s_per_gpu * flops / PEAK_FLOPS["A100"]
        assert round(100 * mfu, 1) == float(r.mfu_percent_as_printed.rstrip("%")), r.configuration
    # the published parameter counts: Llama 3.1 8B 8,030,261,248; Qwen2.5-7B 7.61B (6.53B without embeddings)
    assert decoder_params("llama3.1-8b") == 8_030_261_248
    assert decoder_params("qwen2.5-7b") == 7_615_616_512
    assert decoder_params("llama2-7b") == 6_738_415_616 and decoder_params("llama2-70b") == 68_976_648_192


def test_sharded_rows_meet_the_published_throughput_targets(predictions):
    # the targets on throughput where the source states the hardware: median |error| <= 10 %, max <= 25 %,
    # over the rows inside the model that no efficiency was calibrated on
    sharded = predictions[(predictions["what"] == SHARDED_WHAT) & predictions["in_model"]
                          & ~calibrating(predictions) & predictions["predicted"].notna()]
    assert len(sharded) >= 6 and sharded["dataset"].nunique() >= 2
    errors = sharded["rel_error"].abs()
    assert errors.median() <= 0.10 and errors.max() <= 0.25


def test_a_sharded_dataset_states_the_rules_inputs_or_why_not():
    ds = by_id("torchtitan-llama31-8b-h100-grandteton")
    bare = {key: value for key, value in ds.model.items() if key != "compute"}
    with pytest.raises(ValueError, match="model.compute"):
        sharded_rows(Dataset(ds.id, ds.meta | {"model": bare}, ds.rows))
    # two rows at the smallest scale of one technique: no single calibration row, refused
    with pytest.raises(ValueError, match="must be one row"):
        calibration_rows(ds.rows.assign(technique="FSDP"))


def test_the_summary_leaves_calibration_rows_out():
    rows = frame(("s", SHARDED_WHAT, 0.0, False, "", ""), ("s", SHARDED_WHAT, 0.04, False, "", ""),
                 ("s", SHARDED_WHAT, -0.02, False, "", ""))
    rows = rows.assign(calibration=[True, False, False], compute_efficiency=0.4)
    lines = summary(rows).splitlines()
    assert ("sharded (FSDP/ZeRO) tokens/s per GPU, in-model rows, calibration rows not counted: median |error| 3.0%, "
            "max 4.0% over 2 rows of 1 dataset") in lines
    assert any(line.startswith("  s: median error +1.0%, max |error| 4.0% over its 2 rows; compute efficiency 40.0%")
               for line in lines)
