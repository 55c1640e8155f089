"""Bad input to every ``python -m`` entry point: exit code 2, one line naming the option, nothing written.

Hypothesis puts one bad value (or an unknown or truncated option) among otherwise valid options of
each entry point and calls its ``main(argv)`` in this process, as the command line would. The call
must end within seconds with exit code 2 and a single line on stderr, ``MODULE: error: ...``,
naming the option, with no traceback, and must leave the output path untouched. Any work an
accepted bad input would start (a study, ranks, a testbed, a measurement) is replaced by a tripwire
that fails the test. A sample of the same inputs then runs as real subprocesses.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from real.config import SAMPLE_BYTES
from real.faults import CASES as FAULT_CASES
from studies.common import JOB_BYTES
from syncsim.limits import RUN_BYTES_PER_RANK_STEP, SIM_BYTES_PER_WORKER_STEP, memory_bytes
from tests.unit.bad_input import (
    FOREIGN_DIGITS,
    assert_one_line,
    bad_choice_text,
    bad_int_text,
    bad_real_text,
    bounded,
)

ROOT = Path(__file__).resolve().parents[2]
# sizes bounded by this machine's memory (syncsim.limits): the first value past each bound
MEMORY = memory_bytes()
STEPS = MEMORY // RUN_BYTES_PER_RANK_STEP
BATCH = MEMORY // SAMPLE_BYTES
UPDATES = MEMORY // SIM_BYTES_PER_WORKER_STEP  # one simulated update per worker-step
FEATURES = MEMORY // (12 * (4096 + 2000))  # LogisticRegression's data: (samples + test samples) x features
JOBS = MEMORY // JOB_BYTES  # a study's worker processes
STEPS_8_GPUS = MEMORY // SIM_BYTES_PER_WORKER_STEP // 8  # the syncsim command line's default cluster size
MODELS, DATA = ("lenet", "mlp", "mlp-large"), ("synthetic", "digits")
BAD_SCHEMES = st.sampled_from(["", "gossip", "allreduce:", "allreduce:precision=fp16,", "ps:mode=none",
                               "ps:staleness=null", "localsgd:period=٣", "allreduce:,", "ps:staleness=2,,amp=true",
                               "allreduce:bucket_bytes=0", "localsgd:period=0", "allreduce:overlap=1"])
BAD_UNITS = st.one_of(st.sampled_from(["fast", "0", "-5", "nan", "inf", "1e999Mbit/s", "", "٣Mbit/s", "5 furlongs"]))
BAD_PAIRS = st.sampled_from(["1:", ":3", "1:2,", ",", "a:b", "1:٣", "9:2", "1:0.5", "1:2:explode", "1:nan", "1,2"])


def bad_dir(scratch: Path) -> st.SearchStrategy:
    """Output folders that cannot be: empty, a file, inside a file, somewhere unwritable."""
    return st.sampled_from(["", " ", str(scratch / "a-file"), str(scratch / "a-file" / "below"), "/proc/syncsim-out",
                            "/dev/null"])


def bad_file(scratch: Path) -> st.SearchStrategy:
    return st.sampled_from(["", str(scratch), str(scratch / "a-file" / "cal.json"), "/proc/syncsim/cal.json"])


RUN_FLAGS = {  # real.run's options (also real.worker's, real.testbed's after --)
    "--scheme": lambda s: BAD_SCHEMES, "--world": lambda s: bad_int_text(1, 2**20),
    "--servers": lambda s: bad_int_text(0, 2**20), "--model": lambda s: bad_choice_text(MODELS),
    "--data": lambda s: bad_choice_text(DATA), "--steps": lambda s: bad_int_text(1, STEPS),
    "--batch-size": lambda s: bad_int_text(1, BATCH), "--lr": lambda s: bad_real_text(0.0, low_open=True),
    "--backend": lambda s: bad_choice_text(("gloo",)), "--device": lambda s: bad_choice_text(("cpu",)),
    "--seed": lambda s: bad_int_text(0, 2**63 - 1), "--timeout": lambda s: bad_real_text(1.0, 86400.0),
    "--slow": lambda s: BAD_PAIRS, "--fail": lambda s: BAD_PAIRS, "--out": bad_dir,
}
TESTBED_FLAGS = {
    "--hosts": lambda s: st.integers(-5, 40).filter(lambda h: h != 2).map(str),  # the run below has 2 ranks
    "--bandwidth": lambda s: BAD_UNITS, "--queue": lambda s: BAD_UNITS,
    "--prefix": lambda s: st.sampled_from(["", "Bad", "a-b", "x" * 13, "٣x", "1abc"]),
    "--run-timeout": lambda s: bad_real_text(0.0, 86400.0, low_open=True),
}
STUDY_FLAGS = {"--out": bad_dir, "--jobs": lambda s: bad_int_text(1, JOBS),
               "--scheduler": lambda s: st.sampled_from(["garbage", "tcp://", "host", "tcp://host:port", ""])}
SIMULATE = ["simulate", "--cluster", "a100-100g", "--workload", "resnet50", "--scheme", "allreduce", "--steps", "4"]
# module -> (the options it takes and their bad values, valid options before them, valid options after
# them, the work a tripwire replaces); studies' work is studies.sweep.run, the simulator's syncsim.engine._Run
ENTRY_POINTS = {
    **{f"studies.{name}": (STUDY_FLAGS, ["--quick"], [], ["studies.sweep.run"])
       for name in ("scaling", "staleness", "precision", "published")},
    "syncsim": ({"--cluster": lambda s: st.sampled_from(["tpu", "", "/no/such.toml", "a100-100G", str(s)]),
                 "--gpus": lambda s: bad_int_text(1, 2**20), "--workload": lambda s: bad_choice_text(("resnet50",)),
                 "--scheme": lambda s: BAD_SCHEMES, "--steps": lambda s: bad_int_text(1, STEPS_8_GPUS),
                 "--seed": lambda s: bad_int_text(0), "--servers": lambda s: bad_int_text(0, 2**20),
                 "--target": lambda s: st.sampled_from(["accuracy=2", "bleu=3", "accuracy", "loss=-1", "loss=nan"]),
                 "--trace": bad_file}, SIMULATE, [], ["syncsim.engine._Run"]),
    "real.run": (RUN_FLAGS, [], [], ["real.run.start_ranks"]),
    "real.worker": (RUN_FLAGS, [], [], ["real.worker.setup", "real.worker.die_with_parent"]),
    "real.agent": ({}, ["--nproc-per-node", "1"], ["-m", "real.worker"],
                   ["torch.distributed.run.run", "real.agent.die_with_parent"]),
    "real.calibrate": ({"--model": lambda s: bad_choice_text(MODELS), "--world": lambda s: bad_int_text(1, 2**20),
                        "--servers": lambda s: bad_int_text(0, 2**20), "--batch-size": lambda s: bad_int_text(1, BATCH),
                        "--repeats": lambda s: bad_int_text(1, 10_000), "--out": bad_file}, [], [],
                       ["real.calibration.machine.measure_forward_backward",
                        "real.calibration.machine.measure_network"]),
    "real.bench": ({"--model": lambda s: bad_choice_text(MODELS), "--data": lambda s: bad_choice_text(DATA),
                    "--world": lambda s: bad_int_text(1, 2**20), "--steps": lambda s: bad_int_text(5, STEPS - 1),
                    "--batch-size": lambda s: bad_int_text(1, BATCH),
                    "--lr": lambda s: bad_real_text(0.0, low_open=True),
                    "--seed": lambda s: bad_int_text(0, 2**63 - 1), "--repeats": lambda s: bad_int_text(1, 1000),
                    "--byte-steps": lambda s: bad_int_text(1, STEPS)}, [], [], ["real.bench.run_side_by_side"]),
    "real.testbed": (TESTBED_FLAGS, [], ["--", "--world", "2"], ["real.testbed.namespaces.Testbed.__enter__"]),
    "studies.validation": ({"--schemes": lambda s: BAD_SCHEMES,
                            "--worlds": lambda s: st.sampled_from(["0", "", "2,", "x", "٣", "-1", "1,,2"]),
                            "--bandwidths": lambda s: BAD_UNITS, "--models": lambda s: bad_choice_text(MODELS),
                            "--slow": lambda s: bad_real_text(1.0), "--steps": lambda s: bad_int_text(2, STEPS),
                            "--batch-size": lambda s: bad_int_text(1, BATCH),
                            "--repeats": lambda s: bad_int_text(1, 10_000), "--out": bad_dir,
                            "--prefix": lambda s: st.sampled_from(["", "Bad", "a-b", "x" * 13]),
                            "--run-timeout": lambda s: bad_real_text(0.0, 7 * 86400.0, low_open=True),
                            "--steadiness": lambda s: st.sampled_from(["-1", "1", "1.9", "601", "nan", "x", "٣"])},
                           [], [], ["studies.validation.evaluate", "real.testbed.namespaces.Testbed.__enter__",
                                    "real.testbed.steadiness.measure_steadiness"]),
    "real.testbed.steadiness": ({"--model": lambda s: bad_choice_text(MODELS),
                                 "--batch-size": lambda s: bad_int_text(1, BATCH),
                                 "--seconds": lambda s: bad_real_text(2.0, 3600.0),
                                 "--window": lambda s: bad_real_text(0.0, 30.0, low_open=True),
                                 "--lag": lambda s: bad_real_text(0.0, 30.0, low_open=True), "--out": bad_file},
                                [], [], ["real.testbed.steadiness.measure_steadiness"]),
    "real.calibration": ({"--repeats": lambda s: bad_int_text(1, 10_000),
                          "--idle": lambda s: bad_real_text(0.0, 60.0),
                          "--at": lambda s: st.sampled_from(["3:fp16", "x:fp32", "4:fp64", "0:fp32", "6:fp32",
                                                             "-4:fp32", "4", "\u0664:fp32",
                                                             "4:fp32,5:fp16", " 4:fp32"]),
                          "--precisions": lambda s: st.sampled_from(["fp8", "fp16,fp64", "FP16", " fp16"]),
                          "--model": lambda s: bad_choice_text(MODELS),
                          "--batch-size": lambda s: bad_int_text(1, BATCH),
                          "--scheme": lambda s: BAD_SCHEMES,
                          "--compute": bad_file}, ["--compute", "/tmp/syncsim-fuzz-never-written.json"], [],
                         ["real.calibration.link_probe.link_rank", "real.calibration.compute_probe.compute_rank"]),
    "real.testbed.launch_bench": ({"--runs": lambda s: bad_int_text(1, 100),
                                   "--model": lambda s: bad_choice_text(MODELS), "--scheme": lambda s: BAD_SCHEMES,
                                   "--bandwidth": lambda s: BAD_UNITS}, [], [],
                                  ["real.testbed.launch_bench.time_run"]),
    "real.faults": ({"--timeout": lambda s: bad_real_text(1.0, 600.0),
                     "--only": lambda s: bad_choice_text(tuple(FAULT_CASES))}, [], [],
                    ["real.faults.measure"]),
    "real.testbed.counterflow": ({"--rates": lambda s: BAD_UNITS,
                                  "--sizes": lambda s: st.sampled_from(["", ",", "2", "-4", "x", "nan", "٣", "1e999"]),
                                  "--others": lambda s: bad_int_text(1, 6),
                                  "--repeats": lambda s: bad_int_text(1, 1000)}, [], [],
                                 ["real.testbed.counterflow.measure"]),
    "syncsim.bench": ({}, ["--quick"], [], ["syncsim.engine._Run"]),
    "syncsim.convergence.bench": ({"--updates": lambda s: bad_int_text(4, UPDATES),
                                   "--features": lambda s: bad_int_text(1, FEATURES)}, [], [],
                                  ["syncsim.engine._Run"]),
}
# where main() lives, if not in the module
MAINS = {"syncsim": "syncsim.cli", "real.testbed": "real.testbed.__main__",
         "real.calibration": "real.calibration.ranks", "studies.published": "studies.published.study"}


class Tripwire(Exception):
    pass


def tripwire(*args, **kwargs):
    raise Tripwire("bad input reached the work it should have prevented")


@contextlib.contextmanager
def guarded(module: str, work: list[str]):
    """The entry point's work replaced by a tripwire; this process's signal handlers restored after."""
    import importlib

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    patches = []
    try:
        for target in work:
            owner_name, attr = target.rsplit(".", 1)
            try:
                owner = importlib.import_module(owner_name)
            except ModuleNotFoundError:  # a class: module.Class.method
                module_name, cls = owner_name.rsplit(".", 1)
                owner = getattr(importlib.import_module(module_name), cls)
            patches.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, tripwire)
        yield importlib.import_module(module).main
    finally:
        for owner, attr, original in patches:
            setattr(owner, attr, original)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def run_main(main, argv: list[str]) -> tuple[object, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), bounded(20.0):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


@st.composite
def bad_command_lines(draw, module: str, scratch: Path) -> tuple[list[str], str]:
    """(argv, the option the error must name): valid options with one bad value, or an unknown or cut-off option."""
    flags, before, after, _ = ENTRY_POINTS[module]
    out = str(scratch / "out")
    if "--out" in flags:
        before = [*before, "--out", out + (".json" if module == "real.calibrate" else "")]
    if module == "real.testbed":
        after = [*after, "--out", out]
    kind = draw(st.sampled_from(["value"] * 4 + ["unknown", "missing"]) if flags else st.just("unknown"))
    if kind == "value" and module == "real.testbed" and draw(st.booleans()):  # a bad real.run option after --
        flag = draw(st.sampled_from(sorted(RUN_FLAGS)))
        return [*before, *after, flag, draw(RUN_FLAGS[flag](scratch))], flag
    if kind == "unknown":
        option = draw(st.sampled_from(["--bogus", "--world-size", "--Out", "--steps=٣"]))
        if option == "--steps=٣" and "--steps" not in flags:
            option = "--bogus"
        return [*before, option, *after], option.split("=")[0]
    flag = draw(st.sampled_from(sorted(flags)))
    if kind == "missing":  # the option last, with no value
        return ([*before, flag] if after else [*before, *after, flag]), flag
    return [*before, flag, draw(flags[flag](scratch)), *after], flag


def mentions(message: str, flag: str) -> bool:
    name = flag.lstrip("-")
    return any(n in message for n in (name, name.replace("-", "_"), name.replace("-", " ")))


CASES = sorted(ENTRY_POINTS)


@pytest.mark.parametrize("module", CASES)
@given(data=st.data())
def test_every_entry_point_refuses_bad_options_in_one_line_before_any_work(module, data):
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        (scratch / "a-file").write_text("not a folder\n")
        argv, flag = data.draw(bad_command_lines(module, scratch), label="argv")
        with guarded(MAINS.get(module, module), ENTRY_POINTS[module][3]) as main:
            code, err = run_main(main, argv)
        assert code == 2, (code, err)
        assert_one_line(err)
        assert re.match(rf"{re.escape(module)}( simulate)?: error: ", err), err
        assert mentions(err, flag), f"{flag} not named in {err!r}"
        # nothing written: the scratch folder holds only what the test put there
        assert sorted(p.name for p in scratch.iterdir()) == ["a-file"]


# One bad input per entry point, as a real command line: the same one line and exit code, from a fresh process.
SAMPLES = [
    ("studies.scaling", ["--out", ""], "--out"),
    ("studies.staleness", ["--jobs", "0"], "--jobs"),
    ("studies.precision", ["--scheduler", "garbage"], "--scheduler"),
    ("studies.published", ["--out", "/dev/null"], "--out"),
    ("syncsim", ["simulate", "--cluster", "a100-100g", "--workload", "resnet50", "--scheme", "ps:mode=none"], "mode"),
    ("real.agent", ["--bogus", "-m", "real.worker"], "--bogus"),
    ("real.run", ["--scheme", "ps:staleness=none"], "staleness"),
    ("real.worker", ["--world", FOREIGN_DIGITS[0]], "--world"),
    ("real.calibrate", ["--out", "/proc/syncsim/cal.json"], "--out"),
    ("real.bench", ["--lr", "nan"], "--lr"),
    ("real.testbed", ["--run-timeout", "-1", "--", "--world", "2"], "--run-timeout"),
    ("studies.validation", ["--steps", "0"], "steps"),
    ("real.testbed.steadiness", ["--window", "0"], "--window"),
    ("studies.repeatability", ["--times", "1"], "--times"),
    ("real.calibration", ["--compute", "c.json", "--repeats", "0"], "--repeats"),
    ("real.faults", ["--timeout", "0"], "--timeout"),
    ("syncsim.bench", ["--bogus"], "--bogus"),
    ("syncsim.convergence.bench", ["--updates", "-3"], "updates"),
]


@pytest.mark.parametrize("module,argv,named", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_bad_options_end_a_real_process_in_one_line(tmp_path, module, argv, named):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc.stderr, f"{module}: error: ", named)
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []
