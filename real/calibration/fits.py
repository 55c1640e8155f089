"""Straight lines through probe timings, and the user calibration's link fits (no torch, no I/O)."""

from __future__ import annotations

import numpy as np

__all__ = ["fit_linear", "fit_theil_sen", "link_fits"]


def fit_linear(n: np.ndarray, t: np.ndarray) -> tuple[float, float, float, list[float]]:
    """Weighted least squares t ≈ a + b·n with weights 1/t; (a, b, R², relative residuals)."""
    w = 1.0 / t
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    pred = a + b * n
    r2 = 1.0 - float(np.sum((t - pred) ** 2) / np.sum((t - t.mean()) ** 2))
    return float(a), float(b), r2, [float(x) for x in (t - pred) / t]


def fit_theil_sen(n: np.ndarray, t: np.ndarray) -> tuple[float, float, float, list[float]]:
    """Theil-Sen line t ≈ a + b·n through individual timings; (a, b, R², relative residuals).

    b is the median of the slopes between every two timings of different sizes, a the median of
    t − b·n (Sen 1968, Theil 1950). A timing that a stall of the machine inflated moves a least-squares
    line through every timing, and a median of a size's few timings when the stall took most of them;
    the pairwise median stays on the line as long as more than half of the pairs join undisturbed
    timings. Needs timings of at least two sizes."""
    n, t = np.asarray(n, dtype=float), np.asarray(t, dtype=float)
    i, j = np.triu_indices(len(n), 1)
    apart = n[i] != n[j]
    if not apart.any():
        raise ValueError(f"fit_theil_sen needs timings of at least two sizes, got sizes {sorted(set(n.tolist()))}")
    b = float(np.median((t[j] - t[i])[apart] / (n[j] - n[i])[apart]))
    a = float(np.median(t - b * n))
    pred = a + b * n
    spread = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum((t - pred) ** 2)) / spread if spread > 0 else 1.0
    return a, b, r2, [float(x) for x in (t - pred) / t]


def link_fits(probe_result: dict, min_bytes: float = 0.0) -> dict:
    """Fitted (α, B) of a probe's ping-pong and all-reduce curves, over messages of at least ``min_bytes``.

    One-way ``t = α + n/B``; ring all-reduce ``t = L + 2(p-1)·α + 2(p-1)/p · n/B`` solved for the
    launch cost L (α from the ping-pong) and B.
    """
    p = probe_result["world"]
    fits = {}
    for name in ("pingpong", "allreduce"):
        rows = [row for row in probe_result[name] if row[0] >= min_bytes]
        n, t = (np.array([row[i] for row in rows], dtype=float) for i in (0, 1))
        a, b, r2, res = fit_linear(n, t)
        if name == "pingpong":
            fit = {"alpha": max(a, 0.0), "bandwidth": 1.0 / b, "model": "t = alpha + n/B (one way)"}
        else:
            hop = fits["pingpong"]["alpha"]
            fit = {"alpha": hop, "launch": max(a - 2 * (p - 1) * hop, 0.0), "intercept": a,
                   "bandwidth": 2 * (p - 1) / (p * b), "ranks": p,
                   "model": "t = L + 2(p-1) alpha + 2(p-1)/p n/B (ring; alpha from the ping-pong)"}
        fits[name] = fit | {"r2": r2, "relative_residuals": res, "sizes": n.tolist(), "seconds": t.tolist()}
    return fits
