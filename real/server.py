"""A small parameter server over torch.distributed point-to-point messages.

torch has no parameter server, so this is the one piece the executor builds
itself (docs/architecture.md). Server ranks world..world+K-1 each hold an
equal contiguous shard of the flattened fp32 parameters, a version counter
and a clock table (completed pushes per worker). Workers talk to every server
with a 3-int header on tag HEADER followed, for a push, by the gradient shard
in the wire precision on tag PAYLOAD; a server answers a pull with its slowest clock on tag CLOCK and
its shard on tag REPLY, and a satisfied clock wait with its slowest clock on
tag WAKE. A worker sends a wait only when the slowest clock it last heard of
does not already allow it to go on (syncsim.schemes.actions). Messages
between one pair of ranks arrive in order (gloo pairs are ordered TCP
streams). A server reads each worker's messages in a thread of its own, so
transfers to and from different workers run side by side and share the
server's link (see Server.run), and applies pushes as their payloads arrive.

Semantics are syncsim.schemes.actions': each worker's gradient is weighed by
1/W; ``aggregate`` pushes are applied W at a time as one version, the others
on arrival, one version each; a wait is answered once min(clocks) >= the
threshold the worker sends (its clock minus the slack). The first server's
update log is the run's updates.csv: it sees every push and every pull, so it
knows the version each gradient read (the version at that worker's last pull)
and the version it was applied to. With several servers, async arrivals can
interleave differently on each shard; the first shard's order is reported.
"""

from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist

from real.heartbeat import OWN, Quiet, mark
from real.trace import Recorder

__all__ = ["Server", "Client", "shard_bounds"]

HEADER, PAYLOAD, REPLY, WAKE, CLOCK = 1, 2, 3, 4, 5
PUSH, PULL, WAIT, STOP = 1, 2, 3, 4


def shard_bounds(numel: int, servers: int) -> list[tuple[int, int]]:
    """Equal contiguous shards (sizes differ by at most one element)."""
    base, extra = divmod(numel, servers)
    bounds, start = [], 0
    for k in range(servers):
        end = start + base + (k < extra)
        bounds.append((start, end))
        start = end
    return bounds


class Server:
    def __init__(self, rank: int, world: int, servers: int, flat_params: torch.Tensor, lr: float,
                 wire_dtype: torch.dtype, recorder: Recorder, slow: float = 1.0,
                 fail_step: int | None = None, fail_mode: str = "crash", heartbeat=None):
        self.rank, self.world, self.index = rank, world, rank - world
        start, end = shard_bounds(flat_params.numel(), servers)[self.index]
        self.shard = flat_params[start:end].clone()
        self.lr, self.wire_dtype, self.recorder = lr, wire_dtype, recorder
        self.slow, self.fail_step, self.fail_mode = slow, fail_step, fail_mode
        self.heartbeat = heartbeat or Quiet()  # waits for messages are waits for peers (real.heartbeat)
        self.version = 0
        self.clocks = [0] * world
        self.read_version = [0] * world  # version each worker's last pull started at
        self.round: list[tuple[int, int]] = []
        self.round_sum = torch.zeros_like(self.shard)
        self.waiting: list[tuple[int, int]] = []
        self.step = -1  # the latest push's step, for failure messages
        self.pushes = 0
        self.lock = threading.Lock()

    @property
    def logs_updates(self) -> bool:
        return self.index == 0

    def run(self) -> None:
        # Concurrent flows, as on a real server's NIC, with every receive posted before its message
        # comes. gloo sends a message's bytes only after the receiver has told the sender its receive
        # is posted; a receive posted in advance has told it already, while one from any source is
        # matched, and answered, only when a message announces itself: a round trip through queues
        # that a loaded link fills (tens of milliseconds behind a 20 ms tbf queue). So each worker's
        # connection has a thread of its own, which keeps that worker's next header and next payload
        # receives posted: pushes of several workers stream in side by side, a pull is answered while
        # another worker's payload still arrives, and replies leave side by side. (A single loop that
        # read headers from any source and waited for each payload and reply served one transfer at
        # a time: on the testbed an asynchronous worker's pull queued behind the other's push.) The
        # parameters, version, clocks and waiting list are touched under the lock only.
        finished: queue.Queue = queue.Queue()
        for worker in range(self.world):
            threading.Thread(target=self._serve, args=(worker, finished), daemon=True,
                             name=f"server{self.rank}-worker{worker}").start()
        for _ in range(self.world):  # each connection ends with its worker's STOP, or with an error
            error = finished.get()
            if error is not None:
                raise error

    def _serve(self, worker: int, finished: queue.Queue) -> None:
        error = None
        try:
            header = torch.zeros(3, dtype=torch.int64)
            payload = torch.empty(self.shard.numel(), dtype=self.wire_dtype)
            # Both receives stay posted, the next one posted as soon as the last is read, and are
            # dropped with the process group at the end. The header's matters as much as the
            # payload's: a worker sends its pull request right behind its push, and a request whose
            # receive is posted only once the push has been applied waits for the ready notice to
            # cross the server's loaded outbound queue and come back, during which other workers'
            # pushes land (a 4-worker asynchronous run of the small model at 1 Gbit/s: one or two
            # updates between a worker's push and its pull in 43 % of steps, and a staleness mean of
            # 2.50 where a pull read right behind the push gives W - 1 = 3).
            incoming = dist.irecv(payload, src=worker, tag=PAYLOAD)
            announced = dist.irecv(header, src=worker, tag=HEADER)
            while True:
                with self.heartbeat.waiting_for_peers():
                    announced.wait()
                op, step, arg = (int(v) for v in header)
                if op != STOP:
                    announced = dist.irecv(header, src=worker, tag=HEADER)
                if op == PUSH:
                    with self.heartbeat.waiting_for_peers():
                        incoming.wait()
                    grad = payload.to(torch.float32, copy=True)
                    incoming = dist.irecv(payload, src=worker, tag=PAYLOAD)
                    self._take_push(worker, step, grad, aggregate=bool(arg))
                elif op == PULL:
                    self._answer_pull(worker)
                elif op == WAIT:
                    with self.lock:
                        self.waiting.append((worker, arg))
                        self.wake()
                elif op == STOP:
                    return
                else:
                    raise RuntimeError(f"server rank {self.rank}: unknown message {op} from rank {worker}")
        except BaseException as err:  # handed to run(), which raises it in the main thread
            mark(err, OWN)  # unless a wait for this worker marked it PEER: the main thread cannot tell
            error = err
        finally:
            finished.put(error)

    def _take_push(self, worker: int, step: int, grad: torch.Tensor, aggregate: bool) -> None:
        with self.lock:
            if step > self.step:
                self.step = step
                self.heartbeat.beat(step)
            self.maybe_fail(step)
            t0 = time.perf_counter()
            self.apply(worker, step, grad, aggregate=aggregate)
            if self.slow > 1.0:
                time.sleep((self.slow - 1.0) * (time.perf_counter() - t0))
            self.wake()

    def _answer_pull(self, worker: int) -> None:
        with self.lock:
            self.read_version[worker] = self.version
            reply = self.shard.to(self.wire_dtype, copy=True)  # this version, whatever comes next
            slowest = torch.tensor([min(self.clocks)], dtype=torch.int64)
        with self.heartbeat.waiting_for_peers():
            dist.send(slowest, dst=worker, tag=CLOCK)
            dist.send(reply, dst=worker, tag=REPLY)

    def result(self) -> dict:
        return {"rank": self.rank, "role": "server", "pushes": self.pushes, "version": self.version,
                "step": self.step}

    def apply(self, worker: int, step: int, grad: torch.Tensor, aggregate: bool) -> None:
        self.clocks[worker] += 1
        self.pushes += 1
        now = self.recorder.now()
        if aggregate:
            self.round_sum += grad
            self.round.append((worker, step))
            if len(self.round) < self.world:
                return
            self.shard -= self.lr / self.world * self.round_sum
            self.round_sum.zero_()
            now = self.recorder.now()
            if self.logs_updates:
                for w, s in self.round:
                    self.recorder.update(w, s, self.version, self.version, now)
            self.round = []
        else:
            self.shard -= self.lr / self.world * grad
            if self.logs_updates:
                self.recorder.update(worker, step, self.read_version[worker], self.version, now)
        self.version += 1

    def wake(self) -> None:
        slowest = min(self.clocks)
        ready = [item for item in self.waiting if slowest >= item[1]]
        self.waiting = [item for item in self.waiting if slowest < item[1]]
        for src, _ in ready:
            with self.heartbeat.waiting_for_peers():
                dist.send(torch.tensor([slowest], dtype=torch.int64), dst=src, tag=WAKE)

    def maybe_fail(self, step: int) -> None:
        if self.fail_step is not None and step >= self.fail_step:
            if self.fail_mode == "hang":
                while True:
                    time.sleep(3600)
            raise RuntimeError(f"injected failure (--fail {self.rank}:{self.fail_step})")


class Client:
    """A worker's side of the protocol; returns payload bytes moved so the executor can count them."""

    def __init__(self, world: int, servers: int, numel: int, wire_dtype: torch.dtype):
        self.servers = list(range(world, world + servers))
        self.bounds = shard_bounds(numel, servers)
        self.wire_dtype = wire_dtype
        self.heard = 0  # the slowest clock the servers last told this worker (never ahead of theirs)

    def _headers(self, op: int, step: int, arg: int) -> list:
        header = torch.tensor([op, step, arg], dtype=torch.int64)
        return [dist.isend(header, dst=s, tag=HEADER) for s in self.servers]

    def push(self, flat_grad: torch.Tensor, step: int, aggregate: bool) -> int:
        wire = flat_grad.to(self.wire_dtype)
        works = self._headers(PUSH, step, int(aggregate))
        works += [dist.isend(wire[a:b], dst=s, tag=PAYLOAD) for s, (a, b) in zip(self.servers, self.bounds)]
        for w in works:
            w.wait()
        return wire.numel() * wire.element_size()

    def wait(self, step: int, threshold: int) -> bool:
        """Block until every server's slowest clock is at least ``threshold``; False when the clock last
        heard of allowed it already and no message was sent."""
        if self.heard >= threshold:
            return False
        wake = [torch.zeros(1, dtype=torch.int64) for _ in self.servers]
        works = [dist.irecv(t, src=s, tag=WAKE) for t, s in zip(wake, self.servers)]
        works += self._headers(WAIT, step, threshold)
        for w in works:
            w.wait()
        self.heard = max(self.heard, min(int(t) for t in wake))
        return True

    def pull(self, step: int) -> tuple[torch.Tensor, int]:
        wire = torch.empty(self.bounds[-1][1], dtype=self.wire_dtype)
        clocks = [torch.zeros(1, dtype=torch.int64) for _ in self.servers]
        works = [dist.irecv(t, src=s, tag=CLOCK) for t, s in zip(clocks, self.servers)]
        works += [dist.irecv(wire[a:b], src=s, tag=REPLY) for s, (a, b) in zip(self.servers, self.bounds)]
        works += self._headers(PULL, step, 0)
        for w in works:
            w.wait()
        self.heard = max(self.heard, min(int(t) for t in clocks))
        return wire.float(), wire.numel() * wire.element_size()

    def stop(self) -> None:
        for w in self._headers(STOP, -1, 0):
            w.wait()
