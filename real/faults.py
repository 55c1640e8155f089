"""``python -m real.faults``: how long after each kind of fault a real run ends, and whom it names.

Each case runs ``python -m real.run`` (two workers, and one server for ``ps``) and injects one fault:
a rank that crashes or hangs at step 2 (``--fail``), a worker or a server killed with SIGKILL at step
3, or the launcher interrupted (SIGINT, SIGTERM) or killed (SIGKILL) at step 3. It prints, per case,
the seconds from the fault to the launcher's exit (for a SIGKILLed launcher: to the death of its last
rank), the exit code, the first cause named in summary.json and the processes of the run left over.
The fault's time is the failing rank's last heartbeat for an injected crash or hang, and the moment
the signal is sent otherwise; a hang is detected ``--timeout`` after it began.

    python -m real.faults --timeout 5            # every case, about 3 minutes on 2 cores
    python -m real.faults --only allreduce-hang  # one case
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from real.heartbeat import Beat
from syncsim.arguments import ArgumentParser, fail, number

__all__ = ["CASES", "processes_of", "wait_for_step", "measure", "main"]

ALLREDUCE = ("--scheme", "allreduce", "--world", "2")
PS = ("--scheme", "ps", "--world", "2", "--servers", "1")
LOCALSGD = ("--scheme", "localsgd:period=2", "--world", "2")
# name -> (run options, what to do: ("fail", "RANK:2:MODE") or ("kill", RANK or "launcher", signal name))
CASES = {
    "allreduce-crash": (ALLREDUCE, ("fail", "1:2:crash")),
    "ps-crash": (PS, ("fail", "0:2:crash")),
    "localsgd-crash": (LOCALSGD, ("fail", "1:2:crash")),
    "allreduce-hang": (ALLREDUCE, ("fail", "1:2:hang")),
    "ps-hang": (("--scheme", "ps:staleness=1", "--world", "2", "--servers", "1"), ("fail", "1:2:hang")),
    "ps-server-hang": (("--scheme", "ps:mode=async", "--world", "2", "--servers", "1"), ("fail", "2:2:hang")),
    "localsgd-hang": (LOCALSGD, ("fail", "0:2:hang")),
    "allreduce-kill-worker": (ALLREDUCE, ("kill", 1, "SIGKILL")),
    "ps-kill-worker": (("--scheme", "ps:mode=async", "--world", "2", "--servers", "1"), ("kill", 0, "SIGKILL")),
    "ps-kill-server": (PS, ("kill", 2, "SIGKILL")),
    "localsgd-kill-worker": (LOCALSGD, ("kill", 0, "SIGKILL")),
    "launcher-sigint": (ALLREDUCE, ("kill", "launcher", "SIGINT")),
    "launcher-sigterm": (ALLREDUCE, ("kill", "launcher", "SIGTERM")),
    "launcher-sigkill": (PS, ("kill", "launcher", "SIGKILL")),
}
COMMON = ("--model", "mlp", "--batch-size", "8")
LONG = 400  # steps of a run the fault is injected into from outside: still running when it comes


def processes_of(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line mentions ``marker`` (a run's own output folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and int(pid) != os.getpid() and state != "Z":
            found.append(int(pid))
    return found


def wait_for_step(proc: subprocess.Popen, out: str | Path, rank: int, step: int, limit: float = 120.0) -> Beat:
    """The rank's heartbeat once it has reached ``step`` (the run still going)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        beat = Beat.read(out, rank)
        if beat is not None and beat.step >= step:
            return beat
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended before rank {rank} reached step {step}: {proc.communicate()[1][-2000:]}")
        time.sleep(0.02)
    raise RuntimeError(f"rank {rank} did not reach step {step} within {limit:g} s")


def measure(name: str, out: Path, timeout: float) -> dict:
    """Run one case; the seconds from its fault to the end, the exit code and the first cause."""
    args, (action, *what) = CASES[name]
    steps = 6 if action == "fail" else LONG
    cmd = [sys.executable, "-m", "real.run", *args, *COMMON, "--timeout", f"{timeout:g}", "--steps", str(steps),
           "--out", str(out)]
    if action == "fail":
        cmd += ["--fail", what[0]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if action == "kill":
        target, signame = what
        beat = wait_for_step(proc, out, 0 if target == "launcher" else target, 3)
        ranks = [b.pid for b in (Beat.read(out, r) for r in range(4)) if b is not None]
        fault = time.time()
        os.kill(proc.pid if target == "launcher" else beat.pid, getattr(signal, signame))
    _, err = proc.communicate(timeout=600)
    if action == "kill" and target == "launcher" and signame == "SIGKILL":
        while processes_of(str(out)) and time.time() - fault < 60:  # the ranks die with it (real.lifeline)
            time.sleep(0.01)
        ranks_left = [pid for pid in ranks if pid in processes_of(str(out))]
        return {"case": name, "seconds": time.time() - fault, "code": proc.returncode, "first": "-",
                "left": ranks_left}
    ended = time.time()
    if action == "fail":
        fault = Beat.read(out, int(what[0].split(":")[0])).time
    summary = json.loads((out / "summary.json").read_text())
    first = summary.get("first_failure") or {}
    named = (f"rank {first['rank']} ({first['role']}) {first['how']} {first['detail']} at step {first['step']}"
             if first else summary.get("error") or "-")
    return {"case": name, "seconds": ended - fault, "code": proc.returncode, "first": named,
            "left": processes_of(str(out)), "stderr": err.strip().splitlines()[-1:]}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m real.faults", description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=number, default=5.0, help="the runs' --timeout, seconds")
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="run this case (repeatable)")
    args = ap.parse_args(argv)
    if not 1 <= args.timeout <= 600:
        return fail("real.faults", f"--timeout must be between 1 and 600 seconds, got {args.timeout:g}")
    print(f"real.faults: time from each fault to the end of the run (--timeout {args.timeout:g})")
    with tempfile.TemporaryDirectory(prefix="syncsim-faults-") as tmp:
        for name in args.only or CASES:
            row = measure(name, Path(tmp) / name, args.timeout)
            print(f"  {row['case']:22s} {row['seconds']:6.2f} s  exit {row['code']!s:>4}  first: {row['first']}"
                  + (f"  LEFT OVER: {row['left']}" if row["left"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
