"""The executor's arithmetic handlers in process: averaging, loading, pushing, pulling, waiting, applying.

tests/real runs the executor for real and checks its final parameters against
references; these call its handlers one at a time on a stand-in worker (a
small model, a recording client, a fake all-reduce that adds the other
replicas as they arrive on the wire), so that every number a handler
produces — the average, the bytes it counts, the version it logs, the clock
threshold it sends — is checked in milliseconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import real.executor as executor_module
from real.executor import Executor, flat_params
from real.heartbeat import Quiet
from real.trace import Recorder
from syncsim.schemes import AllReduceGradients, AverageParameters, LocalUpdate, Pull, Push, WaitForClock


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))  # 8 + 3 = 11 parameters in four tensors


def worker(**attrs) -> SimpleNamespace:
    """The executor's state a handler reads, with the handlers bound to it."""
    net = model()
    me = SimpleNamespace(model=net, worker=1, step=5, version=7, read_version=6, bytes_sent=100, clock=3,
                         pending_local=[], recorder=Recorder(0.0), device=torch.device("cpu"),
                         wire_dtype=torch.float32, spec=SimpleNamespace(precision="fp32"),
                         cfg=SimpleNamespace(world=3), group=None, scaler=None,
                         optimizer=torch.optim.SGD(net.parameters(), lr=0.5), backward_end=2.0, buckets=[],
                         heartbeat=Quiet())
    for name in ("_load_flat", "_apply", "_fold_local_steps"):
        setattr(me, name, getattr(Executor, name).__get__(me))
    vars(me).update(attrs)
    return me


def call(handler: str, me, action) -> None:
    getattr(Executor, handler)(me, action)


def test_flat_params_and_load_flat_round_trip_in_parameter_order():
    me = worker()
    values = torch.arange(11, dtype=torch.float32)
    me._load_flat(values)
    assert torch.equal(flat_params(me.model), values)
    weight = me.model[0].weight
    assert weight.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and me.model[1].bias.tolist() == [10.0]


@pytest.mark.parametrize("precision,dtype,itemsize", [("fp16", torch.float16, 2), ("bf16", torch.bfloat16, 2)])
def test_16_bit_averaging_is_the_sum_of_rounded_replicas_over_w(monkeypatch, precision, dtype, itemsize):
    me = worker(wire_dtype=dtype, spec=SimpleNamespace(precision=precision), pending_local=[3, 4])
    mine = flat_params(me.model)
    others = [torch.linspace(-1.0, 1.0, 11) / 3, torch.full((11,), 0.1)]  # the other two replicas' parameters

    def all_reduce(flat, group=None):
        assert flat.dtype == dtype  # what crosses the wire is the rounded replica
        for other in others:
            flat += other.to(dtype)

    monkeypatch.setattr(executor_module.dist, "all_reduce", all_reduce)
    call("average", me, AverageParameters(nbytes=22.0, algorithm="ring"))
    total = mine.to(dtype)
    for other in others:
        total = total + other.to(dtype)
    assert torch.equal(flat_params(me.model), total.float() / 3)
    assert me.bytes_sent == 100 + 11 * itemsize and me.version == 8 and me.pending_local == []
    # the local steps since the last sync read and land in the version this average closes
    assert [row[:5] for row in me.recorder.updates] == [(1, 3, 7, 7, 0), (1, 4, 7, 7, 0)]
    assert [row[2] for row in me.recorder.trace] == ["average"] and me.recorder.trace[0][5] == 11 * itemsize


def test_fp32_averaging_is_torchs_averager_on_the_models_parameters():
    seen = []
    me = worker(averager=SimpleNamespace(average_parameters=seen.append))
    call("average", me, AverageParameters(nbytes=44.0, algorithm="ring"))
    assert len(seen) == 1 and [p is q for p, q in zip(seen[0], me.model.parameters())] == [True] * 4
    assert me.bytes_sent == 100 + 44 and me.version == 8


class Client:
    def __init__(self, pulled=None):
        self.calls, self.pulled = [], pulled

    def push(self, flat, step, aggregate):
        self.calls.append(("push", flat.clone(), step, aggregate))
        return 7

    def wait(self, step, threshold):
        self.calls.append(("wait", step, threshold))

    def pull(self, step):
        self.calls.append(("pull", step))
        return self.pulled, 9


def test_push_sends_the_flat_gradient_and_ticks_the_clock():
    me = worker(client=Client())
    for i, p in enumerate(me.model.parameters()):
        p.grad = torch.full_like(p, float(i + 1))
    call("push", me, Push(nbytes=44.0, aggregate=True))
    (_, flat, step, aggregate), = me.client.calls
    assert flat.tolist() == [1.0] * 6 + [2.0] * 2 + [3.0] * 2 + [4.0] and (step, aggregate) == (5, True)
    assert me.clock == 4 and me.bytes_sent == 107 and me.recorder.trace[0][5] == 7


@pytest.mark.parametrize("slack", [0, 2])
def test_wait_asks_for_the_clock_minus_the_slack(slack):
    me = worker(client=Client())
    call("wait", me, WaitForClock(slack=slack))
    assert me.client.calls == [("wait", 5, 3 - slack)]


def test_pull_loads_what_the_servers_send():
    pulled = torch.linspace(0.0, 1.0, 11)
    me = worker(client=Client(pulled))
    call("pull", me, Pull(nbytes=44.0))
    assert torch.equal(flat_params(me.model), pulled) and me.bytes_sent == 109


def test_local_update_steps_the_replica_and_waits_for_the_next_average():
    me = worker()
    before = flat_params(me.model)
    for p in me.model.parameters():
        p.grad = torch.ones_like(p)
    call("local_update", me, LocalUpdate())
    assert torch.equal(flat_params(me.model), before - 0.5) and me.pending_local == [5]


@pytest.mark.parametrize("defer,start", [(False, 1.0), (True, 1.5)])
def test_allreduce_applies_the_step_logs_its_version_and_spans_from_the_launch(defer, start):
    # bucket readiness is wall-clock time; the trace counts from the run's start t0
    state = SimpleNamespace(defer=defer, first_ready=1.25, last_ready=1.75, buckets=[40, 4], bytes=44)
    me = worker(hook_state=state, recorder=Recorder(0.25))
    before = flat_params(me.model)
    for p in me.model.parameters():
        p.grad = torch.full_like(p, 2.0)  # DDP has already averaged it
    action = AllReduceGradients(buckets=(40.0, 4.0), ready=(0.5, 1.0), algorithm="ring", bucket_bytes=64.0)
    call("allreduce", me, action)
    assert torch.equal(flat_params(me.model), before - 1.0)
    assert me.version == 8 and me.bytes_sent == 144 and me.buckets == [40, 4]
    assert me.recorder.updates[0][:5] == (1, 5, 6, 7, 1)
    assert me.recorder.trace[0][2:] == ("allreduce", start, 2.0, 44)


class WakingModel(nn.Module):
    """``inner``, whose forwards after the first ``fast`` each take ``delay`` seconds longer: a rank that
    computes a step right after a wait for peers, when the host wakes it up late (syncsim's idle_cost)."""

    def __init__(self, inner: nn.Module, fast: int, delay: float) -> None:
        super().__init__()
        self.inner, self.fast, self.delay, self.calls = inner, fast, delay, 0

    def forward(self, x):
        import time

        self.calls += 1
        if self.calls > self.fast:
            end = time.perf_counter() + self.delay
            while time.perf_counter() < end:  # busy, as a late wake-up is not the sleep under test
                pass
        return self.inner(x)


def test_a_slow_rank_sleeps_factor_minus_one_times_its_warm_compute_not_its_wake_ups(monkeypatch, tmp_path):
    # --slow F emulates a GPU whose kernels take F times as long: the rank sleeps (F-1) x COMPUTE_PER_FORWARD
    # x its forward timed warm, once. A host's late wake-up after a wait is not GPU work, so a step whose
    # forward carries one sleeps no longer (sized from each step's forward, a 20 ms wake-up would add
    # (F-1) x 3 x 20 ms = 120 ms to every step of a factor-3 rank).
    from real.calibration.compute_probe import FreeNetwork
    from real.config import RunConfig
    from real.data import load
    from real.models import build
    from real.wire import WIRE_DTYPES

    slept = []
    monkeypatch.setattr(executor_module.time, "sleep", slept.append)
    cfg = RunConfig(scheme="ps", world=1, servers=1, model="mlp", batch_size=8, steps=4, out=str(tmp_path),
                    slow=((0, 3.0),))
    inner = build(cfg.model, cfg.seed)
    client = FreeNetwork(flat_params(inner), WIRE_DTYPES[cfg.spec.precision])
    delay = 0.1  # far above a warm forward of the small model on 8 samples even on a loaded machine
    waking = WakingModel(inner, fast=executor_module.WARM_FORWARDS + 1, delay=delay)
    ex = Executor(cfg, 0, waking, load(cfg.data, cfg.seed), torch.device("cpu"), None, Recorder(0.0), client=client)
    ex.run()
    assert len(slept) == cfg.steps and len(set(slept)) == 1  # one sleep a step, the same every step
    warm = slept[0] / ((3.0 - 1) * executor_module.COMPUTE_PER_FORWARD)
    assert 0 < warm < delay / 4  # the warm forward of the small model on 8 samples, far under the wake-up
    assert ex.forward_time >= delay  # while the steps' own forwards carried it


def test_a_slow_rank_given_its_forward_sleeps_from_it_and_times_none(monkeypatch, tmp_path):
    # --slow RANK:F:FORWARD: the rank sleeps (F-1) x COMPUTE_PER_FORWARD x FORWARD a step, the forward a
    # calibration timed, and times no warm forward of its own (which would size a different sleep: two
    # processes' warm forwards differ by a tenth or more), so a run sleeps as its calibration did.
    from real.calibration.compute_probe import FreeNetwork
    from real.config import RunConfig
    from real.data import load
    from real.models import build
    from real.wire import WIRE_DTYPES

    slept = []
    monkeypatch.setattr(executor_module.time, "sleep", slept.append)
    forward = 0.0042
    cfg = RunConfig(scheme="ps", world=1, servers=1, model="mlp", batch_size=8, steps=3, out=str(tmp_path),
                    slow=((0, 2.5, forward),))
    inner = build(cfg.model, cfg.seed)
    client = FreeNetwork(flat_params(inner), WIRE_DTYPES[cfg.spec.precision])
    counting = WakingModel(inner, fast=10**9, delay=0.0)  # counts the forwards, adds nothing
    ex = Executor(cfg, 0, counting, load(cfg.data, cfg.seed), torch.device("cpu"), None, Recorder(0.0), client=client)
    ex.run()
    assert slept == [pytest.approx((2.5 - 1) * executor_module.COMPUTE_PER_FORWARD * forward)] * cfg.steps
    assert counting.calls == cfg.steps  # one forward a step: none timed warm
    assert ex.slow_forward == forward
