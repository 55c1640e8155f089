"""Mutation testing of the arithmetic core: ``python -m tests.mutation [MODULE ...] [--out DIR]``.

Each module below is mutated by cosmic-ray (one small change at a time: an
operator, a comparison, a number, a boolean, a loop that never runs) and the
module's own fast tests run against every mutant; a mutant the tests do not
fail *survives*. The run works on a scratch copy of the tree (the files git
tracks or would track), because cosmic-ray edits the source in place while a
test runs and nothing else may import a mutant meanwhile. It prints, per
module, the mutants tried, killed and survived, and every survivor as a
one-line diff; docs/mutation.md holds the last result with each remaining
survivor explained.

Operators left out, on purpose: replacements *by* bitwise and shift operators
(``|``, ``&``, ``^``, ``<<``, ``>>``), by ``is``/``is not`` and by unary ``~``/
``not``. On the floats this code computes with they raise TypeError wherever
the line runs (so they measure coverage, which the arithmetic replacements on
the same line measure too), and they would double the run's length.

Needs ``pip install -e ".[mutation]"`` (cosmic-ray). Slow (hours for all
modules on two cores): run it at low priority, one module at a time while
iterating, e.g. ``nice -n 10 python -m tests.mutation syncsim/network.py``.
A stopped run resumes where it stopped (sessions live in ``--out``, one per
module, valid while the module's text is unchanged; ``--fresh`` starts over),
and after adding tests ``--recheck`` reruns only the previous survivors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = "python -m pytest -x -q -p no:cacheprovider"
# A mutant that makes the tests run this many times longer than the unmutated tree has hung (an
# endless loop, a message never sent): it counts as killed.
HANG_FACTOR = 4.0

EXCLUDED_OPERATORS = [
    r"core/ReplaceBinaryOperator_\w+_(BitOr|BitAnd|BitXor|LShift|RShift)$",
    r"core/ReplaceComparisonOperator_\w+_(Is|IsNot)$",
    r"core/ReplaceUnaryOperator_\w+_(Invert|Not)$",
]

# fast unit tests first: with -x, a mutant they kill costs no property run
CONVERGENCE_TESTS = ("tests/unit/test_update_log.py tests/unit/test_convergence_parts.py "
                     "tests/property/test_convergence_sync.py tests/property/test_convergence_ps.py "
                     "tests/property/test_convergence_scaling.py tests/property/test_convergence_stability.py "
                     "tests/property/test_convergence_averaging.py")
REFERENCES = "tests/real/test_references.py"
# the executor's byte counts are checked against the policy's (test_schemes), its arithmetic against the references
EXECUTOR_RUNS = REFERENCES + " " + " ".join(
    f'"tests/real/test_schemes.py::test_outputs_in_the_simulator_schema_and_bytes_as_the_policy_counts[{run}]"'
    for run in ("allreduce", "ps_sync", "async", "localsgd"))
HOOK_RUNS = (f"{REFERENCES}::test_fp16_allreduce_is_the_reference_with_wire_values_rounded_to_fp16 "
             f"{REFERENCES}::test_local_sgd_is_independent_local_steps_then_the_exact_mean_rounded_to_bf16 "
             '"tests/real/test_schemes.py::test_outputs_in_the_simulator_schema_and_bytes_as_the_policy_counts'
             '[allreduce]"')


@dataclass(frozen=True)
class Target:
    stages: tuple[str, ...]
    """pytest arguments of each stage; a later stage runs only for mutants the earlier ones missed."""
    functions: frozenset[str] = field(default_factory=frozenset)
    """Only mutate inside these functions (empty: the whole module)."""

    def command(self) -> str:
        return "sh -c '" + " && ".join(f"{PYTEST} {stage}" for stage in self.stages) + "'"


TARGETS = {
    "syncsim/network.py": Target(("tests/property/test_network.py tests/property/test_parameter_server.py",)),
    "syncsim/server.py": Target(("tests/property/test_parameter_server.py tests/property/test_convergence_ps.py "
                                 "tests/property/test_engine_invariants.py",)),
    "syncsim/convergence/optimizer.py": Target((CONVERGENCE_TESTS,)),
    # the update rule: the walk and every action's arithmetic (not the loss curve's bookkeeping in replay())
    "syncsim/convergence/replay.py": Target((CONVERGENCE_TESTS,), frozenset({
        "__init__", "_init_replicas", "_init_order", "run", "parameters", "_new_version", "_read", "_scale",
        "_compute", "_local_update", "_join", "_allreduce", "_average", "_push", "_wait", "_pull"})),
    # the server's arithmetic and protocol, in process (whole runs are checked by the executor's target)
    "real/server.py": Target(("tests/unit/test_real_server.py",),
                             frozenset({"shard_bounds", "__init__", "logs_updates", "run", "apply", "wake", "push",
                                        "wait", "pull"})),
    # the executor's arithmetic: what it averages, applies, pushes and loads (not tracing or fault injection)
    "real/executor.py": Target(("tests/unit/test_real_executor.py", EXECUTOR_RUNS),
                               frozenset({"flat_params", "average", "_load_flat", "allreduce", "local_update",
                                          "_apply"})),
    "real/pushing.py": Target(("tests/unit/test_real_executor.py", EXECUTOR_RUNS), frozenset({"push", "pull", "wait"})),
    "real/hooks.py": Target(("tests/unit/test_real_hooks.py", HOOK_RUNS)),
    "syncsim/collectives.py": Target(("tests/property/test_collectives.py tests/property/test_overlap.py",)),
}


def scratch_copy(dest: Path) -> None:
    """The files git tracks or would track (not ignored), copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def stop_strays(tree: Path) -> None:
    """Kill what a timed-out mutant left running in the scratch tree.

    cosmic-ray kills a hung test's process group, but torch's launcher starts
    each rank in a session of its own, so a rank stuck on a mutated protocol
    would outlive it. Only processes whose working directory is the scratch
    copy are touched: nothing else runs there.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd == tree or tree in cwd.parents:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def skip_outside(session: Path, functions: frozenset[str]) -> int:
    """Mark as skipped the pending mutants outside ``functions``; returns how many."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    skipped = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            if all(m.definition_name not in functions for m in item.mutations):
                db.set_result(item.job_id, WorkResult(output="outside the arithmetic functions",
                                                      worker_outcome=WorkerOutcome.SKIPPED))
                skipped += 1
    return skipped


def reopen_survivors(session: Path) -> int:
    """Make the mutants that survived the session's last run pending again; returns how many."""
    from cosmic_ray.work_db import WorkDB, WorkResultStorage, use_db
    from cosmic_ray.work_item import TestOutcome

    with use_db(str(session), WorkDB.Mode.open) as db:
        survivors = [item.job_id for item, result in db.completed_work_items
                     if result.test_outcome == TestOutcome.SURVIVED]
        with db._session_maker.begin() as rows:  # cosmic-ray has no public call to forget one result
            rows.query(WorkResultStorage).where(WorkResultStorage.job_id.in_(survivors)).delete()
    return len(survivors)


def run_module(module: str, target: Target, tree: Path, out: Path, recheck: bool = False,
               fresh: bool = False) -> dict:
    name = module.replace("/", "_").removesuffix(".py")
    config, session = out / f"{name}.toml", out / f"{name}.sqlite"
    env = dict(os.environ, PYTHONPATH=str(tree), HYPOTHESIS_PROFILE="mutation", OMP_NUM_THREADS="1")
    env.pop("CI", None)

    def cosmic(*args: str) -> None:
        subprocess.run(list(args), cwd=tree, env=env, check=True)

    # a session belongs to one version of the module: its mutants are positions in that text
    digest = hashlib.sha256((tree / module).read_bytes()).hexdigest()
    stamp = out / f"{name}.sha256"
    current = session.exists() and stamp.exists() and stamp.read_text() == digest
    # the unmutated tree must pass, or every mutant would count as killed; its time sets the hang timeout
    t0 = time.time()
    baseline = subprocess.run(target.command(), shell=True, cwd=tree, env=env, capture_output=True, text=True)
    if baseline.returncode != 0:
        raise SystemExit(f"{module}: the tests fail without any mutant:\n{baseline.stdout[-3000:]}")
    write_config(config, module, target, timeout=max(30.0, HANG_FACTOR * (time.time() - t0)))
    if recheck:
        if not current:
            raise SystemExit(f"{module}: no session of this version of the module in {out} to recheck")
        print(f"{module}: rechecking {reopen_survivors(session)} survivors", flush=True)
    elif current and not fresh:
        print(f"{module}: resuming the session in {session}", flush=True)
    else:
        init_session(config, session, target, cosmic)
        stamp.write_text(digest)
    t0 = time.time()
    try:
        cosmic("cosmic-ray", "exec", str(config), str(session))
    finally:
        stop_strays(tree)
    return summarise(module, session, time.time() - t0)


def write_config(config: Path, module: str, target: Target, timeout: float) -> None:
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {timeout:.0f}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(target.command())}\n"
        "[cosmic-ray.distributor]\nname = \"local\"\n"
        "[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = {json.dumps(EXCLUDED_OPERATORS)}\n")


def init_session(config: Path, session: Path, target: Target, cosmic) -> None:
    session.unlink(missing_ok=True)
    cosmic("cosmic-ray", "init", str(config), str(session))
    cosmic("cr-filter-operators", str(session), str(config))
    if target.functions:
        skip_outside(session, target.functions)


def summarise(module: str, session: Path, seconds: float) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    counts = {"killed": 0, "survived": 0, "incompetent": 0, "skipped": 0}
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                counts["skipped"] += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                counts["survived"] += 1
                mutation = item.mutations[0]
                survivors.append({"line": mutation.start_pos[0], "operator": mutation.operator_name,
                                  "function": mutation.definition_name, "change": one_line(result.diff)})
            elif result.test_outcome == TestOutcome.INCOMPETENT:
                counts["incompetent"] += 1
            else:
                counts["killed"] += 1
    tried = counts["killed"] + counts["survived"]
    score = counts["killed"] / tried if tried else float("nan")
    return {"module": module, **counts, "score": score, "seconds": seconds,
            "survivors": sorted(survivors, key=lambda s: s["line"])}


def one_line(diff: str | None) -> str:
    """``old → new`` from a one-line unified diff."""
    lines = (diff or "").splitlines()
    old = [ln[1:].strip() for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    new = [ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    return f"{' / '.join(old)}  →  {' / '.join(new)}"


def report(results: list[dict]) -> str:
    rows = ["| module | mutants | killed | survived | score | minutes |", "|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| `{r['module']}` | {r['killed'] + r['survived']} | {r['killed']} | {r['survived']} | "
                    f"{r['score']:.1%} | {r['seconds'] / 60:.0f} |")
    for r in results:
        if r["survivors"]:
            rows += ["", f"Survivors in `{r['module']}`:", ""]
            rows += [f"- line {s['line']} ({s['function']}): `{s['change']}`" for s in r["survivors"]]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--out", default=str(ROOT / "results" / "mutation"), help="sessions and results")
    parser.add_argument("--recheck", action="store_true",
                        help="rerun only the last session's survivors, against the tests as they are now")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming an unfinished session")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"no mutation target {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    if shutil.which("cosmic-ray") is None:
        parser.error("cosmic-ray is not installed: pip install -e '.[mutation]'")
    out = Path(args.out).resolve()  # cosmic-ray runs in the scratch copy: a relative --out would land there
    out.mkdir(parents=True, exist_ok=True)
    # a stopped run still removes its scratch copy (TemporaryDirectory cleans up on SystemExit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    results = []
    with tempfile.TemporaryDirectory(prefix="syncsim-mutation-") as tmp:
        tree = Path(tmp)
        scratch_copy(tree)
        for module in args.modules or list(TARGETS):
            result = run_module(module, TARGETS[module], tree, out, args.recheck, args.fresh)
            (out / (re.sub(r"\W", "_", module) + ".json")).write_text(json.dumps(result, indent=1))
            results.append(result)
            print(report([result]), flush=True)
    print("\n" + report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
