"""Build the paper from what the studies wrote: ``python paper/build.py`` → ``paper/build/paper.pdf``.

Every number in the text and every figure comes from ``results/`` (the
studies' CSVs and figures): this script reads them, writes
``paper/build/numbers.json`` (each number already formatted) and
``paper/build/tables.typ``, copies the figures to ``paper/build/figures/`` and
compiles ``paper/paper.typ`` with the ``typst`` package from PyPI (no TeX). A
result the paper needs and cannot find stops the build, naming the file and
the command that writes it. ``--png`` also renders every page to
``paper/build/page-N.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import pandas as pd

from studies.precision import measured_speedups

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "paper"

# Everything the paper reads, and the command that writes it.
REQUIRED = {
    "published/published.csv": "python -m studies.published",
    "published/parity.png": "python -m studies.published",
    "validation/validation.csv": "python -m studies.validation",
    "validation/parity.png": "python -m studies.validation",
    "repeatability/repeatability.csv": "python -m studies.repeatability",
    "repeatability/repeatability.png": "python -m studies.repeatability",
    "scaling/scaling.csv": "python -m studies.scaling",
    "scaling/efficiency.png": "python -m studies.scaling",
    "staleness/summary.csv": "python -m studies.staleness",
    "staleness/staleness.png": "python -m studies.staleness",
    "precision/precision.csv": "python -m studies.precision",
    "precision/precision.png": "python -m studies.precision",
    "precision/measured/validation.csv": "python -m studies.precision --measure",
}


class MissingResult(FileNotFoundError):
    pass


def pct(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}\u00a0%"  # no break before %


def num(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def check(results: Path) -> None:
    missing = [(name, command) for name, command in REQUIRED.items() if not (results / name).exists()]
    if missing:
        lines = [f"  {results / name}  (written by `{command}`)" for name, command in missing]
        raise MissingResult("the paper needs results that are not there:\n" + "\n".join(lines))


# -- one function per study: the numbers the text quotes -------------------------------------------
def published(results: Path) -> dict:
    data = pd.read_csv(results / "published/published.csv")
    bound = data[data["bandwidth_bound"] & data["in_model"]]
    err = bound["rel_error"].abs()
    worst = bound.assign(abs_error=err).nlargest(3, "abs_error")
    # data-parallel scaling efficiencies (the sharded datasets' tokens/s per GPU are training rows too, another kind)
    train = data[(data["what"] == "scaling efficiency") & data["in_model"] & data["predicted"].notna()]
    outside = data[~data["in_model"]]
    return {
        "datasets": str(data["dataset"].nunique()), "rows": str(len(data)),
        "bound_rows": str(len(bound)), "bound_datasets": str(bound["dataset"].nunique()),
        "median": pct(err.median()), "max": pct(err.max()),
        "within15": str(int((err <= 0.15).sum())),
        "worst": [{"dataset": r.dataset, "size_mib": num(r.size / 2**20, 0), "error": pct(r.rel_error)}
                  for r in worst.itertuples(index=False)],
        "train_rows": str(len(train)), "train_median": pct(train["rel_error"].abs().median()),
        "train_max": pct(train["rel_error"].abs().max()),
        "outside_datasets": str(outside["dataset"].nunique()),
    }


def validation(results: Path) -> dict:
    data = pd.read_csv(results / "validation/validation.csv")
    ok = data[data["error"].isna()] if "error" in data else data
    err = ok["rel_error"].abs()
    speed = ok["speedup_error"].abs().dropna()
    stale = ok["staleness_mean_error"].abs().dropna() if "staleness_mean_error" in ok else pd.Series(dtype=float)
    worst = ok.assign(abs_error=err).nlargest(3, "abs_error")
    spread = ok["measured_spread"] if "measured_spread" in ok else pd.Series(math.nan, index=ok.index)
    # each run replayed with its own compute (a study run before the column existed has none: n/a)
    replayed = ok["replayed_error"].abs().dropna() if "replayed_error" in ok else pd.Series(dtype=float)
    # link rates in increasing order, as the study's bandwidth strings sort by their parsed value
    rates = list(ok.groupby("bandwidth")["link_bandwidth"].median().sort_values().index)
    return {
        "configs": str(len(ok)), "failed": str(len(data) - len(ok)), "median": pct(err.median()),
        "max": pct(err.max()), "speedup_median": pct(speed.median()), "speedup_max": pct(speed.max()),
        "staleness_rows": str(len(stale)), "staleness_median": pct(stale.median()), "staleness_max": pct(stale.max()),
        "schemes": str(ok["scheme"].nunique()),
        "worst": [{"scheme": r.scheme, "world": str(r.world), "bandwidth": str(r.bandwidth), "model": r.model,
                   "straggler": f", one worker {r.slow:g}× slower" if r.slow > 1 else "",
                   "error": pct(r.rel_error)} for r in worst.itertuples(index=False)],
        "within10": str(int((err <= 0.10).sum())), "within15": str(int((err <= 0.15).sum())),
        # each run's drift within itself (a study run before the column existed has none: n/a)
        "spread_median": pct(spread.median()), "spread_max": pct(spread.max()),
        "within_drift": str(int((err <= 2 * spread).sum())) if spread.notna().any() else "n/a",
        "replayed_rows": str(len(replayed)), "replayed_median": pct(replayed.median()) if len(replayed) else "n/a",
        "replayed_max": pct(replayed.max()) if len(replayed) else "n/a",
        "by_scheme": [[scheme] + [pct(group.loc[group["bandwidth"] == rate, "rel_error"].abs().median())
                                  for rate in rates]
                      for scheme, group in ok.groupby("scheme", sort=True)],
        "rates": rates,
    }


def repeatability(results: Path) -> dict:
    data = pd.read_csv(results / "repeatability/repeatability.csv")
    alone = (data["world"] == 1) & (data["servers"] == 0)  # the one-worker row: no communication
    talk = data[~alone]
    base = data[alone].iloc[0]
    return {
        "configs": str(len(data)), "repeats": str(int(data["repeats"].max())),
        "alone_cv": pct(base["measured_cv"], 0), "alone_cal_cv": pct(base["predicted_cv"], 0),
        "alone_min": pct(base["error_min"], 0), "alone_max": pct(base["error_max"], 0),
        "talk_cv_min": pct(talk["measured_cv"].min()), "talk_cv_max": pct(talk["measured_cv"].max()),
        "talk_error_medians": ", ".join(pct(x, 0) for x in sorted(talk["error_median"], reverse=True)),
        # a configuration's miss is the model's when its median error exceeds its own measured variation
        "talk_beyond": f"{int((talk['error_median'].abs() > talk['measured_cv']).sum())} of {len(talk)}",
    }


def scaling(results: Path) -> dict:
    data = pd.read_csv(results / "scaling/scaling.csv")
    top = data[data["gpus"] == data["gpus"].max()]
    speed = top.pivot_table(index=["cluster", "workload"], columns="scheme", values="speedup")
    # the table's schemes: the large model, which runs only the sharded ones, has no row in it
    speed = speed[speed.reindex(columns=list(SCALING_COLUMNS)).notna().any(axis=1)]
    auto = data[(data["scheme"] == "allreduce") & (data["gpus"] > 1)]
    switch = auto[auto["algorithms"].fillna("").str.startswith("tree")].groupby(["cluster", "workload"])["gpus"].min()
    rows = []
    for (cluster, workload), r in speed.iterrows():
        rows.append([f"{cluster} · {workload}"] + [num(r.get(s, math.nan), 0) for s in SCALING_COLUMNS])
    tta = data[data["time_to_target"].notna() & (data["gpus"] == 16) & (data["workload"] == "resnet50")]
    return {
        "gpus": str(int(data["gpus"].max())), "configs": str(len(data)),
        "table": rows, "tree_from_min": str(int(switch.min())), "tree_from_max": str(int(switch.max())),
        "ring_until": str(int(switch.min()) // 2),
        "ring_bert_a100": num(speed.loc[("a100-100g", "bert-large"), "allreduce:algorithm=ring"], 0),
        "auto_bert_a100": num(speed.loc[("a100-100g", "bert-large"), "allreduce"], 0),
        "fp16_bert_a100": num(speed.loc[("a100-100g", "bert-large"), "allreduce:precision=fp16"], 0),
        "tta16": [[f"{r.cluster}", r.scheme, num(r.steps_to_target, 0), num(r.time_to_target, 2)]
                  for r in tta.sort_values(["cluster", "time_to_target"]).itertuples(index=False)],
    }


SCALING_COLUMNS = ("allreduce", "allreduce:algorithm=ring", "allreduce:algorithm=hierarchical",
                   "allreduce:precision=fp16", "ps", "ps:mode=async", "localsgd")


def staleness(results: Path) -> dict:
    data = pd.read_csv(results / "staleness/summary.csv")
    key = data.set_index(["straggler_prob", "workers", "scheme"])
    w = int(data["workers"].max())
    p = float(data["straggler_prob"].max())

    def at(prob: float, scheme: str, column: str) -> float:
        return float(key.loc[(prob, w, scheme), column])

    faster_async = at(p, "ps:mode=async", "throughput") > at(p, "allreduce", "throughput")
    async_first = at(p, "ps:mode=async", "time_to_target") < at(p, "allreduce", "time_to_target")
    async_first0 = at(0.0, "ps:mode=async", "time_to_target") < at(0.0, "allreduce", "time_to_target")
    return {
        # the sentences that depend on which scheme wins are chosen by the data, not written in advance
        "tput_clause": ("because no worker waits for a straggler" if faster_async
                        else "although no worker waits for a straggler"),
        "verdict": "ahead" if async_first else "behind",
        "without": ("asynchrony still reaches the target first" if async_first0 == async_first and async_first
                    else "the comparison turns" if async_first0 != async_first
                    else "all-reduce still reaches the target first"),
        "workers": str(w), "straggler_prob": pct(p, 0),
        "ar_tput": num(at(p, "allreduce", "throughput"), 0), "async_tput": num(at(p, "ps:mode=async", "throughput"), 0),
        "ar_steps": num(at(p, "allreduce", "steps_to_target"), 0),
        "async_steps": num(at(p, "ps:mode=async", "steps_to_target"), 0),
        "ar_time": num(at(p, "allreduce", "time_to_target")),
        "async_time": num(at(p, "ps:mode=async", "time_to_target")),
        "ar_time0": num(at(0.0, "allreduce", "time_to_target")),
        "async_time0": num(at(0.0, "ps:mode=async", "time_to_target")),
        "table": [[pct(r.straggler_prob, 0), str(r.workers), r.scheme, num(r.throughput, 0), num(r.mean_staleness, 2),
                   num(r.steps_to_target, 0), num(r.time_to_target, 1)] for r in data.itertuples(index=False)],
    }


def precision(results: Path) -> dict:
    data = pd.read_csv(results / "precision/precision.csv")
    t = data.pivot_table(index=["cluster", "workload", "gpus"], columns=["compute", "precision"], values="step_time")
    compute = t[("fp32", "fp32")] / t[("autocast", "fp32")]
    wire = t[("autocast", "fp32")] / t[("autocast", "fp16")]
    by_gpus = []
    for gpus in sorted(data["gpus"].unique()):
        at = t.index.get_level_values("gpus") == gpus
        by_gpus.append([str(gpus), f"×{compute[at].median():.2f}", f"×{wire[at].median():.2f}",
                        f"×{wire[at].max():.2f}"])
    skipped = data.loc[data["precision"] == "fp16", "skipped_share"].dropna()
    steps = data.dropna(subset=["steps_to_target"]).pivot_table(index=["cluster", "workload", "gpus", "compute"],
                                                                columns="precision", values="steps_to_target")
    same = float(((steps["fp16"] - steps["fp32"]).abs() <= 1).mean()) if len(steps) else math.nan
    measured = measured_speedups(pd.read_csv(results / "precision/measured/validation.csv", keep_default_na=False,
                                             na_values=[""]))
    rows = [[r.bandwidth, r.format.replace("/", " compute, ") + " wire", f"×{r.measured:.2f}",
             f"×{r.predicted:.2f}", pct(r.predicted / r.measured - 1)] for r in measured.itertuples(index=False)]
    ratio = measured.set_index(["bandwidth", "format"])["measured"]
    rates = measured.groupby("bandwidth", sort=False)["link_bandwidth"].first().sort_values()
    slow_rate, fast_rate = rates.index[0], rates.index[-1]
    return {"by_gpus": by_gpus, "skipped": pct(skipped.mean(), 2) if len(skipped) else "n/a",
            "same_steps": pct(same, 0), "wire_max": f"×{wire.max():.2f}",
            "compute_median": f"×{compute.median():.2f}", "wire_median": f"×{wire.median():.2f}",
            "measured": rows, "slow_rate": slow_rate, "fast_rate": fast_rate,
            "fp16_slow": f"×{ratio[(slow_rate, 'fp32/fp16')]:.2f}",
            "fp16_fast": f"×{ratio[(fast_rate, 'fp32/fp16')]:.2f}",
            "amp_fast": f"×{ratio[(fast_rate, 'autocast/fp32')]:.2f}"}


STUDIES = {"published": published, "validation": validation, "repeatability": repeatability, "scaling": scaling,
           "staleness": staleness, "precision": precision}
FIGURES = {"published-parity.png": "published/parity.png", "validation-parity.png": "validation/parity.png",
           "repeatability.png": "repeatability/repeatability.png",
           "scaling-efficiency.png": "scaling/efficiency.png", "staleness.png": "staleness/staleness.png",
           "precision.png": "precision/precision.png"}


def typst_table(name: str, header: list[str], rows: list[list[str]]) -> str:
    cells = ", ".join(f"[*{h}*]" for h in header)
    for row in rows:
        cells += ", " + ", ".join("[" + str(c).replace("[", "\\[").replace("]", "\\]") + "]" for c in row)
    return (f"#let {name} = table(columns: {len(header)}, align: (left, ..range({len(header) - 1}).map(_ => right)), "
            f"stroke: 0.4pt + gray, inset: 4pt, {cells})\n")


def tables(numbers: dict) -> str:
    return "".join([
        typst_table("scaling-table", ["cluster · workload", "auto", "ring", "hier.", "fp16", "PS", "async PS",
                                      "local SGD"], numbers["scaling"]["table"]),
        typst_table("staleness-table", ["stragglers", "W", "scheme", "samples/s", "staleness", "steps", "s"],
                    numbers["staleness"]["table"]),
        typst_table("precision-table", ["GPUs", "autocast compute", "fp16 wire (median)", "fp16 wire (best)"],
                    numbers["precision"]["by_gpus"]),
        typst_table("validation-table", ["scheme", *numbers["validation"]["rates"]],
                    numbers["validation"]["by_scheme"]),
        typst_table("precision-measured-table", ["link", "format", "measured", "predicted", "error"],
                    numbers["precision"]["measured"]),
        typst_table("tta-table", ["cluster", "scheme", "steps", "s to 95 %"], numbers["scaling"]["tta16"]),
    ])


def build(results: Path, out: Path, png: bool) -> Path:
    check(results)
    out.mkdir(parents=True, exist_ok=True)
    numbers = {}
    for name, function in STUDIES.items():
        try:
            numbers[name] = function(results)
        except (KeyError, IndexError) as err:  # a quick or older run: not the grid the paper reports
            command = REQUIRED[next(k for k in REQUIRED if k.startswith(name + "/"))]
            raise MissingResult(f"results/{name}/ lacks {err} that the paper quotes: rerun `{command}` "
                                f"(the full grid, not --quick)") from None
    (out / "numbers.json").write_text(json.dumps(numbers, indent=1))
    (out / "tables.typ").write_text(tables(numbers))
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    for target, source in FIGURES.items():
        shutil.copyfile(results / source, figures / target)
    import typst

    pdf = out / "paper.pdf"
    # The document finds the generated files through sys.inputs: an absolute path, the root being "/".
    options = dict(root="/", sys_inputs={"build": str(out.resolve())})
    typst.compile(str(PAPER / "paper.typ"), output=str(pdf), **options)
    if png:
        for old in out.glob("page-*.png"):
            old.unlink()
        pages = typst.compile(str(PAPER / "paper.typ"), format="png", ppi=110, **options)
        for i, page in enumerate(pages if isinstance(pages, list) else [pages], start=1):
            (out / f"page-{i}.png").write_bytes(page)
    return pdf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python paper/build.py", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="the studies' output folder")
    parser.add_argument("--out", type=Path, default=PAPER / "build", help="where the PDF goes")
    parser.add_argument("--png", action="store_true", help="also render every page to PNG")
    args = parser.parse_args(argv)
    try:
        pdf = build(args.results, args.out, args.png)
    except MissingResult as err:
        print(f"paper: {err}", file=sys.stderr)
        return 2
    except ImportError:
        print("paper: the typst package is missing: pip install -e '.[paper]'", file=sys.stderr)
        return 2
    except RuntimeError as err:  # typst.TypstError: the document does not compile
        print(f"paper: typst could not compile paper/paper.typ: {err}", file=sys.stderr)
        return 1
    print(f"paper: wrote {pdf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
