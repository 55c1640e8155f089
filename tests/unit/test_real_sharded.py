"""real.sharded's parts in process: a plan's units as FSDP2 units, the counted collectives, the claiming of
FSDP2's collectives by the plan's actions, and what RunConfig refuses before any rank starts.

tests/real/test_sharded_schemes.py runs the schemes for real; these check, in milliseconds, the rules those
runs rely on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import real.sharded as sharded_module
from real.config import RunConfig
from real.heartbeat import Quiet
from real.models import build, param_layers
from real.sharded import CountedAllGather, CountedReduceScatter, ShardedHandlers, module_units
from real.trace import Recorder
from syncsim.schemes import AllGatherParameters, ReduceScatterGradients, ShardedOptimizerStep, parse


def forward_units(scheme: str, model: nn.Module) -> tuple[float, ...]:
    """The plan's forward gather's units for ``model``, as the executor plans them."""
    layers = param_layers(model)
    plan = parse(scheme).policy(sum(layers), layers=layers).plan(0, 1)
    return next(a for a in plan if isinstance(a, AllGatherParameters) and a.phase == "forward").units


# -- units ---------------------------------------------------------------------------------------
def test_one_unit_is_the_whole_model():
    mlp = build("mlp", 0)
    assert module_units(mlp, None, 4) == [[mlp]]
    assert module_units(mlp, forward_units("fsdp", mlp), 4) == [[mlp]]


@pytest.mark.parametrize("precision,value_bytes", [("fp32", 4), ("bf16", 2)])
def test_units_that_fall_between_modules_are_those_modules(precision, value_bytes):
    # the mlp's tensors: 401,408 + 512 bytes (first Linear), 5,120 + 40 (second); 401,500 closes a unit after
    # the first Linear's bias
    mlp = build("mlp", 0)
    units = forward_units(f"fsdp:unit_bytes=401500,precision={precision}", mlp)
    assert units == (401920 * value_bytes / 4, 5160 * value_bytes / 4)
    assert module_units(mlp, units, value_bytes) == [[mlp[1]], [mlp[3]]]


def test_a_unit_that_splits_a_module_is_refused_naming_it():
    mlp = build("mlp", 0)
    units = forward_units("fsdp:unit_bytes=64KiB", mlp)  # the first weight alone reaches 64 KiB
    with pytest.raises(ValueError, match=r"module '1' has parameters in units 0 and 1 .* shards whole modules"):
        module_units(mlp, units, 4)


def test_units_that_do_not_fall_on_the_tensors_are_refused():
    with pytest.raises(ValueError, match="do not fall on the model's parameter tensors"):
        module_units(build("mlp", 0), (1000.0, 406080.0), 4)


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))
        self.inner = nn.Linear(2, 2)


def test_a_units_module_holding_another_units_module_is_refused():
    model = nn.Sequential(Scaled())  # tensors: 0.scale (8 bytes), 0.inner.weight (16), 0.inner.bias (8)
    with pytest.raises(ValueError, match=r"module '0' \(unit 0\) holds '0.inner' \(unit 1\)"):
        module_units(model, (8.0, 24.0), 4)
    assert module_units(model, (32.0,), 4) == [[model]]


def test_the_roots_own_parameters_are_refused():
    model = Scaled()  # its own "scale" would be the root unit's, which FSDP2 wraps last
    with pytest.raises(ValueError, match="belongs to the model itself"):
        module_units(model, (8.0, 24.0), 4)


# -- counted collectives --------------------------------------------------------------------------
def test_counted_collectives_note_the_gathered_and_the_contributed_bytes(monkeypatch):
    calls = []
    monkeypatch.setattr(sharded_module.dist, "all_gather_single",
                        lambda out, inp, group=None, async_op=False: calls.append(("ag", out, inp, group)))
    monkeypatch.setattr(sharded_module.dist, "reduce_scatter_single",
                        lambda output, input, group=None, op=None, async_op=False: calls.append(("rs", op)))
    log, spans, clock = [], [], iter([1.0, 1.5, 2.0, 2.25])
    gather = CountedAllGather(log, lambda: next(clock), Quiet(), spans)
    scatter = CountedReduceScatter(log, lambda: next(clock), Quiet(), spans)
    out = gather.allocate((6,), dtype=torch.bfloat16, device=torch.device("cpu"))
    assert out.shape == (6,) and out.dtype == torch.bfloat16
    gather(out, torch.zeros(3, dtype=torch.bfloat16), "group")
    scatter(torch.zeros(2), torch.zeros(4), "group", "avg")
    # an all-gather counts what every worker holds afterwards, a reduce-scatter the whole gradient it sends
    assert log == [("allgather", 1.0, 1.5, 12), ("reducescatter", 2.0, 2.25, 16)]
    assert spans == [(1.0, 1.5), (2.0, 2.25)]  # each call's own span, for the compute probe
    assert calls[0][0] == "ag" and calls[0][3] == "group" and calls[1] == ("rs", "avg")


# -- FSDP2's collectives claimed by the plan's actions ---------------------------------------------
FORWARD = AllGatherParameters(units=(8.0, 4.0), needed=(0.0, 0.2), phase="forward")
BACKWARD = AllGatherParameters(units=(4.0, 8.0), needed=(0.5, 0.8), phase="backward")
SCATTER = ReduceScatterGradients(buckets=(4.0, 8.0), ready=(0.8, 1.0))
STEP = ShardedOptimizerStep()


def worker(per_action: int = 2) -> SimpleNamespace:
    me = SimpleNamespace(collectives=[], _open=[], per_action=per_action, plan=(FORWARD, BACKWARD, SCATTER, STEP),
                         recorder=Recorder(0.0), worker=0, step=3, bytes_sent=0, spec="fsdp")
    for name in ("_claim", "_settle", "_row"):
        setattr(me, name, getattr(ShardedHandlers, name).__get__(me))
    return me


def test_each_action_takes_its_kinds_collectives_in_order_one_per_unit():
    me = worker()
    me.collectives.append(("allgather", 1.0, 1.25, 8))  # the first unit's gather, before Compute
    me._claim(FORWARD)
    assert me._open == [FORWARD] and me.recorder.trace == []  # the second unit's comes during Compute
    me.collectives += [("allgather", 2.0, 2.5, 4), ("allgather", 3.0, 3.5, 4), ("reducescatter", 3.6, 3.7, 4),
                       ("allgather", 3.8, 4.0, 8), ("reducescatter", 4.1, 4.5, 8)]
    me._claim(BACKWARD)
    me._claim(SCATTER)
    me._settle(STEP)
    assert me.recorder.trace == [(0, 3, "allgather", 1.0, 2.5, 12), (0, 3, "allgather", 3.0, 4.0, 12),
                                 (0, 3, "reducescatter", 3.6, 4.5, 12)]
    assert me.bytes_sent == 36 and me._open == [] and me.collectives == []


def test_a_collective_the_plan_does_not_have_stops_the_run():
    me = worker()
    me.collectives += [("allgather", 1.0, 1.1, 8), ("allgather", 1.2, 1.3, 4), ("allgather", 1.4, 1.5, 4)]
    me._claim(FORWARD)
    with pytest.raises(RuntimeError, match=r"FSDP2 ran \['allgather'\] beyond the plan's actions"):
        me._settle(STEP)


def test_at_one_worker_the_rows_stay_with_no_bytes():
    me = worker(per_action=0)
    for action in (FORWARD, BACKWARD, SCATTER):
        me._claim(action)
    me._settle(STEP)
    assert [(row[2], row[5]) for row in me.recorder.trace] == [("allgather", 0), ("allgather", 0),
                                                               ("reducescatter", 0)]


# -- refused before any rank starts ------------------------------------------------------------------
def test_zero_stage_1_in_16_bits_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match=r"RunConfig.scheme: 'zero:precision=bf16' .*ZeroRedundancyOptimizer.*"
                                         r"no fp32 master .*use precision=fp32, or zero:stage=2"):
        RunConfig(scheme="zero:stage=1,precision=bf16", out=str(tmp_path))


@pytest.mark.parametrize("scheme,amp", [("zero:stage=3,amp=true", False), ("fsdp", True), ("zero:stage=1", True)])
def test_autocast_over_a_sharded_scheme_is_refused(tmp_path, scheme, amp):
    with pytest.raises(ValueError, match=r"RunConfig.amp: .* shards its state.*drop --amp and amp=true"):
        RunConfig(scheme=scheme, amp=amp, out=str(tmp_path))


@pytest.mark.parametrize("scheme", ["zero:stage=1", "zero:stage=2,precision=bf16", "zero:stage=3,precision=fp16",
                                    "fsdp:reshard=false,precision=bf16"])
def test_what_runs_is_accepted(tmp_path, scheme):
    assert RunConfig(scheme=scheme, out=str(tmp_path)).spec == parse(scheme)
