"""Parameter averaging as the wire carries it out."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from syncsim.convergence import Wire
from tests.property.convergence_cases import CONVERGENCE

replica_stacks = st.tuples(st.integers(1, 6), st.integers(1, 8)).flatmap(
    lambda shape: hnp.arrays(np.float64, shape, elements=st.floats(-1e4, 1e4, allow_subnormal=False)))

# Unit roundoff of each wire format (fp32 is passed exactly here): 2^-11 (fp16), 2^-8 (bf16); below the
# normal range the spacing is absolute, the smallest subnormal: 2^-24 (fp16), 2^-133 (bf16).
ROUNDOFF = {"fp32": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8}
SUBNORMAL = {"fp32": 0.0, "fp16": 2.0**-24, "bf16": 2.0**-133}


@settings(CONVERGENCE)
@given(replicas=replica_stacks, precision=st.sampled_from(["fp32", "fp16", "bf16"]))
def test_averaging_preserves_the_mean_and_is_idempotent(replicas, precision):
    # Basis: the average of W rows has the rows' mean (it *is* the mean, up to
    # the wire's rounding of each row and of the result, each at most one unit
    # roundoff relative), and averaging rows that are already equal returns
    # them unchanged — bit for bit, since equal rows differ by exactly 0.
    wire = Wire(precision)
    once = wire.average_parameters(replicas)
    scale = np.abs(replicas).max(axis=0)
    error = np.abs(once - replicas.mean(axis=0))
    # two roundings of the wire (relative, or one subnormal step near 0) plus float64 summation error
    assert np.all(error <= 2 * (ROUNDOFF[precision] * scale + SUBNORMAL[precision]) + 1e-12 * (1 + scale))
    stacked = np.tile(once, (len(replicas), 1))
    assert np.array_equal(wire.average_parameters(stacked), once)
