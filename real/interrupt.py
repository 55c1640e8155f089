"""SIGINT and SIGTERM handled so that a stopped process can still say what it had done.

Python turns SIGINT into KeyboardInterrupt and lets SIGTERM kill the process outright, which
leaves no record. A launcher (its main thread is always in Python) uses ``raise_on_signals``:
both raise ``Interrupted``, which derives from BaseException so that library code's ``except
Exception`` cannot swallow it. torch's elastic agent does the same while ranks run (it raises
its SignalException and forwards the signal to the ranks); ``signal_of`` reads either.

A rank cannot rely on its main thread: Python runs signal handlers there only between bytecodes,
and a rank blocked in a C++ wait (gloo inside DDP's backward does not even see a dead peer's
closed connection) would never get to run one. ``on_signals`` therefore has the interpreter's
C-level handler write the signal's number to a pipe (signal.set_wakeup_fd, which happens at once,
whatever the main thread is doing) and a thread reading that pipe act on it.

A process stopped this way exits with 128 + the signal's number (130 for SIGINT, 143 for
SIGTERM), as a shell reports a signalled process.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

__all__ = ["Interrupted", "raise_on_signals", "on_signals", "ignore_signals", "signal_of", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def raise_on_signals() -> None:
    """From now on SIGINT and SIGTERM raise Interrupted in the main thread."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise)


def on_signals(act: Callable[[int], None]) -> None:
    """From now on SIGINT/SIGTERM call ``act(signum)`` from a thread of its own, at once; it must end the process.

    Call from the main thread (signal.set_wakeup_fd's rule).
    """
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    for signum in STOP_SIGNALS:
        # a Python handler must be set for the C-level one (and the wakeup write) to run; the work is
        # done by the thread below, so the main thread's copy of the call does nothing
        signal.signal(signum, lambda signum, frame: None)

    def watch() -> None:
        while True:
            received = os.read(read, 1)
            if received and received[0] in STOP_SIGNALS:
                act(received[0])
                return

    threading.Thread(target=watch, name="syncsim-signals", daemon=True).start()


def ignore_signals() -> None:
    """Ignore further SIGINT/SIGTERM: a process already stopping finishes its report."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def signal_of(err: BaseException) -> int | None:
    """The signal an interruption stands for: ours, torch's SignalException, or KeyboardInterrupt."""
    if isinstance(err, Interrupted):
        return err.signum
    if isinstance(err, KeyboardInterrupt):
        return int(signal.SIGINT)
    sigval = getattr(err, "sigval", None)  # torch.distributed.elastic.multiprocessing.api.SignalException
    return int(sigval) if sigval is not None else None
