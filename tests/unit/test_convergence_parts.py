"""The pieces of the convergence replay, checked against independent references (torch, finite differences)."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from syncsim import Cluster, Link, Workload, simulate
from syncsim.convergence import (
    SGD,
    Digits,
    LogisticRegression,
    LossScaling,
    Quadratic,
    Sampler,
    Wire,
    replay,
    steps_to_target,
    time_to_target,
)
from syncsim.convergence.wire import to_bf16, to_fp16


def central_difference(loss, x, direction, h=1e-6):
    return (loss(x + h * direction) - loss(x - h * direction)) / (2 * h)


def test_digits_gradient_matches_finite_differences():
    problem = Digits()
    rng = np.random.default_rng(1)
    # off the ReLU kinks: with zero biases, blank patches sit exactly at 0
    x = problem.init(0) + rng.normal(0, 0.05, problem.dim)
    batch = np.arange(24)
    g = problem.gradient(x, batch)
    for _ in range(4):
        direction = rng.normal(size=problem.dim)
        assert central_difference(lambda z: problem.train_loss(z, batch), x, direction) == pytest.approx(
            g @ direction, rel=1e-5)


def test_logistic_regression_gradient_matches_finite_differences():
    problem = LogisticRegression(features=7, samples=50, l2=0.01, seed=3)
    x = np.random.default_rng(2).normal(size=7)
    batch = np.arange(10, 30)
    features, labels = problem.data[0][batch].astype(float), problem.data[1][batch].astype(float)

    def loss(z):
        logits = features @ z
        return np.mean(np.logaddexp(0, logits) - labels * logits) + 0.005 * z @ z

    direction = np.random.default_rng(3).normal(size=7)
    # float32 features: agreement to single precision
    assert central_difference(loss, x, direction) == pytest.approx(problem.gradient(x, batch) @ direction, rel=1e-5)


def test_quadratic_noise_is_centred_so_the_full_gradient_is_exact():
    problem = Quadratic((1.0, 3.0), noise=2.0, pool=16)
    x = np.array([0.5, -1.0])
    np.testing.assert_allclose(problem.gradient(x, np.arange(16)), [0.5, -3.0], atol=1e-12)
    assert not np.allclose(problem.gradient(x, np.arange(4)), [0.5, -3.0])


def test_problems_reject_bad_fields_by_name():
    with pytest.raises(ValueError, match=r"Quadratic.eigenvalues\[1\].*got -1"):
        Quadratic((1.0, -1.0))
    with pytest.raises(ValueError, match="LogisticRegression.features"):
        LogisticRegression(features=0, samples=10)
    with pytest.raises(ValueError, match="SGD.momentum"):
        SGD(lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="SGD.momentum"):
        SGD(lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="SGD.lr"):
        SGD(lr=0.0)
    assert SGD(lr=1e-9, momentum=0.0).momentum == 0.0  # the edges that are allowed
    assert SGD(lr=0.1).momentum == 0.0                  # plain SGD unless asked
    with pytest.raises(dataclasses.FrozenInstanceError):
        SGD(lr=0.1).lr = 1.0                            # a replay's optimiser cannot change under it
    with pytest.raises(ValueError, match="LossScaling.backoff_factor"):
        LossScaling(backoff_factor=1.5)
    with pytest.raises(ValueError, match="Wire.precision"):
        Wire("fp8")


def test_sampler_lays_out_a_steps_minibatches_as_one_combined_batch():
    many, one = Sampler(50, 4, 3, seed=7), Sampler(50, 12, 1, seed=7)
    for step in range(10):   # 10 steps of 12 samples cross two epoch boundaries
        combined = np.concatenate([many.indices(w, step) for w in range(3)])
        np.testing.assert_array_equal(combined, one.indices(0, step))
    epoch = np.concatenate([one.indices(0, t) for t in range(5)])[:50]
    assert sorted(epoch.tolist()) == list(range(50))   # an epoch visits every sample once


@pytest.mark.parametrize("precision, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_wire_rounding_matches_torch(precision, dtype):
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0, 1, 2000), rng.normal(0, 1e4, 500) * rng.random(500),
                             [0.0, -0.0, 65504.0, 65520.0, 1e-8, 3.4e38, np.inf, -np.inf]]).astype(np.float32)
    expected = torch.from_numpy(values).to(dtype).to(torch.float64).numpy()
    np.testing.assert_array_equal(Wire(precision).send(values.astype(np.float64)), expected)
    assert np.isnan(to_bf16(np.array([np.nan]))).all() and np.isnan(to_fp16(np.array([np.nan]))).all()


def test_loss_scaler_follows_torch_update_rule():
    # torch._amp_update_scale_ is the kernel GradScaler.update() runs.
    config = LossScaling(growth_interval=3)
    ours = config.scaler(1)
    scale, tracker = torch.full((1,), config.init_scale), torch.zeros(1, dtype=torch.int32)
    found = np.random.default_rng(4).random(60) < 0.2
    for overflow in found:
        ours.update(0, bool(overflow))
        torch._amp_update_scale_(scale, tracker, torch.full((1,), float(overflow)), config.growth_factor,
                                 config.backoff_factor, config.growth_interval)
        assert ours.scale[0] == scale.item() and ours.good_steps[0] == tracker.item()


def test_local_sgd_period_one_with_heavy_ball_momentum_still_equals_allreduce():
    # Each local-SGD worker keeps its own momentum buffer, so the runs *could*
    # part; for heavy-ball momentum they do not: averaging after every step
    # makes the mean of the buffers follow v = μ·v + mean(g), the all-reduce
    # buffer's own recursion, and every worker's gradient is taken at the same
    # averaged point. Only a non-linear per-worker state (Adam's second
    # moments, gradient clipping, per-worker loss scales) separates them.
    cluster = Cluster.homogeneous(3, Link("10Gbit/s", "5us"))
    workload = Workload(param_bytes=64, compute_time="1ms", batch_size=2)
    problem = LogisticRegression(features=4, samples=60, test_samples=20)
    local, reduce = (replay(simulate(cluster, workload, s, steps=8), problem, lr=0.5, momentum=0.9, every=1)
                     for s in ("localsgd:period=1", "allreduce"))
    np.testing.assert_allclose(local["loss"], reduce["loss"], rtol=1e-6)
    # with a longer period the per-worker buffers do change the trajectory
    longer = replay(simulate(cluster, workload, "localsgd:period=2", steps=8), problem, lr=0.5, momentum=0.9,
                    every=1)
    assert abs(longer["loss"].iloc[-1] - reduce["loss"].iloc[-1]) > 1e-4


def test_time_and_steps_to_target_read_the_first_point_that_meets_it():
    curve = pd.DataFrame({"time": [0.0, 1.0, 2.0, 3.0], "steps": [0, 10, 20, 30], "loss": [1.0, 0.5, 0.3, 0.4],
                          "accuracy": [0.1, 0.8, 0.9, 0.85]})
    assert time_to_target(curve, 0.4) == 2.0 and steps_to_target(curve, 0.4) == 20
    assert time_to_target(curve, 0.8, metric="accuracy") == 1.0
    assert time_to_target(curve, 0.1) == math.inf and steps_to_target(curve, 0.99, "accuracy") == math.inf
    with pytest.raises(ValueError, match="no column 'top5'"):
        time_to_target(curve, 0.5, metric="top5")


def test_replay_curve_has_time_version_steps_and_metrics():
    cluster = Cluster.homogeneous(2, Link("10Gbit/s", "5us"), servers=1, jitter=0.2)
    workload = Workload(param_bytes=64, compute_time="1ms", batch_size=8)
    result = simulate(cluster, workload, "ps:mode=async", steps=30)
    curve = replay(result, LogisticRegression(features=4, samples=64, test_samples=50), lr=0.5, every=7)
    assert list(curve.columns) == ["time", "version", "gradients", "steps", "loss", "accuracy"]
    assert list(curve["version"]) == [0, 7, 14, 21, 28, 35, 42, 49, 56, 60]
    assert curve["time"].is_monotonic_increasing and curve["steps"].iloc[-1] == 30
    assert curve["loss"].iloc[-1] < curve["loss"].iloc[0]
