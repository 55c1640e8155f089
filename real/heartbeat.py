"""A rank's heartbeat and its watchdog: a hung rank is ended after ``--timeout``, and so are its peers.

Every rank notes, in OUT/ranks/heartbeat-rank<R>, the step it is at, whether it is working on
its own or waiting for its peers (inside a collective, a send or a receive), the time of the
last change and its pid: one fixed-width pwrite per change. The file outlives the rank, so a
rank that hung or was killed can still be named with its step, and a launcher can tell the
rank that stopped working (the cause) from those that waited for it (the consequence).

torch's process-group timeout cannot tell a dead peer from a slow one, and does not cover every
wait: gloo inside DDP's backward waits on the all-reduce futures without it (a hung peer then
blocks the others for good), and a rank stuck in its own work (a deadlock, an endless loop) is
nobody's wait. So a watchdog thread in every rank watches the heartbeats:

- a rank that has made no progress in its own work for ``timeout`` seconds has hung;
- a rank that has waited ``timeout + WAIT_GRACE`` seconds while *no* rank made progress (every
  heartbeat in OUT/ranks older than that) waits for a peer that will not answer. A long wait
  behind a slow but live peer (a worker done early, waiting at the final barrier for a
  straggler) is not a failure.

Either way the watchdog reports and ends the rank (``on_stall``), which closes its connections
and so frees the peers blocked on it. Setup (rendezvous, first connections, the first
broadcast) gets at least SETUP_TIMEOUT: ranks start at different times on a loaded machine.
OUT/ranks must be visible to every rank, as it already is for the final merge.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Heartbeat", "Quiet", "Beat", "WAIT_GRACE", "SETUP_TIMEOUT", "EXIT_STALLED", "path", "limit",
           "origin", "mark", "came_from_peer", "PEER", "OWN"]

WAIT_GRACE = 3.0
"""Seconds a waiting rank allows beyond ``timeout``, so that the hung rank's own watchdog speaks first."""
SETUP_TIMEOUT = 60.0
"""Seconds setup may take at least, whatever ``timeout`` is: torch's import alone takes seconds per rank."""
EXIT_STALLED = 3
"""Exit code of a rank its watchdog ended."""
WORK, WAIT = "work", "wait"
_FORMAT = "{step:>11} {phase} {time:17.6f} {pid:>10}\n"  # fixed width: each pwrite replaces the whole record


PEER, OWN = "peer", "own"
_ORIGIN = "syncsim_origin"


def origin(err: BaseException) -> str | None:
    """Where ``err`` came from, when known: PEER (out of a wait for peers: a closed connection,
    torch's timeout) or OWN (a rank's own work, marked by code that knows it), else None.

    The exception carries the mark itself: with several threads at once (a parameter server serves
    each worker from its own thread), the heartbeat's phase at the moment the error reaches the main
    thread says what *another* thread was doing."""
    return getattr(err, _ORIGIN, None)


def mark(err: BaseException, where: str) -> None:
    """Mark ``err`` as from PEER or OWN, unless an inner block marked it first."""
    if origin(err) is None:
        try:
            setattr(err, _ORIGIN, where)
        except AttributeError:  # an exception type with __slots__: left unmarked
            pass


def came_from_peer(err: BaseException, waiting: bool) -> bool:
    """Whether a rank's failure ``err`` is a consequence of a peer's: its mark decides; unmarked,
    the rank's phase when it caught it (DDP's backward waits for its all-reduce without a mark)."""
    return (origin(err) or (PEER if waiting else OWN)) == PEER


@contextmanager
def _marked_as_peer() -> Iterator[None]:
    try:
        yield
    except BaseException as err:
        mark(err, PEER)
        raise


def path(out: str | Path, rank: int) -> Path:
    return Path(out) / "ranks" / f"heartbeat-rank{rank}"


def limit(timeout: float, step: int, waiting: bool) -> float:
    """Seconds without progress after which a rank at ``step`` (-1: setup) counts as stalled."""
    return (timeout if step >= 0 else max(timeout, SETUP_TIMEOUT)) + (WAIT_GRACE if waiting else 0.0)


@dataclass(frozen=True)
class Beat:
    """A rank's last heartbeat: its step (-1 during setup), phase, the time of the change and its pid."""

    step: int
    waiting: bool
    time: float
    pid: int

    @classmethod
    def read(cls, out: str | Path, rank: int) -> Beat | None:
        try:
            step, phase, when, pid = path(out, rank).read_text().split()
            return cls(int(step), phase == WAIT, float(when), int(pid))
        except (OSError, ValueError):
            return None


class Heartbeat:
    """``beat(step)`` at each step, ``with waiting():`` around each wait for peers; ``stop()`` at the end.

    ``waiting_for_peers`` leaves the phase at "wait" when the wait raises, and marks the exception
    as coming from a peer (``origin``).
    ``on_stall(step, waiting, idle_seconds)`` is called from the watchdog thread and must end the rank.
    """

    def __init__(self, out: str | Path, rank: int, ranks: int, timeout: float,
                 on_stall: Callable[[int, bool, float], None] | None = None, period: float = 0.2):
        self.out, self.rank, self.ranks = out, rank, ranks
        file = path(out, rank)
        file.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.pid = os.getpid()
        self.timeout = timeout
        self.step = -1
        self.waiting = True  # setup is mostly waiting: rendezvous, the first broadcast
        self.since = self.started = time.time()
        self._write()
        self._stopped = threading.Event()
        if on_stall is not None:
            threading.Thread(target=self._watch, args=(on_stall, period), name="syncsim-watchdog",
                             daemon=True).start()

    def beat(self, step: int | None = None, waiting: bool = False) -> None:
        if step is not None:
            self.step = step
        self.waiting = waiting
        self.since = time.time()
        self._write()

    @contextmanager
    def waiting_for_peers(self) -> Iterator[None]:
        self.beat(waiting=True)
        with _marked_as_peer():  # no try/finally: an exception leaves the phase at "wait"
            yield
        self.beat(waiting=False)

    def stop(self) -> None:
        self._stopped.set()

    def _write(self) -> None:
        record = _FORMAT.format(step=self.step, phase=WAIT if self.waiting else WORK, time=self.since, pid=self.pid)
        os.pwrite(self.fd, record.encode(), 0)

    def last_progress(self) -> float:
        """When any rank last made progress, by the heartbeats in OUT/ranks (a rank not yet started
        counts from this one's start)."""
        beats = (Beat.read(self.out, r) for r in range(self.ranks) if r != self.rank)
        return max([self.since, *((b.time if b is not None else self.started) for b in beats)])

    def _watch(self, on_stall: Callable[[int, bool, float], None], period: float) -> None:
        while not self._stopped.wait(period):
            step, waiting, since = self.step, self.waiting, self.since
            allowed = limit(self.timeout, step, waiting)
            now = time.time()
            if now - since > allowed and (not waiting or now - self.last_progress() > allowed):
                on_stall(step, waiting, now - since)
                return


class Quiet:
    """A heartbeat that records nothing, for executors run outside real.worker (benchmarks)."""

    step, waiting = -1, False

    def beat(self, step: int | None = None, waiting: bool = False) -> None:
        pass

    @contextmanager
    def waiting_for_peers(self) -> Iterator[None]:
        with _marked_as_peer():
            yield
