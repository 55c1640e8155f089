"""What crosses the wire: values rounded to the scheme's wire precision, and the mean collectives.

fp16 is IEEE binary16 (numpy's float16 cast rounds to nearest even and
overflows to inf beyond 65,504). bf16 keeps fp32's 8-bit exponent and cuts
the mantissa to 7 stored bits: the fp32 bit pattern rounded to nearest even at
bit 16, as torch and the TPU do (Kalamkar et al. 2019, "A Study of BFLOAT16
for Deep Learning Training"). fp32 is the master format itself: passed as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from syncsim.config import check_choice
from syncsim.schemes.spec import PRECISIONS

__all__ = ["Wire", "to_bf16", "to_fp16"]


def to_fp16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float64)


def to_bf16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        single = np.asarray(x, dtype=np.float32)
    bits = single.view(np.uint32)
    # add 0x7FFF plus the lowest kept bit, then truncate: round half to even
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))
    out = rounded.view(np.float32).astype(np.float64)
    nan = np.isnan(single)
    if nan.any():  # a NaN whose payload sits in the cut bits would otherwise become inf
        out[nan] = np.nan
    return out


@dataclass(frozen=True)
class Wire:
    precision: str = "fp32"

    def __post_init__(self) -> None:
        check_choice("Wire", "precision", self.precision, PRECISIONS)

    @property
    def exact(self) -> bool:
        return self.precision == "fp32"

    def send(self, x: np.ndarray) -> np.ndarray:
        """``x`` as it arrives at the other end (a new array unless the wire is exact)."""
        if self.precision == "fp16":
            return to_fp16(x)
        if self.precision == "bf16":
            return to_bf16(x)
        return x

    def mean(self, rows: np.ndarray) -> np.ndarray:
        """All-reduce mean of per-worker rows sent at wire precision; the result also travels the wire."""
        return self.send(np.mean(self.send(rows), axis=0))

    def average_parameters(self, replicas: np.ndarray) -> np.ndarray:
        """The common value every replica takes after parameter averaging.

        Computed as first row + mean of the differences from it: the same mean
        in exact arithmetic, but replicas that are already equal give
        differences of exactly 0, so averaging twice changes nothing bit for bit
        (idempotence), and nearly equal replicas lose no digits to cancellation.
        """
        sent = self.send(replicas)
        base = sent[0]
        return self.send(base + np.mean(sent - base, axis=0))
