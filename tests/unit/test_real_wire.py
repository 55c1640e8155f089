"""real.wire: one table of wire dtypes whose sizes are the simulator's bytes per value."""

import pytest

from real.wire import WIRE_DTYPES, value_bytes
from syncsim.schemes.spec import PRECISIONS, WIRE_BYTES_PER_VALUE


@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_precisions_dtype_is_as_wide_as_the_simulator_prices_it(precision):
    assert value_bytes(precision) == WIRE_BYTES_PER_VALUE[precision] == WIRE_DTYPES[precision].itemsize


def test_the_wire_dtypes_are_the_simulators_precisions():
    assert tuple(WIRE_DTYPES) == PRECISIONS


@pytest.mark.parametrize("precision", ["fp8", "FP32", "", None])
def test_an_unknown_precision_is_named_with_the_allowed_ones(precision):
    with pytest.raises(ValueError, match=rf"unknown wire precision {precision!r}.*fp32, fp16, bf16"):
        value_bytes(precision)
