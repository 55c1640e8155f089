"""Bytes on the wire of the schemes that trade bytes for steps (PowerSGD, top-k, DiLoCo), each against its
closed form, read off the simulator's trace and off the policy's own count (Policy.wire_bytes).

The closed forms are written here from their sources, independently of syncsim.schemes:

- PowerSGD (Vogels et al. 2019, algorithm 1; torch's ``powerSGD_hook``): a tensor is viewed as
  rows = shape[0] by cols = the rest, and compressed at rank r = min(rank, rows, cols) when
  min_compression · r·(rows + cols) < rows·cols (torch's ``_should_compress``); a compressed tensor
  sends P (rows × r) in round one and Q (cols × r) in round two, every other tensor its values in round
  one. Per worker and step: Σ r·(rows + cols) + (uncompressed values), times the wire's bytes per value.
- top-k (Stich et al. 2018): each worker contributes k = ⌈ratio · n⌉ (at least 1) values and their int32
  indices, k·(value bytes + 4), and receives the other W − 1 workers' contributions.
- DiLoCo (Douillard et al. 2023; streaming, 2025): fragment f of F is [⌊f·n/F⌋, ⌊(f+1)·n/F⌋) of the flat
  parameters; it is synchronised every H steps, H/F steps after fragment f − 1 (at steps t with
  (t + 1) ≡ (f + 1)·H/F mod H), and every fragment at a run's last step; each sends its values × the
  wire's bytes per value.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from syncsim import Cluster, Link, Workload, simulate
from syncsim.schemes import parse
from syncsim.workload import WORKLOAD_PRESETS

WIRE = {"fp32": 4, "fp16": 2, "bf16": 2}
INDEX = 4  # int32 indices
LINK = Link("10GB/s", "5us")

# Tensor shapes, forward order: LeNet (the preset), a small ResNet-like stack with 4-D convolutions, and
# a transformer block's (square, wide and tall matrices, vectors).
SHAPES = {
    "lenet": WORKLOAD_PRESETS["lenet"]["shapes"],
    "conv": ((64, 3, 7, 7), (64,), (64,), (128, 64, 3, 3), (128,), (256, 128, 1, 1), (10, 256), (10,)),
    "block": ((768, 768), (768,), (3072, 768), (3072,), (768, 3072), (768,), (50, 768), (2, 3)),
}


def _workload(shapes, **kwargs) -> Workload:
    values = sum(math.prod(s) for s in shapes)
    return Workload(param_bytes=4 * values, compute_time=1e-3, shapes=shapes, **kwargs)


def _should_compress(rows: int, cols: int, rank: int, min_compression: float) -> bool:
    """torch's rule (powerSGD_hook.py, _should_compress): (rows + cols)·r · min_rate < rows·cols."""
    return (rows + cols) * rank * min_compression < rows * cols


def _powersgd_rounds(shapes, rank: int, min_compression: float) -> tuple[int, int]:
    """(values of round one, values of round two) per worker and step."""
    one = two = 0
    for shape in shapes:
        rows = shape[0]
        cols = math.prod(shape) // rows
        r = min(rank, rows, cols)
        if _should_compress(rows, cols, r, min_compression):
            one += r * rows
            two += r * cols
        else:
            one += rows * cols
    return one, two


def _per_worker_step(trace, kind: str):
    """Bytes of ``kind`` rows per (worker, step), and how many rows each has."""
    rows = trace[trace["kind"] == kind]
    grouped = rows.groupby(["worker", "step"], observed=True)["bytes"]
    return grouped.sum(), grouped.count()


@pytest.mark.parametrize("model", sorted(SHAPES))
@pytest.mark.parametrize("rank, min_compression", [(1, 2.0), (4, 2.0), (32, 2.0), (2, 0.5), (8, 0.0)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_powersgd_bytes_are_the_factors_and_the_uncompressed_values(model, rank, min_compression, precision):
    shapes = SHAPES[model]
    scheme = parse(f"allreduce:compression=powersgd,rank={rank},min_compression={min_compression},"
                   f"precision={precision}")
    workers, steps = 3, 4
    res = simulate(Cluster.homogeneous(workers, LINK), _workload(shapes), scheme, steps=steps)
    one, two = _powersgd_rounds(shapes, rank, min_compression)
    per_step = (one + two) * WIRE[precision]
    total, count = _per_worker_step(res.trace, "allreduce")
    assert len(total) == workers * steps and (count == 2).all()  # two all-reduces a step: P, then Q
    assert (total == per_step).all()
    # round by round: the collectives table has P's bytes then Q's, every step
    rounds = res.collectives.sort_values(["step", "start"])["bytes"].to_numpy().reshape(steps, 2)
    np.testing.assert_array_equal(rounds, [[one * WIRE[precision], two * WIRE[precision]]] * steps)
    policy = scheme.policy(_workload(shapes).param_bytes, None, 2 / 3, shapes)
    assert policy.wire_bytes(steps) == steps * per_step
    assert res.versions == steps  # one new version a step, not two


def test_the_compression_rule_is_torch_s():
    torch_hook = pytest.importorskip("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook")
    for shapes in SHAPES.values():
        for rank, min_compression in [(1, 2.0), (4, 2.0), (32, 2.0), (2, 0.5), (8, 0.0)]:
            for shape in shapes:
                rows = shape[0]
                cols = math.prod(shape) // rows
                r = min(rank, rows, cols)
                assert torch_hook._should_compress(rows, cols, r, min_compression)[0] == \
                    _should_compress(rows, cols, r, min_compression)


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_powersgd_at_full_rank_sends_every_value_once_unless_told_to_compress_anyway(model):
    # At rank >= min(rows, cols) a factor pair holds r·(rows + cols) >= rows·cols values: torch's default
    # rule (2×) compresses nothing, so round one is the whole gradient and round two is empty; with
    # min_compression 0 every tensor is factored anyway and sends more than its values.
    shapes = SHAPES[model]
    values = sum(math.prod(s) for s in shapes)
    full = max(min(s[0], math.prod(s) // s[0]) for s in shapes)
    workers, steps = 4, 3
    cluster = Cluster.homogeneous(workers, LINK)
    kept = simulate(cluster, _workload(shapes), f"allreduce:compression=powersgd,rank={full}", steps=steps)
    assert (kept.collectives.sort_values(["step", "start"])["bytes"].to_numpy().reshape(steps, 2)
            == [4 * values, 0]).all()
    forced = simulate(cluster, _workload(shapes), f"allreduce:compression=powersgd,rank={full},min_compression=0",
                      steps=steps)
    # every tensor factored at r = min(rows, cols): r·(rows + cols) values each, at least its rows·cols
    expected = sum(min(s[0], math.prod(s) // s[0]) * (s[0] + math.prod(s) // s[0]) for s in shapes)
    assert sum(_powersgd_rounds(shapes, full, 0.0)) == expected >= values
    assert (_per_worker_step(forced.trace, "allreduce")[0] == 4 * expected).all()


@pytest.mark.parametrize("ratio", [1e-6, 0.001, 0.01, 0.3, 1.0])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("workers", [2, 5])
def test_topk_sends_k_values_and_indices_and_receives_every_other_worker_s(ratio, precision, workers):
    n = 12_345
    k = max(1, min(n, math.ceil(ratio * n - 1e-9)))
    contribution = k * (WIRE[precision] + INDEX)
    bandwidth, steps = 1e9, 3
    cluster = Cluster.homogeneous(workers, Link(bandwidth))  # no latency: a collective's time is its bytes
    workload = Workload(param_bytes=4 * n, compute_time=1e-3)
    scheme = parse(f"topk:ratio={ratio},precision={precision}")
    res = simulate(cluster, workload, scheme, steps=steps)
    total, count = _per_worker_step(res.trace, "allgather")
    assert len(total) == workers * steps and (count == 1).all() and (total == contribution).all()
    assert scheme.policy(workload.param_bytes).wire_bytes(steps) == steps * contribution
    # what each worker receives: its link carries the other W - 1 contributions, (W - 1)·k·(bytes + 4)
    gathers = res.collectives
    received = (gathers["end"] - gathers["start"]).to_numpy() * bandwidth
    np.testing.assert_allclose(received, (workers - 1) * contribution, rtol=1e-9)  # times of ~1 ms: rounding
    assert res.versions == steps


def _diloco_schedule(period: int, fragments: int, steps: int) -> dict[int, tuple[int, ...]]:
    """Fragments synchronised at each step that synchronises any, from the definition above."""
    gap = period // fragments
    schedule = {}
    for t in range(steps):
        if t == steps - 1:
            schedule[t] = tuple(range(fragments))
        elif (t + 1) % gap == 0:
            schedule[t] = tuple(f for f in range(fragments) if (t + 1) % period == ((f + 1) * gap) % period)
    return schedule


@pytest.mark.parametrize("period, fragments, steps", [(4, 1, 12), (4, 1, 13), (6, 3, 20), (8, 4, 8), (5, 5, 11),
                                                      (100, 1, 7), (2, 2, 1)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_diloco_sends_each_fragment_on_its_turn_and_every_fragment_at_the_end(period, fragments, steps, precision):
    n = 100_003  # not a multiple of the fragments: slices differ by one value
    bounds = [(f * n // fragments, (f + 1) * n // fragments) for f in range(fragments)]
    workers = 3
    workload = Workload(param_bytes=4 * n, compute_time=1e-3)
    scheme = parse(f"diloco:period={period},fragments={fragments},precision={precision}")
    res = simulate(Cluster.homogeneous(workers, LINK), workload, scheme, steps=steps)
    schedule = _diloco_schedule(period, fragments, steps)
    expected = {t: sum(stop - start for start, stop in (bounds[f] for f in fs)) * WIRE[precision]
                for t, fs in schedule.items()}
    total, count = _per_worker_step(res.trace, "outer")
    assert {t for _, t in total.index} == set(expected)
    for (worker, t), nbytes in total.items():
        assert nbytes == expected[t]
        assert count[(worker, t)] == 1  # the step's fragments in one outer all-reduce
    assert scheme.policy(workload.param_bytes).wire_bytes(steps) == sum(expected.values())
    assert sum(expected.values()) == pytest.approx(
        (sum(len(fs) for t, fs in schedule.items()) * n / fragments) * WIRE[precision], rel=1e-4)


def test_the_command_line_compares_the_new_schemes(capsys, tmp_path):
    from syncsim.cli import main

    workload = tmp_path / "w.toml"
    workload.write_text('param_bytes = "40MB"\ncompute_time = "10ms"\ncompress_flops = 1e12\nscan_rate = 2e9\n')
    schemes = ["allreduce", "allreduce:compression=powersgd,rank=4", "topk:ratio=0.01", "diloco:period=8,fragments=2"]
    argv = ["compare", "--cluster", "a100-100g", "--gpus", "16", "--workload", str(workload), "--steps", "16"]
    assert main(argv + [arg for s in schemes for arg in ("--scheme", s)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[2:2 + len(schemes)]  # then the memory column's note
    assert [line.split()[0] for line in table] == [s.replace(":ratio=0.01", "") for s in schemes]  # defaults omitted
    # the longest name widens the scheme column: every row's figures start in the header's columns
    assert len({len(line) for line in lines[1:2 + len(schemes)]}) == 1
    assert main(["simulate", "--cluster", "a100-100g", "--gpus", "16", "--workload", str(workload),
                 "--scheme", "topk:ratio=0.01", "--steps", "8"]) == 0
    assert "collectives  allgather" in capsys.readouterr().out
    assert main(["simulate", "--cluster", "a100-100g", "--workload", "lenet", "--scheme", "topk:ratio=2"]) == 2
    assert "TopK.ratio" in capsys.readouterr().err
