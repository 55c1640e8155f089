"""Small clusters, workloads and capture hooks shared by the convergence property tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from syncsim import Cluster, Link, Workload, simulate
from syncsim.convergence import LogisticRegression, Quadratic, Replayer
from tests.conftest import PROFILE

LINK = Link("10Gbit/s", "5us")

# Registered in tests/property/conftest.py, chosen as tests/conftest.py chooses the global profile.
CONVERGENCE = settings.get_profile("convergence-mutation" if PROFILE == "mutation" else
                                   "convergence-ci" if PROFILE == "ci" else "convergence-dev")


def cluster(workers: int, jitter: float = 0.0, straggler_prob: float = 0.0, slowdown: float = 1.0) -> Cluster:
    return Cluster.homogeneous(workers, LINK, servers=1, jitter=jitter, straggler_prob=straggler_prob,
                               straggler_slowdown=slowdown)


def workload(batch_size: int, params: int = 16) -> Workload:
    return Workload(param_bytes=4.0 * params, compute_time="10ms", batch_size=batch_size)


def run(workers, batch, scheme, steps, seed=0, jitter=0.0, straggler_prob=0.0, slowdown=1.0):
    return simulate(cluster(workers, jitter, straggler_prob, slowdown), workload(batch), scheme,
                    steps=steps, seed=seed)


def versions(result, problem, lr, momentum=0.0, seed=0, scaling=None) -> list[np.ndarray]:
    """The authoritative parameters at version 0, 1, 2, ... of a replay."""
    replayer = Replayer(result, problem, lr, momentum, seed, scaling)
    states = [replayer.parameters().copy()]
    replayer.run(on_version=lambda v, t, n: states.append(replayer.parameters().copy()) and False)
    return states


def assert_same(actual: np.ndarray, expected: np.ndarray, problem) -> None:
    """Equal up to rounding, relative to the vector's size (LogisticRegression sums float32 products)."""
    rtol = 1e-5 if isinstance(problem, LogisticRegression) else 1e-9
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(1.0, float(np.abs(expected).max())))


jitters = st.sampled_from([0.0, 0.1, 0.5])
seeds = st.integers(0, 2**16)


@dataclass(frozen=True)
class ShapedQuadratic(Quadratic):
    """A Quadratic whose flat parameters are the tensors ``layout`` laid end to end (a low-rank
    compressor's matrices): generic gradients of chosen shapes, cheap and exact."""

    layout: tuple[tuple[int, ...], ...] = ()

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.layout or ((self.dim,),)


tensor_shapes = st.lists(st.one_of(st.tuples(st.integers(1, 5), st.integers(1, 5)), st.tuples(st.integers(1, 4))),
                         min_size=1, max_size=3).map(tuple)


@st.composite
def shaped_quadratics(draw) -> ShapedQuadratic:
    """A ShapedQuadratic of 1-3 tensors (matrices up to 5 × 5, vectors up to 4), noisy per-sample gradients."""
    layout = draw(tensor_shapes)
    dim = sum(int(np.prod(shape)) for shape in layout)
    eigenvalues = draw(st.lists(st.floats(0.1, 2.0), min_size=dim, max_size=dim).map(tuple))
    return ShapedQuadratic(eigenvalues, noise=draw(st.floats(0.0, 1.0)), pool=draw(st.integers(8, 64)),
                           seed=draw(seeds), layout=layout)
