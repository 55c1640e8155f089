"""ZeRO and FSDP as specs and plans: the grammar, the actions each stage emits, units, prefetch."""

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from syncsim.schemes import (
    FSDP,
    AllGatherParameters,
    Compute,
    ReduceScatterGradients,
    ShardedOptimizerStep,
    ZeRO,
    parse,
)
from syncsim.schemes.sharded import unit_marks, unit_sizes

precisions = st.sampled_from(["fp32", "fp16", "bf16"])
specs = st.one_of(
    st.builds(ZeRO, stage=st.sampled_from([1, 2, 3]), bucket_bytes=st.sampled_from([2**20, 25 * 2**20, 1000.0, 2e9]),
              overlap=st.booleans(), precision=precisions, amp=st.booleans()),
    st.builds(FSDP, reshard=st.booleans(), prefetch=st.booleans(),
              unit_bytes=st.sampled_from([1.0, 2**20, 4e8, 3.5e6]), precision=precisions),
)
layer_lists = st.one_of(st.none(), st.lists(st.floats(1e3, 1e7), min_size=1, max_size=8))
# specs whose plans stay small on models of up to 1e10 bytes (at most some 10^4 units or buckets)
plannable = st.one_of(
    st.builds(ZeRO, stage=st.sampled_from([1, 2, 3]), bucket_bytes=st.sampled_from([2**20, 25 * 2**20, 2e9]),
              overlap=st.booleans(), precision=precisions),
    st.builds(FSDP, reshard=st.booleans(), prefetch=st.booleans(), unit_bytes=st.sampled_from([2**20, 4e8, 3.5e6]),
              precision=precisions),
)


# Basis: the grammar is the one name of a scheme in CLIs and CSVs, so text -> spec -> text is lossless.
@given(specs)
def test_grammar_round_trips(spec):
    assert parse(str(spec)) == spec
    assert str(parse(str(spec))) == str(spec)


@pytest.mark.parametrize("text, expected", [
    ("zero", ZeRO(stage=1)), ("zero:stage=3", ZeRO(stage=3)), ("ZeRO : stage = 2 ", ZeRO(stage=2)),
    ("zero:stage=3,precision=bf16,overlap=false", ZeRO(stage=3, precision="bf16", overlap=False)),
    ("zero:bucket_bytes=25MiB", ZeRO(bucket_bytes=25 * 2**20)),
    ("fsdp", FSDP()), ("fsdp:reshard=false", FSDP(reshard=False)), ("fsdp:prefetch=false", FSDP(prefetch=False)),
    ("fsdp:unit_bytes=100MiB,precision=bf16", FSDP(unit_bytes=100 * 2**20, precision="bf16")),
])
def test_grammar_examples(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("text, message", [
    ("zero:stage=4", "stage must be 1, 2 or 3"), ("zero:stage=0", "stage must be 1, 2 or 3"),
    ("zero:stage=two", "stage must be an integer"), ("zero:stage=1.5", "stage must be an integer"),
    ("zero:bucket_bytes=0", "bucket_bytes"), ("zero:overlap=yes", "true or false"),
    ("fsdp:reshard=maybe", "reshard must be true or false"), ("fsdp:prefetch=1", "prefetch must be true or false"),
    ("fsdp:unit_bytes=0", "unit_bytes"), ("fsdp:stage=3", "no option 'stage'"), ("zero:reshard=true", "no option"),
])
def test_grammar_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_sharded_policies_import_neither_simpy_nor_torch():
    # The one rule of the architecture: schemes are pure, so every executor can carry them out.
    code = ("import sys, syncsim.schemes as s; [s.parse(t).policy(1e6, [4e5, 6e5]).plan(0, 2) for t in "
            "('zero', 'zero:stage=3', 'fsdp', 'fsdp:reshard=false')]; "
            "print(sorted(m for m in ('simpy', 'torch', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def kinds(plan):
    return [(type(a).__name__, getattr(a, "phase", None)) for a in plan]


# Basis: ZeRO section 7 and the FSDP paper, section 3: stages 1 and 2 reduce-scatter the gradients, step the
# shard and gather the updated parameters; stage 3 (and FSDP's FULL_SHARD) gathers each unit before its
# forward and again before its backward; FSDP's SHARD_GRAD_OP keeps the forward's gather for backward.
@pytest.mark.parametrize("text, expected", [
    ("zero:stage=1", [("Compute", None), ("ReduceScatterGradients", None), ("ShardedOptimizerStep", None),
                      ("AllGatherParameters", "step")]),
    ("zero:stage=2", [("Compute", None), ("ReduceScatterGradients", None), ("ShardedOptimizerStep", None),
                      ("AllGatherParameters", "step")]),
    ("zero:stage=3", [("AllGatherParameters", "forward"), ("Compute", None), ("AllGatherParameters", "backward"),
                      ("ReduceScatterGradients", None), ("ShardedOptimizerStep", None)]),
    ("fsdp", [("AllGatherParameters", "forward"), ("Compute", None), ("AllGatherParameters", "backward"),
              ("ReduceScatterGradients", None), ("ShardedOptimizerStep", None)]),
    ("fsdp:reshard=false", [("AllGatherParameters", "forward"), ("Compute", None), ("ReduceScatterGradients", None),
                            ("ShardedOptimizerStep", None)]),
])
def test_each_stage_emits_its_actions(text, expected):
    plan = parse(text).policy(1e9, layers=[1e8] * 10).plan(0, 3)
    assert kinds(plan) == expected


@given(plannable, st.floats(1e3, 1e10), layer_lists)
def test_every_value_is_gathered_and_scattered_once_per_pass(spec, param_bytes, layers):
    # Basis: a reduce-scatter carries the whole gradient once and each gather pass the whole parameters once,
    # at the wire precision; so bytes per step are 2Ψ (stages 1 and 2, no resharding) or 3Ψ (ZeRO section 7).
    if layers is not None:
        param_bytes = sum(layers)
    plan = spec.policy(param_bytes, layers=layers).plan(0, 1)
    wire = param_bytes * spec.wire_ratio
    scatters = [a for a in plan if isinstance(a, ReduceScatterGradients)]
    gathers = [a for a in plan if isinstance(a, AllGatherParameters)]
    assert len(scatters) == 1 and scatters[0].nbytes == pytest.approx(wire, rel=1e-9)
    assert all(g.nbytes == pytest.approx(wire, rel=1e-9) for g in gathers)
    three = (isinstance(spec, ZeRO) and spec.stage == 3) or (isinstance(spec, FSDP) and spec.reshard)
    assert len(gathers) == (2 if three else 1)
    assert sum(isinstance(a, ShardedOptimizerStep) for a in plan) == 1 and sum(type(a) is Compute for a in plan) == 1
    assert spec.policy(param_bytes, layers=layers).wire_bytes(3) == pytest.approx(3 * (3 if three else 2) * wire,
                                                                                  rel=1e-9)


@given(plannable, st.integers(1, 40))
def test_distinct_steps_cover_every_plan_of_the_run(spec, steps):
    policy = spec.policy(1e6, layers=[4e5, 6e5])
    every = {policy.plan(step, steps) for step in range(steps)}
    assert {policy.plan(step, steps) for step in policy.distinct_steps(steps)} == every


@given(plannable, st.floats(1e3, 1e9))
def test_16bit_precision_halves_wire_bytes(spec, param_bytes):
    full = replace(spec, precision="fp32").policy(param_bytes).wire_bytes(4)
    for half in ("fp16", "bf16"):
        assert replace(spec, precision=half).policy(param_bytes).wire_bytes(4) == pytest.approx(full / 2, rel=1e-12)


def test_units_group_layers_as_the_size_based_wrap_policy():
    # torch's size_based_auto_wrap_policy wraps once the unwrapped parameters reach min_num_params: consecutive
    # layers until a group holds at least unit_bytes; the remainder is a unit of its own.
    assert unit_sizes(10.0, [3, 3, 3, 1], 5) == (6.0, 4.0)
    assert unit_sizes(10.0, [3, 3, 3, 1], 1) == (3.0, 3.0, 3.0, 1.0)
    assert unit_sizes(10.0, [3, 3, 3, 1], 100) == (10.0,)
    # without layers the model is finely divisible: equal units of at most unit_bytes
    assert unit_sizes(10.0, None, 4) == pytest.approx((10 / 3,) * 3)
    with pytest.raises(ValueError, match="MAX_BUCKETS"):
        unit_sizes(1e12, None, 1.0, "FSDP.unit_bytes")


def test_unit_marks_split_compute_in_proportion_to_bytes():
    # forward 1 - b in layer order, backward b in reverse, each unit its share of bytes (as DDP buckets assume)
    starts, b_starts, b_ends = unit_marks((1.0, 3.0), backward_fraction=0.6)
    assert starts == pytest.approx((0.0, 0.1))
    assert b_starts == pytest.approx((0.4 + 0.6 * 0.75, 0.4))  # unit 1's backward comes first
    assert b_ends == (pytest.approx(1.0), pytest.approx(0.4 + 0.6 * 0.75))


def test_fsdp_plan_follows_its_units():
    layers = [1e8, 5e8, 5e8, 2e8, 2e8]
    gather_fwd, compute, gather_bwd, scatter, step = FSDP(unit_bytes=4e8).policy(sum(layers), layers).plan(0, 1)
    units = (6e8, 5e8, 4e8)
    assert gather_fwd.units == units and gather_bwd.units == units[::-1] and scatter.buckets == units[::-1]
    assert gather_fwd.needed == pytest.approx((0.0, 1 / 3 * 6 / 15, 1 / 3 * 11 / 15))
    assert gather_bwd.needed == pytest.approx((1 / 3, 1 / 3 + 2 / 3 * 4 / 15, 1 / 3 + 2 / 3 * 9 / 15))
    assert scatter.ready == pytest.approx((1 / 3 + 2 / 3 * 4 / 15, 1 / 3 + 2 / 3 * 9 / 15, 1.0))
    # prefetch: a unit's gather is issued once the previous unit's compute has begun (past its need)
    assert gather_fwd.issued() == ((0.0, False), (0.0, True), (gather_fwd.needed[1], True))
    lazy = FSDP(unit_bytes=4e8, prefetch=False).policy(sum(layers), layers).plan(0, 1)[0]
    assert lazy.issued() == tuple((need, False) for need in lazy.needed)


def test_zero_buckets_are_deepspeed_s():
    # stages 1-3 reduce-scatter in DDP-like buckets as backward produces them (DeepSpeed's reduce_bucket_size,
    # overlap_comm); stages 1 and 2 gather the updated parameters after the step, in allgather_bucket_size buckets
    plan = ZeRO(bucket_bytes=300).policy(1000, layers=[300, 300, 400]).plan(0, 1)
    scatter, gather = plan[1], plan[3]
    assert scatter.buckets == (400.0, 300.0, 300.0) and scatter.ready[-1] == 1.0
    assert list(scatter.ready) == sorted(scatter.ready) and scatter.ready[0] < 1.0
    assert gather.units == pytest.approx((250.0,) * 4) and set(gather.needed) == {1.0} and gather.phase == "step"
    assert set(ZeRO(bucket_bytes=300, overlap=False).policy(1000, [300, 300, 400]).plan(0, 1)[1].ready) == {1.0}
    assert ZeRO().bucket_bytes == 4 * 5e8  # 5e8 values (deepspeed/runtime/zero/config.py)


def test_gather_actions_check_their_fields():
    with pytest.raises(ValueError, match="phase"):
        AllGatherParameters(units=(1.0,), needed=(0.0,), phase="sideways")
    with pytest.raises(ValueError, match="needed"):
        AllGatherParameters(units=(1.0, 2.0), needed=(0.0,), phase="forward")
