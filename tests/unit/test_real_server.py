"""real/server.py's arithmetic and protocol, in process: scripted messages stand in for gloo.

The distributed tests (tests/real) check whole runs; these drive one Server
(and one Client) through exact message sequences, so that every rule — the
1/W weight, a round applied as one version, the version a gradient read, the
SSP wake-up threshold, shard bounds, wire rounding — is checked in
milliseconds (and mutation runs can afford to run them per mutant).
"""

from __future__ import annotations

import threading

import pytest
import torch

import real.server as server_module
from real.heartbeat import OWN, PEER, Beat, Heartbeat, Quiet, came_from_peer, mark, origin
from real.server import CLOCK, HEADER, PAYLOAD, PULL, PUSH, REPLY, STOP, WAIT, WAKE, Client, Server, shard_bounds
from real.trace import Recorder

LR = 0.3  # not 0.5: with W = 2, lr/W would equal lr**W


class Wire:
    """Scripted point-to-point messages, delivered in the script's order to whichever thread asks.

    The server reads each worker's connection in a thread of its own; the script fixes the order in
    which messages arrive across workers. A message is handed over only when it is the script's next
    one, and only after the thread that took the previous message has finished with it (it asks the
    wire for its next message, or its connection ends with STOP): so the script's order is the
    server's processing order, as if each message arrived after the last was handled. Receives match
    by source and tag, as gloo's do; sends are recorded.
    """

    PATIENCE = 10.0  # seconds a thread waits for its message before the test fails, rather than hangs
    opened: list = []  # every wire made, so that each test's are closed when it ends (no_server_thread_outlives)

    def __init__(self, script=()):
        self.script = list(script)
        self.sent = []
        self.pending = []
        self.events = []  # ("posted", src, tag) for every receive as it is posted, in order
        self.turn = None  # the thread handling the last message handed out
        self.cond = threading.Condition()
        self.closed = False
        Wire.opened.append(self)

    def close(self):
        """The test is over: every thread still waiting for a message, or asking for one later, gets an
        error, as from a closed connection, and ends."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def take(self, tensor, src, tag):
        me = threading.get_ident()
        with self.cond:
            if self.turn == me:
                self.turn = None
                self.cond.notify_all()
            ready = lambda: self.closed or (  # noqa: E731
                self.turn in (None, me) and self.script and self.script[0][:2] == (src, tag))
            if not self.cond.wait_for(ready, timeout=self.PATIENCE):
                raise AssertionError(f"no message from rank {src} on tag {tag} next in the script: {self.script[:1]}")
            if self.closed:
                raise RuntimeError("Connection closed: the test that scripted this wire has ended")
            _, _, value = self.script.pop(0)
            assert tensor.shape == value.shape, "gloo needs a receive buffer of the message's size"
            tensor.copy_(value)
            stopping = tag == HEADER and int(value[0]) == STOP
            self.turn = None if stopping else me
            self.cond.notify_all()
        return src

    def recv(self, tensor, src=None, tag=None):
        assert src is not None, "the server receives from one worker's connection, never from any source"
        self.events.append(("posted", src, tag))
        return self.take(tensor, src, tag)

    def send(self, tensor, dst, tag):
        with self.cond:
            self.sent.append((dst, tag, tensor.clone()))

    def isend(self, tensor, dst, tag):
        return self.work(lambda: self.send(tensor, dst, tag))

    def irecv(self, tensor, src, tag):
        self.events.append(("posted", src, tag))
        return self.work(lambda: self.take(tensor, src, tag))

    def work(self, complete):
        """A request that completes — its message sent, or its buffer filled — when waited on."""
        work = Work(complete)
        self.pending.append(work)
        return work

    @property
    def unfinished(self) -> int:
        return sum(not w.done for w in self.pending)


@pytest.fixture(autouse=True)
def no_server_thread_outlives_its_test(monkeypatch):
    """A Server serves each worker from a thread that calls real.server's module-level ``dist``; when one
    thread fails, run() raises and the others go on. Left running, such a thread would call the *next*
    test's wire (the module attribute, patched anew) and take a message scripted for that test's own
    thread, which then waits for a message that never comes (seen once in CI: "no message from rank 0 on
    tag 1 next in the script: []"). So each test's wires are closed when it ends, and its server threads
    joined, before the fake ``dist`` is taken away (this fixture ends before monkeypatch's undo)."""
    yield
    while Wire.opened:
        Wire.opened.pop().close()
    for thread in threading.enumerate():
        if thread.name.startswith("server") and "-worker" in thread.name:
            thread.join(Wire.PATIENCE)
            assert not thread.is_alive(), f"{thread.name} still runs after its test ended"


class Work:
    def __init__(self, complete):
        self.complete, self.done = complete, False

    def wait(self):
        if not self.done:
            self.complete()
            self.done = True
        return True


def header(op, step=0, arg=0):
    return torch.tensor([op, step, arg], dtype=torch.int64)


def push(worker, step, grad, aggregate):
    return [(worker, HEADER, header(PUSH, step, int(aggregate))), (worker, PAYLOAD, grad)]


def pull(worker, step=0):
    return [(worker, HEADER, header(PULL, step))]


def wait(worker, threshold, step=0):
    return [(worker, HEADER, header(WAIT, step, threshold))]


def stop(world):
    return [(w, HEADER, header(STOP, -1)) for w in range(world)]


def serve(monkeypatch, script, world=2, servers=1, index=0, params=None, wire=torch.float32, **options):
    params = torch.tensor([1.0, -2.0, 3.0, 0.25, -0.5]) if params is None else params
    fake = Wire(script)
    monkeypatch.setattr(server_module, "dist", fake)
    server = Server(world + index, world, servers, params, LR, wire, Recorder(0.0), **options)
    server.run()
    assert fake.script == [], "the server stopped before the script ended"
    return server, fake.sent, params


def replies(sent, tag):
    return [(dst, value) for dst, t, value in sent if t == tag]


def test_a_synchronous_round_applies_the_mean_gradient_once_as_one_version(monkeypatch):
    g0, g1 = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([-3.0, 0.5, 1.0, 8.0, 0.0])
    script = [*push(0, 0, g0, True), *pull(1), *push(1, 0, g1, True), *pull(0), *stop(2)]
    server, sent, x0 = serve(monkeypatch, script)
    # half a round changes nothing: worker 1's pull between the pushes still gets x0
    (who, before), (_, after) = replies(sent, REPLY)
    assert who == 1 and torch.equal(before, x0)
    expected = x0 - LR * (g0 + g1) / 2
    torch.testing.assert_close(after, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(server.shard, expected, rtol=0, atol=1e-7)
    assert server.version == 1 and server.clocks == [1, 1] and server.pushes == 2
    # both rows read and land in version 0, in arrival order
    assert [row[:5] for row in server.recorder.updates] == [(0, 0, 0, 0, 0), (1, 0, 0, 0, 0)]


def test_asynchronous_pushes_weigh_one_over_w_and_read_the_version_of_the_last_pull(monkeypatch):
    world = 4
    g = [torch.full((5,), float(v)) for v in (1, 2, 3)]
    script = [*push(0, 0, g[0], False), *pull(0), *pull(2), *push(2, 0, g[1], False), *push(0, 1, g[2], False),
              *stop(world)]
    server, _, x0 = serve(monkeypatch, script, world=world)
    torch.testing.assert_close(server.shard, x0 - LR / world * (g[0] + g[1] + g[2]), rtol=0, atol=1e-7)
    assert server.version == 3 and server.clocks == [2, 0, 1, 0]
    # (worker, step, version read, version applied, staleness): worker 0's second push read the
    # version its pull saw (1) and lands after worker 2's (2)
    assert [row[:5] for row in server.recorder.updates] == [(0, 0, 0, 0, 0), (2, 0, 1, 1, 0), (0, 1, 1, 2, 1)]


def test_a_wait_is_answered_once_the_slowest_clock_reaches_its_threshold(monkeypatch):
    g = torch.ones(5)
    script = [*wait(1, 0), *push(0, 0, g, False), *wait(0, 1), *push(0, 1, g, False), *wait(0, 2),
              *push(1, 0, g, False), *push(1, 1, g, False), *stop(2)]
    server, sent, _ = serve(monkeypatch, script)
    wakes = replies(sent, WAKE)
    # threshold 0 is met at once; worker 0's waits for 1 and 2 are met by worker 1's first and second push,
    # each answered with the slowest clock then (the client keeps it: Client.heard)
    assert [(dst, int(v)) for dst, v in wakes] == [(1, 0), (0, 1), (0, 2)]
    assert [int(t) for _, t, _ in sent] == [WAKE, WAKE, WAKE]


def test_a_wait_already_satisfied_is_answered_once(monkeypatch):
    g = torch.ones(5)
    script = [*push(0, 0, g, False), *push(1, 0, g, False), *push(0, 1, g, False), *push(1, 1, g, False),
              *wait(0, 1), *push(0, 2, g, False), *stop(2)]
    _, sent, _ = serve(monkeypatch, script)
    # the slowest clock (2) is past the threshold (1) when the wait arrives: one answer, and no second
    # one when the next push wakes the waiters again
    assert [(dst, int(v)) for dst, v in replies(sent, WAKE)] == [(0, 2)]


def test_a_server_holds_its_shard_and_only_the_first_logs_updates(monkeypatch):
    params = torch.arange(7, dtype=torch.float32)
    g = torch.tensor([4.0, 8.0, 12.0])  # shard 1 of 7 elements over 2 servers is [4, 7)
    # one worker (rank 0), two servers (ranks 1 and 2): the second server is rank 2, shard index 1
    server, sent, _ = serve(monkeypatch, [*push(0, 0, g, False), *pull(0), *stop(1)], world=1, servers=2,
                            index=1, params=params)
    torch.testing.assert_close(server.shard, params[4:7] - LR * g, rtol=0, atol=1e-7)
    assert server.recorder.updates == [] and server.version == 1


def test_pulls_reply_in_the_wire_precision_and_pushes_arrive_in_it(monkeypatch):
    x0 = torch.tensor([1.0 + 2.0**-9, 3.0, -0.1, 7.0, 1e-3])
    g = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5]).to(torch.bfloat16)
    server, sent, _ = serve(monkeypatch, [*pull(0), *push(0, 0, g, False), *stop(2)], params=x0,
                            wire=torch.bfloat16)
    (_, reply), = replies(sent, REPLY)
    assert reply.dtype == torch.bfloat16 and torch.equal(reply, x0.to(torch.bfloat16))
    # the master shard stays fp32: the update lands on the unrounded values
    torch.testing.assert_close(server.shard, x0 - LR / 2 * g.float(), rtol=0, atol=1e-7)


@pytest.mark.parametrize("op", [0, STOP + 1])
def test_an_unknown_message_is_an_error_naming_it(monkeypatch, op):
    with pytest.raises(RuntimeError, match=f"unknown message {op} from rank 1"):
        serve(monkeypatch, [(1, HEADER, header(op))])


class Beats(Quiet):
    """A heartbeat that notes the steps it is told of."""

    def __init__(self):
        self.steps = []

    def beat(self, step=None, waiting=False):
        if step is not None:
            self.steps.append(step)


def test_the_server_reports_the_latest_step_pushed(monkeypatch):
    # the step a failure message names and the heartbeat records (real.heartbeat)
    beats = Beats()
    g = torch.ones(5)
    server, _, _ = serve(monkeypatch, [*push(0, 0, g, False), *push(1, 0, g, False), *push(0, 2, g, False),
                                       *push(1, 1, g, False), *stop(2)], heartbeat=beats)
    assert server.step == 2 and beats.steps == [0, 2]  # each new latest step once


@pytest.mark.parametrize("slow,expected", [(1.0, []), (1.5, [2.5]), (None, [])])
def test_a_slow_server_sleeps_factor_minus_one_times_its_work(monkeypatch, slow, expected):
    # --slow RANK:F on a server rank: each push takes F times as long (the work, then (F-1)x the work
    # asleep); F = 1 (every server not named) never sleeps, and neither does a server given no factor
    clock, slept = iter([4.0, 9.0]), []
    monkeypatch.setattr(server_module.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(server_module.time, "sleep", slept.append)
    options = {} if slow is None else {"slow": slow}
    serve(monkeypatch, [*push(0, 0, torch.ones(5), False), *stop(2)], **options)
    assert slept == expected


def test_the_request_behind_a_push_has_its_receive_posted_before_the_push_is_applied(monkeypatch):
    # gloo moves a message's bytes only once its receiver has posted the receive and told the sender so
    # (gloo/transport/tcp/pair.cc: a send waits for the peer's notice that its receive is ready). A worker
    # sends its pull request right behind its push; were the server to post the receive for that request
    # only after applying the push, the request would wait for a notice through the server's loaded
    # outbound queue and back, and other workers' pushes would land between this worker's push and its
    # pull (measured on the testbed: in 43 % of a 4-worker asynchronous run's steps, against 9 % with
    # the receive posted in advance), lowering the staleness below the W - 1 a pull read right behind
    # the push gives. So every header receive is posted as soon as the last header has been read.
    applied = server_module.Server.apply

    def logged_apply(self, worker, *args, **kwargs):
        Wire.opened[-1].events.append(("applied", worker))
        return applied(self, worker, *args, **kwargs)

    monkeypatch.setattr(server_module.Server, "apply", logged_apply)
    serve(monkeypatch, [*push(0, 0, torch.ones(5), False), *pull(0), *stop(1)], world=1)
    events = Wire.opened[-1].events
    headers = [i for i, event in enumerate(events) if event == ("posted", 0, HEADER)]
    assert events.count(("applied", 0)) == 1 and len(headers) >= 2
    assert headers[1] < events.index(("applied", 0)), events  # the pull's receive was waiting before the apply


def test_a_server_that_got_no_push_reports_no_step(monkeypatch):
    # a failure before the first push names no step: the result says -1, below every real step (0, 1, ...)
    server, _, _ = serve(monkeypatch, [*pull(0), *stop(2)])
    assert server.result() == {"rank": 2, "role": "server", "pushes": 0, "version": 0, "step": -1}


@pytest.mark.parametrize("numel,servers", [(1, 1), (7, 2), (10, 3), (5, 5), (101_770, 4), (3, 4)])
def test_shards_are_contiguous_cover_everything_and_differ_by_at_most_one(numel, servers):
    bounds = shard_bounds(numel, servers)
    assert len(bounds) == servers and bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_the_client_shards_pushes_and_assembles_pulls(monkeypatch):
    shards = [[1.0, 2.0], [3.0, 4.0], [5.0]]  # 5 values over 3 servers (ranks 2, 3, 4)
    clocks = [(2 + k, CLOCK, torch.tensor([c])) for k, c in enumerate((7, 5, 6))]
    fake = Wire(clocks + [(2 + k, REPLY, torch.tensor(v, dtype=torch.float16)) for k, v in enumerate(shards)])
    monkeypatch.setattr(server_module, "dist", fake)
    client = Client(world=2, servers=3, numel=5, wire_dtype=torch.float16)
    grad = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    assert client.push(grad, step=3, aggregate=True) == 5 * 2  # fp16: two bytes a value
    assert fake.unfinished == 0  # every send completed before push returns
    headers = [(dst, [int(v) for v in t]) for dst, tag, t in fake.sent if tag == HEADER]
    assert headers == [(2, [PUSH, 3, 1]), (3, [PUSH, 3, 1]), (4, [PUSH, 3, 1])]
    payloads = [(dst, t) for dst, tag, t in fake.sent if tag == PAYLOAD]
    assert [dst for dst, _ in payloads] == [2, 3, 4] and [len(t) for _, t in payloads] == [2, 2, 1]
    assert torch.equal(torch.cat([t for _, t in payloads]), grad.to(torch.float16))
    fake.sent.clear()
    flat, nbytes = client.pull(step=3)
    assert fake.unfinished == 0  # every shard arrived before pull returns
    assert nbytes == 10 and flat.dtype == torch.float32 and flat.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [(dst, [int(v) for v in t]) for dst, _, t in fake.sent] == [(k, [PULL, 3, 0]) for k in (2, 3, 4)]
    assert client.heard == 5  # the slowest clock is the least any server reported


def test_the_client_waits_for_every_server_with_its_threshold(monkeypatch):
    fake = Wire([(1, WAKE, torch.tensor([5])), (2, WAKE, torch.tensor([5]))])  # one int each
    monkeypatch.setattr(server_module, "dist", fake)
    client = Client(world=1, servers=2, numel=4, wire_dtype=torch.float32)
    assert client.wait(step=6, threshold=4) is True
    assert [(dst, [int(v) for v in t]) for dst, _, t in fake.sent] == [(1, [WAIT, 6, 4]), (2, [WAIT, 6, 4])]
    assert fake.script == [] and fake.unfinished == 0
    assert client.heard == 5


@pytest.mark.parametrize("heard, threshold, asks", [(3, 3, False), (4, 3, False), (2, 3, True)])
def test_the_client_asks_only_when_the_clock_it_heard_of_is_behind(monkeypatch, heard, threshold, asks):
    # SSP's cached view (syncsim.schemes.actions, WaitForClock): the slowest clock last heard of is never
    # ahead of the servers', so when it already meets the threshold the wait is met without a message
    fake = Wire([(1, WAKE, torch.tensor([threshold]))] if asks else [])
    monkeypatch.setattr(server_module, "dist", fake)
    client = Client(world=1, servers=1, numel=4, wire_dtype=torch.float32)
    client.heard = heard
    assert client.wait(step=9, threshold=threshold) is asks
    assert [(dst, [int(v) for v in t]) for dst, _, t in fake.sent] == ([(1, [WAIT, 9, threshold])] if asks else [])
    assert fake.script == [] and client.heard == max(heard, threshold)


def test_a_pull_is_answered_with_the_slowest_clock_before_the_shard(monkeypatch):
    g = torch.ones(5)
    script = [*push(0, 0, g, False), *pull(0), *push(1, 0, g, False), *push(0, 1, g, False), *pull(0), *stop(2)]
    _, sent, _ = serve(monkeypatch, script)
    answers = [(dst, tag, int(v[0]) if tag == CLOCK else None) for dst, tag, v in sent]
    # worker 1 had pushed nothing at the first pull (slowest clock 0), once at the second (1)
    assert answers == [(0, CLOCK, 0), (0, REPLY, None), (0, CLOCK, 1), (0, REPLY, None)]


class BrokenWire(Wire):
    """The script, then a closed connection: the next receive from ``lost`` raises, as gloo's does."""

    def __init__(self, script, lost):
        super().__init__(script)
        self.lost = lost

    def take(self, tensor, src, tag):
        if src == self.lost and not any(m[0] == src for m in self.script):
            raise RuntimeError(f"Connection closed by peer [127.0.0.1]:{29500 + src}")
        return super().take(tensor, src, tag)


def test_a_lost_worker_is_the_servers_peer_failure_whatever_another_thread_is_doing(monkeypatch):
    # The server serves each worker from a thread; when worker 1's connection closes, worker 0's
    # thread may be applying a push (phase "work"). The exception itself says it came out of a wait
    # for a peer, so real.worker names the server a consequence, not the cause (real.failure).
    g = torch.ones(5)
    monkeypatch.setattr(server_module, "dist", BrokenWire([*push(0, 0, g, False)], lost=1))
    server = Server(2, 2, 1, torch.zeros(5), LR, torch.float32, Recorder(0.0))
    with pytest.raises(RuntimeError, match="Connection closed") as caught:
        server.run()
    assert origin(caught.value) == PEER and came_from_peer(caught.value, waiting=False)


@pytest.mark.parametrize("script,match", [
    ([*push(0, 3, torch.ones(5), False)], "injected failure"),
    ([(1, HEADER, header(STOP + 1))], "unknown message"),
])
def test_a_servers_own_failure_is_its_own_whatever_another_thread_is_waiting_for(monkeypatch, script, match):
    # the opposite race: worker 0's thread waits for a message (phase "wait") when worker 1's thread fails
    monkeypatch.setattr(server_module, "dist", Wire(script))
    server = Server(2, 2, 1, torch.zeros(5), LR, torch.float32, Recorder(0.0), fail_step=3)
    with pytest.raises(RuntimeError, match=match) as caught:
        server.run()
    assert origin(caught.value) == OWN and not came_from_peer(caught.value, waiting=True)


@pytest.mark.parametrize("raised,waiting,expected", [
    (RuntimeError("x"), True, True), (RuntimeError("x"), False, False),  # unmarked: the phase decides
])
def test_an_unmarked_failure_is_a_peers_when_it_was_caught_waiting(raised, waiting, expected):
    # DDP's backward waits for its all-reduce outside any waiting block: the phase is all there is
    assert origin(raised) is None and came_from_peer(raised, waiting) is expected


@pytest.mark.parametrize("kind", ["heartbeat", "quiet"])
def test_a_wait_marks_the_exception_it_raises_and_an_inner_mark_wins(tmp_path, kind):
    heartbeat = Heartbeat(tmp_path, 0, 1, timeout=5.0) if kind == "heartbeat" else Quiet()
    with pytest.raises(RuntimeError) as caught:
        with heartbeat.waiting_for_peers():
            raise RuntimeError("peer gone")
    assert origin(caught.value) == PEER
    with pytest.raises(RuntimeError) as caught:
        with heartbeat.waiting_for_peers():
            err = RuntimeError("own")
            mark(err, OWN)
            raise err
    assert origin(caught.value) == OWN
    if kind == "heartbeat":  # the phase stays at "wait" after a failed wait (what real.failure reads)
        assert heartbeat.waiting and Beat.read(tmp_path, 0).waiting
