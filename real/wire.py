"""What one value of a wire precision is in torch: its dtype and its size in bytes.

The bytes per value come from the simulator's own table
(``syncsim.schemes.spec.WIRE_BYTES_PER_VALUE``), so the real executor counts
the payload the simulator prices; ``WIRE_DTYPES`` names the torch dtype that
carries each precision (tests/unit/test_real_wire.py checks the two agree).
"""

from __future__ import annotations

import torch

from syncsim.schemes.spec import WIRE_BYTES_PER_VALUE

__all__ = ["WIRE_DTYPES", "value_bytes"]

WIRE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def value_bytes(precision: str) -> int:
    """Bytes one value occupies on the wire in ``precision`` ("fp32", "fp16" or "bf16")."""
    try:
        return WIRE_BYTES_PER_VALUE[precision]
    except (KeyError, TypeError):
        allowed = ", ".join(WIRE_BYTES_PER_VALUE)
        raise ValueError(f"unknown wire precision {precision!r}; expected one of {allowed}") from None
