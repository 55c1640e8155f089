"""Which rank failed first, how and at which step, from three kinds of evidence.

- A rank's own report (OUT/ranks/result-rank<R>.json), written when it catches its failure:
  an exception of its own work ("error"), its watchdog finding it hung ("hung") or waiting too
  long ("waited"), an exception while it waited for peers ("peer": a closed connection, torch's
  timeout), or SIGINT/SIGTERM ("interrupted").
- How its process ended, from torch's agent (ProcessFailure.exitcode: negative for a signal),
  for ranks that could not report (SIGKILL, a crash of the interpreter, os._exit).
- Its heartbeat (real.heartbeat): the step it was at, and whether it was working or waiting.

A rank's own failure is a cause; a rank killed from outside (a signal other than the stop signals,
an exit code without a report) is a cause; a rank stopped by SIGINT/SIGTERM is a cause only when
nothing else is (someone stopped that rank); a rank that waited for a peer or lost one is a
consequence. Within a class the earliest time wins: reports carry the time of the failure, a hang
read from a heartbeat the time its timeout ran out; a bare exit status carries none. torch's own
"first observed failure" (ChildFailedError.get_first_failure) orders by whole-second timestamps
and, on a tie, by rank, which is why it cannot be used here.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from real.heartbeat import Beat, limit

__all__ = ["Fate", "fates", "summary_of", "reports", "stand_in", "role_of", "KINDS"]

KINDS = ("error", "hung", "waited", "peer", "interrupted")
CAUSE, KILLED, STOPPED, CONSEQUENCE = range(4)  # the order in which fates name the first cause
_STOP_SIGNALS = (-signal.SIGTERM, -signal.SIGINT)
_SHOWN_OTHERS = 4


@dataclass(frozen=True)
class Fate:
    """How one rank ended: ``how`` is exception, hang, signal, exit code, timeout or lost peer."""

    rank: int
    role: str
    step: int | None
    how: str
    detail: str
    text: str
    order: int
    time: float | None

    def key(self) -> tuple:
        return self.order, math.inf if self.time is None else self.time, self.rank

    def public(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("order",)}


def role_of(rank: int, world: int) -> str:
    return "worker" if rank < world else "server"


def reports(rank_dir: Path) -> dict[int, dict]:
    found = {}
    for file in rank_dir.glob("result-rank*.json"):
        try:
            data = json.loads(file.read_text())
            found[int(data["rank"])] = data
        except (OSError, ValueError, KeyError):
            continue
    return found


def _step_text(step: int | None) -> str:
    return "during setup" if step is None or step < 0 else f"at step {step}"


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _fate(rank: int, role: str, report: dict | None, code: int | None, beat: Beat | None, timeout: float,
          failed_at: float) -> Fate | None:
    who = f"rank {rank} ({role})"
    if report is not None and report.get("error"):
        kind, step, when, text = report.get("error_kind", "error"), report.get("step"), report.get("error_time"), \
            " ".join(str(report["error"]).split())
        how, order = {"error": ("exception", CAUSE), "hung": ("hang", CAUSE), "waited": ("timeout", CONSEQUENCE),
                      "peer": ("lost peer", CONSEQUENCE), "interrupted": ("signal", STOPPED)}[kind]
        return Fate(rank, role, step, how, str(report.get("detail", "")), text, order, when)
    if report is not None:
        return None  # finished and reported: not a failure
    step = beat.step if beat is not None else None
    where = _step_text(step)
    idle = failed_at - beat.time if beat is not None else 0.0
    if beat is not None and not beat.waiting and idle > limit(timeout, beat.step, False):
        # no report because it could not write one: stuck in its own work past the timeout
        end = f", then ended by {_signal_name(code)}" if code is not None and code < 0 else ""
        return Fate(rank, role, step, "hang", f"no progress for {idle:.1f} s",
                    f"{who} hung {where}: no progress for {idle:.1f} s (--timeout {timeout:g}){end}", CAUSE,
                    beat.time + limit(timeout, beat.step, False))
    if code is None:
        return Fate(rank, role, step, "stopped", "", f"{who} stopped without a report {where}", STOPPED, None)
    if code < 0:
        name = _signal_name(code)
        order = STOPPED if code in _STOP_SIGNALS else KILLED
        verb = "was stopped by" if order == STOPPED else "was killed by"
        return Fate(rank, role, step, "signal", name, f"{who} {verb} {name} {where}", order, None)
    return Fate(rank, role, step, "exit code", str(code), f"{who} exited with code {code} {where} without a report",
                KILLED, None)


def fates(out: str | Path, ranks: int, world: int, timeout: float, exits: dict[int, int | None],
          failed_at: float) -> list[Fate]:
    """Every failed rank's fate, the first cause first. ``exits``: exit status by rank (negative: signal),
    None where unknown; ``failed_at``: when the run was seen to fail (hangs are measured up to it)."""
    found = reports(Path(out) / "ranks")
    result = []
    for rank in range(ranks):
        fate = _fate(rank, role_of(rank, world), found.get(rank), exits.get(rank), Beat.read(out, rank), timeout,
                     failed_at)
        if fate is not None:
            result.append(fate)
    return sorted(result, key=Fate.key)


def summary_of(all_fates: list[Fate], fallback: str) -> str:
    """One line: the first cause, then what followed."""
    if not all_fates:
        return f"run failed: {fallback}"
    first, others = all_fates[0], all_fates[1:]
    text = f"run failed: {first.text}"
    if others:
        shown = "; ".join(f.text for f in others[:_SHOWN_OTHERS])
        more = f"; and {len(others) - _SHOWN_OTHERS} more" if len(others) > _SHOWN_OTHERS else ""
        text += f" (then: {shown}{more})"
    return text


def stand_in(fate: Fate) -> dict:
    """The report a rank could not write itself, so that the merged summary lists every rank."""
    steps = fate.step if fate.role == "worker" and fate.step is not None and fate.step >= 0 else 0
    return {"rank": fate.rank, "role": fate.role, "steps_done": steps, "step": fate.step, "error": fate.text,
            "error_kind": fate.how, "error_time": fate.time, "stand_in": True}
