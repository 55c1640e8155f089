"""``syncsim``: ask the simulator a question from the shell.

    syncsim simulate --cluster a100-100g --gpus 64 --workload resnet50 --scheme allreduce
    syncsim compare  --cluster a100-100g --gpus 64 --workload bert-large --scheme allreduce \\
                     --scheme ps:mode=async --scheme localsgd:period=8 --target accuracy=0.95
    syncsim presets

Exit codes: 0 success, 2 bad input (the message names the option, the value
and what is allowed; nothing is written), 1 a failure while running.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from syncsim.arguments import integer
from syncsim.files import check_out_file

__all__ = ["main"]

EXAMPLES = """\
examples:
  syncsim simulate --cluster a100-100g --gpus 64 --workload resnet50 --scheme allreduce
  syncsim simulate --cluster my-cluster.toml --workload bert-large --scheme ps:staleness=2 --servers 8 --json
  syncsim compare --cluster h100-400g --gpus 256 --workload gpt2 --scheme allreduce --scheme allreduce:precision=fp16
  syncsim compare ... --scheme allreduce --scheme ps:mode=async --target accuracy=0.95
  syncsim compare ... --scheme allreduce:compression=powersgd,rank=4 --scheme topk:ratio=0.01 \\
                      --scheme diloco:period=100,fragments=4
  syncsim compare --cluster h100-400g --gpus 64 --workload llama2-7b --steps 20 --scheme allreduce \\
                  --scheme zero:stage=1,precision=bf16 --scheme zero:stage=3,precision=bf16 --scheme fsdp:precision=bf16
  syncsim presets

cluster and workload files are TOML (or JSON) with the fields of syncsim.Cluster / syncsim.Workload,
e.g. a cluster:
  nodes = 4
  gpus_per_node = 8
  nics_per_node = 8
  intra = { bandwidth = "240GB/s", latency = "3.4us" }
  inter = { bandwidth = "200Gbit/s", latency = "14us" }
a workload's compress_flops (FLOP/s) and scan_rate (values/s) price compressors' own work (PowerSGD,
top-k, DiLoCo's outer step); python -m real.calibrate measures both; unset, that work is free
memory per GPU (syncsim.memory) counts parameters, gradients, Adam's state, buffers and, when the workload
gives activation_bytes (per sample), activations; a cluster's gpu_memory (e.g. "80GiB") is what it must fit

exit codes: 0 success, 2 bad input, 1 failure while running
"""

# The replay behind --target: the digits classifier at the step size and momentum the staleness study uses.
TARGET_LR, TARGET_MOMENTUM = 0.3, 0.5
TARGET_METRICS = ("accuracy", "loss")


class BadInput(ValueError):
    """Input the user can fix: exit code 2."""


@dataclass(frozen=True)
class Target:
    metric: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        metric, eq, value = text.partition("=")
        if not eq or metric not in TARGET_METRICS:
            raise BadInput(f"--target must be METRIC=VALUE with METRIC in {', '.join(TARGET_METRICS)}, got {text!r}")
        try:
            number = float(value)
        except ValueError:
            raise BadInput(f"--target {metric}= needs a number, got {value!r}") from None
        if not math.isfinite(number) or (metric == "accuracy" and not 0 < number <= 1) or number < 0:
            raise BadInput(f"--target {metric} must be in (0, 1] for accuracy or >= 0 for loss, got {value!r}")
        return cls(metric, number)


def _positive_int(name: str):
    def convert(text: str) -> int:
        try:
            value = integer(text)  # ASCII digits only
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number >= 1, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number >= 1, got {text!r}")
        return value
    return convert


def _load_cluster(spec: str, gpus: int | None, servers: int | None):
    from syncsim import Cluster
    from syncsim.cluster import CLUSTER_PRESETS

    if spec in CLUSTER_PRESETS:
        cluster = Cluster.preset(spec, gpus=gpus or 8)
    elif spec.endswith((".toml", ".json")):
        cluster = Cluster.from_file(spec)
        cluster = cluster.with_gpus(gpus) if gpus else cluster
    else:
        raise BadInput(f"--cluster {spec!r} is neither a preset ({', '.join(sorted(CLUSTER_PRESETS))}) "
                       f"nor a .toml/.json file")
    return cluster.replace(servers=servers) if servers is not None else cluster


def _load_workload(spec: str):
    from syncsim import Workload
    from syncsim.workload import WORKLOAD_PRESETS

    if spec in WORKLOAD_PRESETS:
        return Workload.preset(spec)
    if spec.endswith((".toml", ".json")):
        return Workload.from_file(spec)
    raise BadInput(f"--workload {spec!r} is neither a preset ({', '.join(sorted(WORKLOAD_PRESETS))}) "
                   f"nor a .toml/.json file")


def _with_servers(cluster, scheme):
    """Parameter-server schemes on a cluster without server hosts get one per node (as the studies do)."""
    from syncsim.schemes import Pull, Push

    uses_servers = bool(scheme.policy(1.0).action_types(1) & {Push, Pull})
    if uses_servers and cluster.servers == 0:
        return cluster.replace(servers=cluster.nodes), True
    return cluster, False


def _check_output(path: str | None, option: str) -> None:
    if path is None:
        return
    check_out_file(path, option)  # empty, a folder, or not writable: refused before any simulation
    parent = Path(path).parent
    if not parent.is_dir():
        raise BadInput(f"{option} {path!r}: folder {str(parent)!r} does not exist")


def _run(cluster, workload, scheme_text: str, steps: int, seed: int, target: Target | None) -> dict:
    from syncsim import simulate
    from syncsim.schemes import parse

    scheme = parse(scheme_text)
    cluster, added = _with_servers(cluster, scheme)
    result = simulate(cluster, workload, scheme, steps=steps, seed=seed)
    row = result.summary()
    row["servers_added"] = added
    if target is not None:
        from syncsim.convergence import Digits, replay, steps_to_target, time_to_target

        metric, value = target.metric, target.value
        better = (lambda r: r[metric] >= value) if metric == "accuracy" else (lambda r: r[metric] <= value)
        curve = replay(result, Digits(seed=seed), lr=TARGET_LR, momentum=TARGET_MOMENTUM, seed=seed, stop=better)
        row.update(target=f"{metric}={value:g}", steps_to_target=steps_to_target(curve, value, metric),
                   time_to_target=time_to_target(curve, value, metric))
    row["_result"] = result
    return row


def _describe(row: dict) -> str:
    lines = [f"{row['scheme']} on {row['cluster']}: {row['gpus']} GPUs ({row['nodes']} x {row['gpus_per_node']})"
             + (f" + {row['servers']} server hosts" + (" (one per node)" if row["servers_added"] else "")
                if row["servers"] else "") + f", {row['workload']}, {row['steps']} steps",
             f"  step time    {row['step_time'] * 1e3:10.2f} ms (steady state)",
             f"  throughput   {row['throughput']:10,.0f} samples/s",
             f"  speedup      {row['speedup']:10.1f} x one GPU (efficiency {row['efficiency']:.2f})",
             f"  staleness    mean {row['mean_staleness']:.2f}, max {row['max_staleness']}"]
    if row.get("algorithms"):
        lines.append(f"  collectives  {row['algorithms']}")
    lines.append(f"  memory/GPU   {row['_result'].memory.describe()}")
    if "target" in row:
        reached = math.isfinite(row["time_to_target"])
        lines.append(f"  to {row['target']} (digits replay): " + (
            f"{row['time_to_target']:.2f} s, {row['steps_to_target']:.0f} steps" if reached
            else f"not reached in {row['steps']} steps"))
    return "\n".join(lines)


def _public(row: dict) -> dict:
    clean = {k: v for k, v in row.items() if not k.startswith("_")}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in clean.items()}


def _memory_cell(row: dict) -> str:
    """Peak memory per GPU in GiB; "+" when activations are unknown (a lower bound), "!" when it does not fit."""
    mark = "!" if row["fits"] is False else "+" if not row["memory_complete"] else " "
    return f"{row['memory_per_gpu'] / 2**30:8.1f}{mark}"


def _table(rows: list[dict]) -> str:
    width = max(34, *(len(r["scheme"]) for r in rows))  # a long name (allreduce:compression=...) widens the column
    header = (f"{'scheme':{width}s} {'ms/step':>9s} {'samples/s':>11s} {'speedup':>8s} {'eff':>5s} {'stale':>6s} "
              f"{'GiB/GPU':>9s}")
    with_target = any("target" in r for r in rows)
    if with_target:
        header += f" {'to target (s)':>14s} {'steps':>6s}"
    lines = [header]
    for r in rows:
        line = (f"{r['scheme']:{width}s} {r['step_time'] * 1e3:9.2f} {r['throughput']:11,.0f} {r['speedup']:8.1f} "
                f"{r['efficiency']:5.2f} {r['mean_staleness']:6.2f} {_memory_cell(r)}")
        if with_target:
            line += f" {r['time_to_target']:14.2f} {r['steps_to_target']:6.0f}"
        lines.append(line)
    notes = []
    if any(not r["memory_complete"] for r in rows):
        notes.append("GiB/GPU: peak memory per GPU (syncsim.memory); + without activations, which the workload "
                     "does not give (a lower bound)")
    if any(r["fits"] is False for r in rows):
        gib = rows[0]["gpu_memory"] / 2**30
        notes.append(f"! does not fit in the GPU's {gib:.1f} GiB")
    return "\n".join(lines + notes)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and the exit code 2), not the whole usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    top = _Parser(prog="syncsim", description=__doc__.splitlines()[0],
                  epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True, metavar="{simulate,compare,presets}",
                             parser_class=_Parser)
    for name, help_text in (("simulate", "simulate one scheme and print its figures"),
                            ("compare", "simulate several schemes side by side")):
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--cluster", required=True, help="a preset (syncsim presets) or a .toml/.json file")
        p.add_argument("--gpus", type=_positive_int("--gpus"), help="scale the cluster to this many GPUs")
        p.add_argument("--workload", required=True, help="a preset or a .toml/.json file")
        if name == "simulate":
            p.add_argument("--scheme", required=True, help="e.g. allreduce, ps:staleness=2, localsgd:period=8, "
                                                            "allreduce:compression=powersgd,rank=4, topk:ratio=0.01, "
                                                            "diloco:period=100, zero:stage=3,precision=bf16, "
                                                            "fsdp:reshard=false")
        else:
            p.add_argument("--scheme", required=True, action="append", help="repeat for each scheme")
        p.add_argument("--steps", type=_positive_int("--steps"), default=100, help="steps per worker (100)")
        p.add_argument("--seed", type=integer, default=0)
        p.add_argument("--servers", type=integer, help="parameter-server hosts (default: one per node)")
        p.add_argument("--target", help="replay on the digits problem to METRIC=VALUE, e.g. accuracy=0.95")
        if name == "simulate":
            p.add_argument("--trace", help="write a Perfetto / chrome://tracing timeline here")
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p = sub.add_parser("presets", help="list the cluster and workload presets with their sources")
    p.add_argument("--json", action="store_true")
    return top


def _presets(as_json: bool) -> str:
    from syncsim.cluster import CLUSTER_NOTES, CLUSTER_PRESETS
    from syncsim.workload import WORKLOAD_NOTES, WORKLOAD_PRESETS, Workload

    workloads = {name: Workload.preset(name) for name in WORKLOAD_PRESETS}
    if as_json:
        return json.dumps({"clusters": {n: CLUSTER_NOTES[n] for n in CLUSTER_PRESETS},
                           "workloads": {n: {"param_bytes": w.param_bytes, "compute_time": w.compute_time,
                                             "batch_size": w.batch_size, "source": WORKLOAD_NOTES[n]}
                                         for n, w in workloads.items()}}, indent=1)
    lines = ["clusters (--cluster NAME --gpus N):"]
    lines += [f"  {n:10s} {CLUSTER_NOTES[n]}" for n in CLUSTER_PRESETS]
    lines.append("workloads (--workload NAME):")
    for n, w in workloads.items():
        lines.append(f"  {n:10s} {w.param_bytes / 2**20:8.1f} MiB of gradients, {w.compute_time * 1e3:7.1f} ms "
                     f"per step of {w.batch_size}: {WORKLOAD_NOTES[n]}")
    return "\n".join(lines)


def _execute(args: argparse.Namespace) -> str:
    if args.command == "presets":
        return _presets(args.json)
    from syncsim.schemes import parse

    schemes = [args.scheme] if isinstance(args.scheme, str) else args.scheme
    for text in schemes:  # every scheme checked before any simulation runs
        try:
            parse(text)
        except ValueError as err:
            raise BadInput(f"--scheme {text!r}: {err}") from None
    if args.servers is not None and args.servers < 0:
        raise BadInput(f"--servers must be >= 0, got {args.servers}")
    if args.seed < 0:
        raise BadInput(f"--seed must be >= 0, got {args.seed}")
    target = Target.parse(args.target) if args.target is not None else None
    _check_output(getattr(args, "trace", None), "--trace")
    cluster = _load_cluster(args.cluster, args.gpus, args.servers)
    workload = _load_workload(args.workload)
    rows = [_run(cluster, workload, text, args.steps, args.seed, target) for text in schemes]
    if args.command == "simulate" and args.trace:
        rows[0]["_result"].to_chrome_trace(args.trace)
    if args.json:
        payload = [_public(r) for r in rows]
        return json.dumps(payload[0] if args.command == "simulate" else payload, indent=1, default=str)
    if args.command == "simulate":
        return _describe(rows[0]) + (f"\n  trace        {args.trace}" if args.trace else "")
    head = rows[0]
    return (f"{head['cluster']}: {head['gpus']} GPUs ({head['nodes']} x {head['gpus_per_node']}), "
            f"{head['workload']}, {head['steps']} steps\n" + _table(rows))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed its one-line usage error (code 2) or the help (0)
        return int(exit_.code or 0)
    try:
        print(_execute(args))
    except (BadInput, ValueError) as err:
        print(f"syncsim: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("syncsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (``syncsim presets | head``): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:  # a failure while running, not bad input: one line, no traceback
        print(f"syncsim: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
