"""Bad input to the public API: a ValueError on one line naming the field, at once, for every field.

Hypothesis draws, for each field of each public configuration and function, values that must be
refused (too small or too large, fractional counts, NaN and infinities, flags, None, containers,
strings in no unit or with other scripts' digits) and puts one into otherwise valid arguments.
The call must raise ValueError (not TypeError, OverflowError or MemoryError from deep inside),
within a second, with a one-line message naming the field. NumPy numbers, which a sweep hands
over as they are, must be accepted wherever Python numbers are, with the same result.
"""

from __future__ import annotations

import re
import tempfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from real.config import MODELS, RunConfig
from real.testbed import TestbedConfig
from syncsim import Cluster, Link, Workload, simulate
from syncsim.collectives import ALGORITHMS
from syncsim.convergence import Digits, LogisticRegression, Quadratic, replay
from syncsim.limits import MAX_BUCKETS, MAX_GPUS, MAX_PARAM_BYTES
from syncsim.schemes import AllReduce, LocalSGD, ParameterServer, parse
from syncsim.units import parse_bandwidth, parse_size, parse_time
from tests.unit.bad_input import (
    FOREIGN_DIGITS,
    assert_one_line,
    bad_counts,
    bad_reals,
    bad_units,
    bounded,
    not_values,
)

SIZE = r"(?:Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)(?:bytes|byte|bits|bit|B|b)"
TIME = r"min|sec|ms|us|µs|ns|s|h"
BANDWIDTH = SIZE + r"(?:/s|ps)"
LINK = Link("10Gbit/s", "5us")
TINY = Workload(param_bytes="1MiB", compute_time="1ms")
OUT = tempfile.gettempdir()  # a folder that exists and can be written: RunConfig checks it on construction


def call_simulate(steps=4, seed=0, scheme="allreduce"):
    return simulate(Cluster(nodes=2, inter=LINK), TINY, scheme, steps=steps, seed=seed)


def call_replay(lr=0.1, momentum=0.0, seed=0, every=None):
    # a two-worker, two-step simulation: the replay's checks come before any gradient is computed
    result = simulate(Cluster(nodes=2, inter=LINK), TINY, "allreduce", steps=2)
    return replay(result, Quadratic(eigenvalues=(1.0,)), lr=lr, momentum=momentum, seed=seed, every=every)


# target -> (callable, valid keyword arguments, {field: strategy of values it must refuse})
TARGETS = {
    "Link": (Link, dict(bandwidth="1Gbit/s"), {
        "bandwidth": bad_units(BANDWIDTH), "latency": bad_units(TIME, low_open=False),
        # None is the default (the bandwidth); a bucket refilled slower than the link sends is refused
        "refill": st.one_of(bad_units(BANDWIDTH).filter(lambda v: v is not None),
                            st.sampled_from(["100Mbit/s", 1.0, 1.2e8]))}),
    "Cluster": (Cluster, dict(nodes=2, gpus_per_node=2, intra=LINK, inter=LINK), {
        "nodes": bad_counts(1, MAX_GPUS), "gpus_per_node": bad_counts(1, MAX_GPUS),
        "servers": bad_counts(0, MAX_GPUS), "jitter": bad_reals(0.0, 10.0),
        "nics_per_node": bad_counts(1, MAX_GPUS), "oversubscription": bad_reals(1.0),
        "collective_latency": bad_units(TIME, low_open=False), "chunk_bytes": bad_units(SIZE, low=1.0, low_open=False),
        "straggler_prob": bad_reals(0.0, 1.0), "straggler_slowdown": bad_reals(1.0),
        "reducescatter_traffic": bad_reals(0.1, 100.0), "allgather_traffic": bad_reals(0.1, 100.0),
        "speed": st.one_of(not_values().filter(lambda v: v is not None and not isinstance(v, list)),
                           st.lists(st.floats(0.5, 2), min_size=1, max_size=3).filter(lambda s: len(s) != 4),
                           st.lists(bad_reals(0.0, low_open=True), min_size=4, max_size=4))}),
    "Workload": (Workload, dict(param_bytes="1MiB", compute_time="1ms"), {
        "param_bytes": bad_units(SIZE, high=MAX_PARAM_BYTES), "compute_time": bad_units(TIME),
        "batch_size": bad_counts(1), "backward_fraction": bad_reals(0.0, 1.0),
        "layers": st.one_of(st.just(()), st.lists(bad_units(SIZE), min_size=1, max_size=3)),
        "idle_cost": st.sampled_from(["1ms", 5, None, [(0, 1e-3)], [(1e-3, -1e-3)], [(2e-3, 0), (1e-3, 0)],
                                      [(2e-3, 0), (2e-3, 0)], [(float("nan"), 0)], [(1e-3, float("inf"))],
                                      [(1e-3,)], [("a", 1)], [1e-3]])}),
    "simulate": (call_simulate, {}, {"steps": st.one_of(bad_counts(1), st.integers(10**9, 10**20)),
                                     "seed": bad_counts(0)}),
    "AllReduce": (AllReduce, {}, {
        "bucket_bytes": bad_units(SIZE, low=1.0, low_open=False), "overlap": not_values().filter(
            lambda v: not isinstance(v, (bool, np.bool_))), "algorithm": st.text(max_size=8).filter(
            lambda t: t not in ALGORITHMS),
        "precision": st.sampled_from(["fp8", "FP16", "none", ""])}),
    "ParameterServer": (ParameterServer, dict(staleness=1), {"staleness": bad_counts(0).filter(
        lambda v: v is not None)}),  # None: no bound, the default
    "LocalSGD": (LocalSGD, {}, {"period": bad_counts(1), "warmup_steps": bad_counts(0)}),
    "RunConfig": (RunConfig, dict(out=OUT), {
        "world": bad_counts(1, MAX_GPUS), "steps": st.one_of(bad_counts(1), st.integers(10**9, 10**20)),
        "batch_size": st.one_of(bad_counts(1), st.integers(10**8, 10**20)), "lr": bad_reals(0.0, low_open=True),
        "seed": bad_counts(0, 2**63 - 1), "timeout": bad_reals(1.0, 86400.0),
        "slow": st.sampled_from(["1:", ":3", "1:2,", "a:b", "1:٣", "9:2", "1:0.5", "1:1e9", "1:nan", "1:2:3:4",
                                       "1:2:-1", "1:2:1e9", "1:2:nan", "1:2,1:3"]),
        "fail": st.sampled_from(["1:", "1:2,", ",1:2", "1:2:explode", "1:٣", "5:1", "1:-1", "1:20", "1:2:hang:x",
                                  "1:2,1:3"]),
        "out": st.sampled_from(["", " ", "/proc/syncsim-out", "/dev/null", "/dev/null/x"]),
        "amp": st.sampled_from([1, "true", None]), "model": st.text(max_size=6).filter(lambda t: t not in MODELS)}),
    "TestbedConfig": (TestbedConfig, {}, {
        "hosts": bad_counts(1, 154), "bandwidth": st.one_of(bad_units(BANDWIDTH), st.just("10bit/s")),
        "queue": bad_units(TIME), "prefix": st.one_of(st.text(max_size=14).filter(
            lambda t: not (t[:1].isascii() and t[:1].islower() and t.isascii() and t.isalnum() and len(t) <= 12)),
            st.sampled_from(["Bad", "a-b", "x" * 13, "", "٣"]))}),
    "LogisticRegression": (LogisticRegression, dict(features=4, samples=8), {
        "features": st.one_of(bad_counts(1), st.integers(10**12, 10**20)), "samples": bad_counts(1)}),
    "Digits": (Digits, {}, {"channels": st.one_of(bad_counts(1), st.integers(10**10, 10**20)),
                            "hidden": st.one_of(bad_counts(1), st.integers(10**12, 10**20))}),
    "replay": (call_replay, {}, {"lr": bad_reals(0.0, low_open=True), "momentum": bad_reals(0.0, 1.0),
                                 "every": bad_counts(1).filter(lambda v: v is not None)}),  # None: default
    "parse_size": (lambda value: parse_size(value, "size"), {}, {"value": st.one_of(not_values(),
                                                                                    st.sampled_from(FOREIGN_DIGITS))}),
    "parse_time": (lambda value: parse_time(value, "time"), {}, {"value": bad_units(TIME).filter(
        lambda v: not isinstance(v, float))}),
    "parse_bandwidth": (lambda value: parse_bandwidth(value, "bandwidth"), {}, {
        "value": bad_units(BANDWIDTH).filter(lambda v: not isinstance(v, float))}),
}
CASES = [(target, field) for target, (_, _, fields) in TARGETS.items() for field in fields]
# the name a message uses for each field (a unit parser names what it parses)
NAMES = {("parse_size", "value"): "size", ("parse_time", "value"): "time", ("parse_bandwidth", "value"): "bandwidth",
         ("simulate", "steps"): "steps", ("RunConfig", "batch_size"): "batch", ("Cluster", "speed"): "speed"}


@pytest.mark.parametrize("target,field", CASES, ids=[f"{t}.{f}" for t, f in CASES])
@given(data=st.data())
def test_every_field_refuses_bad_values_with_one_line_naming_it(target, field, data):
    function, valid, fields = TARGETS[target]
    value = data.draw(fields[field], label=field)
    with pytest.raises(ValueError) as refused, bounded(5.0):
        function(**{**valid, field: value})
    assert_one_line(str(refused.value), NAMES.get((target, field), field.split("_")[0]))


SCHEME_NAMES = ("allreduce", "ps", "localsgd")


@st.composite
def malformed_schemes(draw) -> str:
    """A documented scheme string broken in one way the grammar does not allow."""
    name = draw(st.sampled_from(SCHEME_NAMES))
    good = {"allreduce": "precision=fp16", "ps": "staleness=2", "localsgd": "period=4"}[name]
    digit = draw(st.sampled_from(FOREIGN_DIGITS))
    return draw(st.sampled_from([
        f"{name}:", f"{name}: ", f"{name}:{good},", f"{name}:,{good}", f"{name}:{good},,amp=true",
        f"{name}:{good}, ,amp=true", "ps:mode=none", "ps:staleness=null", "ps:mode=NONE", "ps:staleness=None",
        f"localsgd:period={digit}", f"ps:staleness={digit}", f"allreduce:bucket_bytes={digit}MiB",
        f"{name}:{good}=x", f"{name}::{good}", f"{name}:={good}", f"{name}:{good.split('=')[0]}=",
        f"{name}:amp", f"{name}:amp=1", f"{name}:amp=yes", "localsgd:period=1_0", "localsgd:period=4.0",
        f"{name}:{good};amp=true", f"{name},{good}", f"{name}:{good}:amp=true", f"{name}:colour=red",
    ]))


# Basis: the grammar (README, syncsim/schemes/spec.py) is NAME[:key=value,...]; every string above
# breaks it in one place, so each must be refused, and with the usual one-line message.
@given(malformed_schemes())
def test_malformed_scheme_strings_are_refused(text):
    with pytest.raises(ValueError) as refused:
        parse(text)
    assert_one_line(str(refused.value))


@given(st.text(max_size=30))
def test_any_string_parses_only_into_a_spec_that_prints_back(text):
    # whatever parse accepts is a valid spec whose canonical form parses to the same spec
    try:
        spec = parse(text)
    except ValueError as err:
        assert_one_line(str(err))
        return
    assert parse(str(spec)) == spec


# -- NumPy numbers are numbers -----------------------------------------------------------
NUMPY_INTS = st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64])
NUMPY_FLOATS = st.sampled_from([np.float32, np.float64])


@given(NUMPY_INTS, NUMPY_FLOATS, st.integers(1, 8), st.integers(1, 4), st.integers(1, 6))
def test_numpy_numbers_give_the_same_configs_and_results_as_python_numbers(itype, ftype, nodes, per_node, steps):
    # powers of two are exact in float32, so both spellings describe the same cluster
    as_python = dict(nodes=nodes, gpus_per_node=per_node, intra=Link(2.0**30, 2.0**-21), inter=Link(2.0**27, 2.0**-16),
                     servers=1, jitter=0.5, straggler_prob=0.5, straggler_slowdown=2.0)
    as_numpy = dict(nodes=itype(nodes), gpus_per_node=itype(per_node), intra=Link(ftype(2.0**30), ftype(2.0**-21)),
                    inter=Link(ftype(2.0**27), ftype(2.0**-16)), servers=itype(1), jitter=ftype(0.5),
                    straggler_prob=ftype(0.5), straggler_slowdown=ftype(2.0))
    assert Cluster(**as_numpy) == Cluster(**as_python)
    workload = Workload(param_bytes=ftype(2.0**20), compute_time=ftype(2.0**-10), batch_size=itype(8))
    assert workload == Workload(param_bytes=2.0**20, compute_time=2.0**-10, batch_size=8)
    scheme = LocalSGD(period=itype(2), warmup_steps=itype(1))
    assert scheme == LocalSGD(period=2, warmup_steps=1)
    a = simulate(Cluster(**as_numpy), workload, scheme, steps=itype(steps), seed=itype(3))
    b = simulate(Cluster(**as_python), Workload(param_bytes=2.0**20, compute_time=2.0**-10, batch_size=8),
                 LocalSGD(period=2, warmup_steps=1), steps=steps, seed=3)
    timing = ("wall_time",)  # the simulator's own run time, the one field that is not simulated
    assert a.trace.equals(b.trace)
    assert {k: v for k, v in a.summary().items() if k not in timing} == \
        {k: v for k, v in b.summary().items() if k not in timing}


def test_numpy_speeds_sizes_and_flags_are_accepted():
    cluster = Cluster(nodes=2, gpus_per_node=2, intra=LINK, inter=LINK, speed=np.array([1.0, 0.5, 1.0, 2.0]))
    assert cluster.speed == (1.0, 0.5, 1.0, 2.0) and all(type(s) is float for s in cluster.speed)
    assert Workload(param_bytes="1MiB", compute_time="1ms", layers=np.array([2.0**19, 2.0**19])).layers == (
        2.0**19, 2.0**19)
    assert AllReduce(bucket_bytes=np.int64(2**20), overlap=np.bool_(False)) == AllReduce(bucket_bytes=2**20,
                                                                                        overlap=False)
    assert ParameterServer(staleness=np.uint8(2)) == parse("ps:staleness=2")
    cfg = RunConfig(world=np.int64(2), steps=np.int32(3), lr=np.float32(0.5), timeout=np.float64(5), out=OUT)
    assert (cfg.world, cfg.steps, cfg.lr, cfg.timeout) == (2, 3, 0.5, 5.0)
    assert all(type(v) in (int, float) for v in (cfg.world, cfg.steps, cfg.lr, cfg.timeout))  # JSON-ready


@pytest.mark.parametrize("make,limit", [
    (lambda: Cluster(nodes=10**20, inter=LINK), f"at most {MAX_GPUS:,}"),
    (lambda: Cluster(nodes=2**11, gpus_per_node=2**10, intra=LINK, inter=LINK), "at most 1,048,576 GPUs"),
    (lambda: Workload(param_bytes=1e20, compute_time=1.0), "at most 1 PiB"),
    (lambda: simulate(Cluster(), TINY, "allreduce", steps=10**9), "worker-steps would keep about"),
    (lambda: simulate(Cluster(), Workload(param_bytes=1e14, compute_time=1.0), "allreduce:bucket_bytes=1", steps=1),
     f"more than the {MAX_BUCKETS:,} allowed"),
    (lambda: RunConfig(steps=10**9, out=OUT), "steps of one rank would keep about"),
    (lambda: RunConfig(batch_size=10**9, out=OUT), "samples in a batch would keep about"),
    (lambda: LogisticRegression(features=10**9, samples=10**6), "feature values would keep about"),
])
def test_impossible_sizes_are_refused_at_once_naming_the_limit(make, limit):
    with pytest.raises(ValueError, match=limit) as refused, bounded(5.0):
        make()
    assert_one_line(str(refused.value))


@pytest.mark.parametrize("table,says", [
    ("fast", "must be a table of seconds"),
    ([[0.1]], "at least 4 rows (steps) and exactly 2 columns (workers), got shape (1, 1)"),
    ([[0.1, 0.1]] * 3, "got shape (3, 2)"),
    ([[0.1, 0.1, 0.1]] * 4, "got shape (4, 3)"),
    ([[0.1, 0.1], [0.1, -1e-3], [0.1, 0.1], [0.1, 0.1]], "compute_times[1][1] must be a finite number"),
    ([[0.1, 0.1]] * 3 + [[float("nan"), 0.1]], "compute_times[3][0] must be a finite number"),
])
def test_a_bad_compute_times_table_is_refused_naming_what_is_wrong(table, says):
    with pytest.raises(ValueError, match=re.escape(says)) as refused:
        simulate(Cluster(nodes=2, inter=LINK), TINY, "allreduce", steps=4, compute_times=table)
    assert_one_line(str(refused.value))
