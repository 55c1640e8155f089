"""Ranks forked inside a testbed host from one server that imported torch once.

A study starts a hundred runs of two to five ranks on this machine's two cores, and a rank started as
``ip netns exec NS python -m MODULE`` spends its first seconds importing torch: three ranks importing it
at once took 3.9 s, longer than many runs' steps. ``start`` forks each rank instead from a fork server:
one process, started with the launcher's environment, that imported the ranks' modules (PRELOAD) and
then only forks. The child moves itself into its host as ``ip netns exec`` moves a command (iproute2,
lib/namespace.c, netns_switch): it joins the host's network namespace (setns(2)), takes a mount
namespace of its own whose changes do not propagate back (unshare(2), then / made a recursive slave),
mounts the sysfs that describes its network namespace on /sys, and binds each file of /etc/netns/NS/
over its namesake in /etc (ip-netns(8)). It then runs ``MODULE`` as ``python -m`` would (runpy, as
``__main__``; a SystemExit's code is its exit status, an uncaught exception's traceback goes to its
output and its status is 1, atexit handlers run) with the environment, working folder and output file
the launcher gave it, in a session of its own as ``Popen(start_new_session=True)`` makes one.

The standard library's multiprocessing fork server is not used: each of its children imports the
launcher's ``__main__`` module again (multiprocessing.spawn's preparation), which is the whole study.

Lifelines (real.lifeline): the server dies with the launcher (parent-death signal) and stops on the
launcher's EOF; a rank's parent is the server, whose pid it is told in SYNCSIM_PARENT_PID, so a rank
dies with the server as it died with the launcher. libgomp read OMP_NUM_THREADS when the server loaded
torch, so a child sets torch's thread count from the variable it was given.

Protocol: the launcher writes one JSON request per line to the server's stdin (``id``, ``namespace``,
``module``, ``argv``, ``env``, ``log``, ``cwd``); the server answers on its stdout with
``{"id", "pid"}`` once forked and ``{"id", "exit"}`` once the rank has been reaped (the exit status as
Popen's returncode: negative for a signal). A request the server cannot carry out ends it, with its
traceback on the launcher's stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from real.lifeline import PARENT_ENV, die_with_parent
from real.testbed.namespaces import NETNS_ETC

__all__ = ["start", "ForkedRank", "PRELOAD", "signal_group", "enter"]

# What the testbed's ranks import: loaded once by the server, so a forked rank finds them loaded.
# torch imports torch._dynamo (with sympy) the first time an optimizer is built, and DDP and the sharded
# schemes the rest of torch.distributed: 806 modules and 1.5 s of a core in each rank that builds an
# optimizer, measured here with torch 2.13 (1.0 s once in the server). Imported by the server they start no
# thread (the fork is still safe) and a run's ranks import nothing more.
PRELOAD = ("torch", "torch.distributed", "real.worker", "real.calibration.ranks",
           "pandas",  # rank 0 merges the ranks' files with pandas (real.trace.merge)
           "torch._dynamo", "torch.nn.parallel", "torch.distributed.fsdp", "torch.distributed.tensor")
NETNS_RUN = Path("/run/netns")  # where `ip netns add` keeps a handle on each namespace (ip-netns(8))
START_TIMEOUT = 60.0  # seconds the server may take to import PRELOAD and fork the first rank
# <sched.h>, <sys/mount.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
MNT_DETACH = 2


class ForkServer:
    """The launcher's side: the server process, its answers read as they come."""

    def __init__(self) -> None:
        env = dict(os.environ, **{PARENT_ENV: str(os.getpid())})
        env.setdefault("OMP_NUM_THREADS", "1")  # the ranks' default (real.testbed.launcher), read at torch's load
        command = [sys.executable, "-c", "from real.testbed.forkserver import serve; serve()"]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.pending = b""
        self.next_id = 0
        self.pids: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self.gone = False

    def close(self) -> None:
        """End the server (it stops any rank still running) and wait for it."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.gone = True

    def alive(self) -> bool:
        return not self.gone and self.proc.poll() is None

    def request(self, **fields) -> int:
        self.next_id += 1
        line = json.dumps(dict(fields, id=self.next_id)) + "\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()
        return self.next_id

    def pump(self, timeout: float = 0.0) -> None:
        """Read the answers that have come (waiting up to ``timeout`` for the first)."""
        if self.gone:
            return
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            return
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:  # the server ended: its ranks died with it (parent-death signal)
                self.gone = True
                for rank in self.pids:
                    self.exits.setdefault(rank, -signal.SIGKILL)
                break
            self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            answer = json.loads(line)
            if "pid" in answer:
                self.pids[answer["id"]] = answer["pid"]
            else:
                self.exits[answer["id"]] = answer["exit"]

    def fork(self, **fields) -> tuple[int, int]:
        """Fork one rank; (request id, pid)."""
        ident = self.request(**fields)
        deadline = time.monotonic() + START_TIMEOUT
        while ident not in self.pids:
            if self.gone or time.monotonic() > deadline:
                raise RuntimeError(f"the fork server ended or did not answer within {START_TIMEOUT:g} s "
                                   f"(exit code {self.proc.poll()}); its errors are on this process's stderr")
            self.pump(0.1)
        return ident, self.pids[ident]


_server: ForkServer | None = None
_owner: int | None = None  # the process that started _server: a child of it must not share its pipes


def _the_server() -> ForkServer:
    global _server, _owner
    if _server is None or _owner != os.getpid() or not _server.alive():
        _server, _owner = ForkServer(), os.getpid()
    return _server


class ForkedRank:
    """A forked rank seen as a ``subprocess.Popen``: ``pid``, ``poll()``, ``wait(timeout)``, ``returncode``
    (negative for a signal, as Popen's)."""

    def __init__(self, server: ForkServer, ident: int, pid: int, args: list[str]):
        self.server, self.ident, self.pid, self.args = server, ident, pid, args

    @property
    def returncode(self) -> int | None:
        return self.server.exits.get(self.ident)

    def poll(self) -> int | None:
        self.server.pump()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.1 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.server.pump(min(left, 0.1))
        return self.returncode


def start(namespace: str | None, module: str, argv: list[str], env: dict[str, str], log: str | Path) -> ForkedRank:
    """``ip netns exec namespace python -m module argv`` with ``env``, its output to ``log``, forked from
    the fork server (started at the first call; it lives as long as this process). ``namespace`` None:
    the rank stays in the machine's own network (``python -m module argv``)."""
    if namespace is not None and not (NETNS_RUN / namespace).exists():
        raise FileNotFoundError(f"no network namespace {namespace!r} (no {NETNS_RUN / namespace})")
    server = _the_server()
    ident, pid = server.fork(namespace=namespace, module=module, argv=list(argv), env=dict(env),
                             log=str(log), cwd=os.getcwd())
    return ForkedRank(server, ident, pid, [module, *argv])


def signal_group(proc, signum: int) -> None:
    """``signum`` to the session ``proc`` leads (a Popen with start_new_session or a ForkedRank); to the
    process alone if it has not yet made its session; nothing if it has ended."""
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            pass


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def enter(namespace: str) -> None:
    """Move this single-threaded process into a testbed host as ``ip netns exec`` does (see the module doc)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    handle = os.open(NETNS_RUN / namespace, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(handle, CLONE_NEWNET), f"setns to network namespace {namespace}")
    finally:
        os.close(handle)
    _check(libc.unshare(CLONE_NEWNS), "unshare of the mount namespace")
    _check(libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None), "making / a recursive slave")
    flags = 0
    if libc.umount2(b"/sys", MNT_DETACH) != 0 and os.statvfs("/sys").f_flag & os.ST_RDONLY:
        flags = MS_RDONLY  # no sysfs to detach: iproute2 keeps a read-only /sys read-only
    _check(libc.mount(namespace.encode(), b"/sys", b"sysfs", flags, None), "mounting /sys")
    own = NETNS_ETC / namespace
    for path in sorted(own.iterdir()) if own.is_dir() else []:
        target = Path("/etc") / path.name
        if target.exists():
            _check(libc.mount(str(path).encode(), str(target).encode(), b"none", MS_BIND, None), f"binding {path}")


def _exit_status(exit_: SystemExit) -> int:
    """The status ``python`` exits with for an uncaught SystemExit (its code: None 0, an int itself,
    anything else printed and 1)."""
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=sys.stderr)
    return 1


def _rank(request: dict, parent: int) -> int:
    """In the forked child: its session, its host, its output, its environment, then its module."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)  # from here on a failure's traceback is in the rank's log (serve prints it)
    os.close(out)
    os.close(null)
    if request["namespace"] is not None:
        enter(request["namespace"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[PARENT_ENV] = str(parent)  # the rank's parent is this server (real.lifeline checks it)
    die_with_parent()  # whatever the module does: the server dies with the launcher, the rank with the server
    threads = request["env"].get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    sys.argv = [request["module"], *request["argv"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exit_:
        status = _exit_status(exit_)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return status


def serve() -> None:
    """The server: import PRELOAD, then fork a rank for each request until the launcher's EOF."""
    die_with_parent()
    answers = os.fdopen(os.dup(1), "w", buffering=1)  # stray prints of the ranks' modules go to stderr
    os.dup2(2, 1)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name in PRELOAD:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()  # SIGCHLD writes here, so a reaped rank is reported at once
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the ranks itself
    ranks: dict[int, int] = {}  # pid -> request id
    pending = b""
    while True:
        readable = select.select([requests, wake_r], [], [])[0]
        if wake_r in readable:
            os.read(wake_r, 4096)
        _report_exits(ranks, answers)
        if requests not in readable:
            continue
        chunk = requests.read(65536)
        if not chunk:  # the launcher is done (or gone): stop what it left running, then end
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = _fork_rank(request, (wake_r, wake_w, requests.fileno(), answers.fileno()))
            ranks[pid] = request["id"]
            answers.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")


def _report_exits(ranks: dict[int, int], answers) -> None:
    """Reap every rank that has ended and answer its request id with its exit status."""
    while ranks:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        answers.write(json.dumps({"id": ranks.pop(pid), "exit": os.waitstatus_to_exitcode(status)}) + "\n")


def _fork_rank(request: dict, server_fds: tuple[int, ...]) -> int:
    """Fork the rank ``request`` asks for; in the parent its pid. The child restores the signals the server
    changed, closes the server's own descriptors and never returns."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for fd in server_fds:
                os.close(fd)
            status = _rank(request, parent)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    return pid
