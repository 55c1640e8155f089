import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim.schemes import (
    AllReduce,
    AllReduceGradients,
    AverageParameters,
    Compute,
    LocalSGD,
    LocalUpdate,
    ParameterServer,
    Pull,
    Push,
    WaitForClock,
    parse,
)

precisions = st.sampled_from(["fp32", "fp16", "bf16"])
specs = st.one_of(
    st.builds(AllReduce, algorithm=st.sampled_from(["ring", "tree", "hierarchical"]),
              bucket_bytes=st.sampled_from([2**20, 25 * 2**20, 1000.0, 3.5e6]), overlap=st.booleans(),
              precision=precisions, amp=st.booleans()),
    st.builds(ParameterServer, mode=st.sampled_from(["sync", "async"]), precision=precisions),
    st.builds(ParameterServer, staleness=st.integers(0, 50), precision=precisions),
    st.builds(LocalSGD, period=st.integers(1, 64), warmup_steps=st.integers(0, 20),
              algorithm=st.sampled_from(["ring", "tree", "hierarchical"]), precision=precisions),
)


# Basis: the grammar is the one name of a scheme in CLIs and CSVs, so text -> spec -> text is lossless.
@given(specs)
def test_grammar_round_trips(spec):
    assert parse(str(spec)) == spec
    assert str(parse(str(spec))) == str(spec)


@pytest.mark.parametrize("text, expected", [
    ("allreduce", AllReduce()),
    ("allreduce:algorithm=tree,precision=fp16", AllReduce(algorithm="tree", precision="fp16")),
    ("ps:mode=async", ParameterServer(mode="async")),
    ("ps:staleness=2", ParameterServer(staleness=2)),
    ("ps:mode=ssp,staleness=2", ParameterServer(staleness=2)),
    ("localsgd:period=8", LocalSGD(period=8)),
    ("allreduce:bucket_bytes=1MiB,overlap=false", AllReduce(bucket_bytes=2**20, overlap=False)),
    (" ALLREDUCE : precision = bf16 ", AllReduce(precision="bf16")),
])
def test_grammar_examples(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("text, message", [
    ("gossip", "unknown scheme 'gossip'"), ("ps:staleness=two", "staleness must be an integer"),
    ("ps:mode=sync,staleness=1", "applies to mode='ssp'"), ("ps:mode=ssp", "needs staleness"),
    ("allreduce:algorithm=butterfly", "algorithm must be one of"), ("localsgd:period=0", "period"),
    ("allreduce:color=red", "no option 'color'"), ("allreduce:precision=fp8", "precision"),
    ("allreduce:overlap=maybe", "true or false"), ("allreduce:precision", "key=value"),
    ("allreduce:precision=fp16,precision=fp32", "given twice"), ("", "NAME"),
])
def test_grammar_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_policies_import_neither_simpy_nor_torch():
    # The one rule of the architecture: schemes are pure, so both executors can carry them out.
    code = ("import sys, syncsim.schemes as s; s.parse('ps:staleness=1').policy(1e6).plan(0, 2); "
            "print(sorted(m for m in ('simpy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_allreduce_plan_and_buckets():
    policy = AllReduce(bucket_bytes=100, precision="fp16").policy(1000, layers=[300, 300, 400])
    compute, allreduce = policy.plan(0, 5)
    assert isinstance(compute, Compute) and isinstance(allreduce, AllReduceGradients)
    # DDP fills buckets in reverse layer order until each reaches the cap; fp16 halves every bucket.
    assert allreduce.buckets == (200.0, 150.0, 150.0)
    assert allreduce.ready[-1] == 1.0 and list(allreduce.ready) == sorted(allreduce.ready)
    no_overlap = AllReduce(bucket_bytes=100, overlap=False).policy(1000, layers=[300, 300, 400]).plan(0, 1)[1]
    assert set(no_overlap.ready) == {1.0}


def test_ps_plans_differ_only_in_wait():
    sync, ssp, asyn = (ParameterServer(mode="sync"), ParameterServer(staleness=3), ParameterServer(mode="async"))
    assert [type(a) for a in sync.policy(8).plan(0, 1)] == [Compute, Push, WaitForClock, Pull]
    assert sync.policy(8).plan(0, 1)[2] == WaitForClock(0) and sync.policy(8).plan(0, 1)[1].aggregate
    assert ssp.policy(8).plan(0, 1)[2] == WaitForClock(3) and not ssp.policy(8).plan(0, 1)[1].aggregate
    assert [type(a) for a in asyn.policy(8).plan(0, 1)] == [Compute, Push, Pull]


def test_localsgd_plan():
    policy = LocalSGD(period=3, warmup_steps=2).policy(1000)
    kinds = [tuple(type(a) for a in policy.plan(step, 10)) for step in range(10)]
    assert kinds[0] == kinds[1] == (Compute, AllReduceGradients)
    synced = [step for step, k in enumerate(kinds) if AverageParameters in k]
    assert synced == [4, 7, 9]  # every 3 local steps after warm-up, and the last step
    assert all(LocalUpdate in k for k in kinds[2:])


@given(specs, st.floats(1e3, 1e9))
def test_16bit_precision_halves_wire_bytes(spec, param_bytes):
    from dataclasses import replace

    full = replace(spec, precision="fp32").policy(param_bytes).wire_bytes(10)
    for half in ("fp16", "bf16"):
        assert replace(spec, precision=half).policy(param_bytes).wire_bytes(10) == pytest.approx(full / 2, rel=1e-12)


def test_plan_rejects_out_of_range_step():
    with pytest.raises(ValueError, match="step"):
        AllReduce().policy(10).plan(5, 5)


# Basis: Policy.distinct_steps promises that its few steps' plans include every distinct plan of the
# run, which is what lets an executor set up a million-step run from a handful of plans.
@given(specs, st.integers(1, 60))
def test_distinct_steps_cover_every_plan_of_the_run(spec, steps):
    policy = spec.policy(1e6, layers=[4e5, 6e5])
    every = {policy.plan(step, steps) for step in range(steps)}
    assert {policy.plan(step, steps) for step in policy.distinct_steps(steps)} == every
    assert policy.actions(steps) == {action for plan in every for action in plan}
