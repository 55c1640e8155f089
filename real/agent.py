"""One node's torch agent: ``python -m real.agent [torchrun options] -m real.worker [options]``.

torchrun itself (torch.distributed.run: its options, its elastic agent, its c10d rendezvous), with
what a launcher that starts whole nodes (the emulated-network testbed) needs on top:

- the agent dies with its launcher, and its ranks with it (real.lifeline): torchrun alone, its
  launcher killed, would train on under init;
- it writes how each of its ranks ended (``{rank: exit code}``, negative for a signal: torch's
  ProcessFailure.exitcode) to the file named by SYNCSIM_EXITS, since the launcher sees only the
  agents' own exit codes (torchrun exits 1 whatever happened to a rank);
- an interrupt (SIGINT/SIGTERM, which torch's agent forwards to the ranks) ends it with 128 + the
  signal, without a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys

from real.interrupt import signal_of
from real.lifeline import announce_parent, die_with_parent
from syncsim.arguments import fail
from syncsim.files import write_atomic

__all__ = ["main", "EXITS_ENV", "read_exits"]

EXITS_ENV = "SYNCSIM_EXITS"


def read_exits(paths) -> dict[int, int]:
    """The rank exit statuses the agents recorded (files that do not exist are agents that did not end)."""
    exits = {}
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            exits.update({int(rank): code for rank, code in json.loads(open(path).read()).items()})
    return exits


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import config_from_args, parse_args, run

    shown = io.StringIO()
    try:
        with contextlib.redirect_stderr(shown):
            args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        if exit_.code:  # torchrun's argparse printed its usage and the error: keep the error's line
            lines = [line for line in shown.getvalue().splitlines() if line.strip()]
            return fail("real.agent", lines[-1].split("error: ", 1)[-1] if lines else "bad options")
        return 0
    try:
        config_from_args(copy.deepcopy(args))  # torchrun's own checks of its options (--nnodes x), before any start
    except ValueError as err:
        return fail("real.agent", err)
    die_with_parent()
    announce_parent()  # the ranks this agent starts check it is alive
    exits_file = os.environ.get(EXITS_ENV)
    try:
        run(args)
    except ChildFailedError as err:
        if exits_file:
            write_atomic(exits_file, json.dumps({str(rank): f.exitcode for rank, f in err.failures.items()}))
        return 1
    except BaseException as err:
        signum = signal_of(err)
        if signum is None:
            raise
        return 128 + signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
