"""No orphans: a process started by syncsim ends when the process that started it ends, however it ends.

The chain is launcher → torch's elastic agent → ranks. ``python -m real.run`` runs the agent in
its own process, so there the ranks are the launcher's children; on the testbed the launcher
starts one torchrun agent per host (``python -m real.agent``) and each agent starts one rank.
torch's agent starts every rank in a session of its own (so a terminal's Ctrl-C reaches the
launcher only, which stops the ranks), and nothing would stop a rank whose launcher was killed:
it would be re-parented to init and train on.

``die_with_parent`` closes that gap at each link with Linux's parent-death signal
(prctl(2), PR_SET_PDEATHSIG): the kernel sends SIGKILL to the process as soon as the thread that
forked it exits, SIGKILL included. A parent that died before the call is caught by comparing
getppid() with the pid the parent announced in SYNCSIM_PARENT_PID (``announce_parent``) — after
the parent's death getppid() names init or a subreaper instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["PARENT_ENV", "announce_parent", "die_with_parent"]

PARENT_ENV = "SYNCSIM_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def announce_parent() -> None:
    """Tell the children this process starts from now on that it is their parent (they check it)."""
    os.environ[PARENT_ENV] = str(os.getpid())


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies; die now if it already has.

    Call it first thing in a child. The signal is sent when the parent *thread* exits, so the
    parent must start its children from a thread that lives as long as they do (the launchers
    here start them from their main thread). Kept across execve, except of set-user-ID programs.
    """
    if not sys.platform.startswith("linux"):  # prctl is Linux's; elsewhere the launchers' own stop must do
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    expected = os.environ.get(PARENT_ENV, "")
    parent = os.getppid()
    if (expected.isdigit() and int(expected) != parent) or parent == 1:
        # the parent died between our fork and the prctl: end as the signal would have ended us
        os.kill(os.getpid(), signal.SIGKILL)
