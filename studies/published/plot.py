"""parity.png: predicted against measured, drawn from published.csv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from studies.published.sharded import SHARDED_WHAT
from studies.published.summary import calibrating

__all__ = ["plot"]


def plot(csv: Path, out: Path) -> Path:
    """Predicted against measured, one marker per dataset; hollow: not bounded by the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = pd.read_csv(csv).dropna(subset=["predicted", "measured"])
    panels = (("allreduce seconds", "all-reduce time (s)", True), ("scaling efficiency", "scaling efficiency", False),
              (SHARDED_WHAT, "tokens/s per GPU (FSDP, ZeRO)", True))
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.6))
    for ax, (what, label, log) in zip(axes, panels):
        part = data[data["what"] == what]
        if part.empty:
            ax.set_visible(False)
            continue
        lo, hi = part[["measured", "predicted"]].min().min(), part[["measured", "predicted"]].max().max()
        lo, hi = (lo / 1.5, hi * 1.5) if log else (lo - 0.05, min(1.05, hi + 0.05))
        grid = np.geomspace(lo, hi, 50) if log else np.linspace(lo, hi, 50)
        ax.plot(grid, grid, color="grey", lw=0.8)
        ax.fill_between(grid, grid / 1.15, grid * 1.15, color="grey", alpha=0.15, lw=0, label="±15 %")
        for i, (dataset, group) in enumerate(part.groupby("dataset")):
            solid = group["bandwidth_bound"] & group["in_model"]
            if what == SHARDED_WHAT:  # compute-bound, but what the sharded targets speak of: calibration rows hollow
                solid = group["in_model"] & ~calibrating(group)
            style = dict(marker="osD^v<>pPh"[i % 10], color=f"C{i % 10}", s=24)
            hollow = style | {"color": "none", "edgecolors": style["color"]}
            ax.scatter(group.loc[solid, "measured"], group.loc[solid, "predicted"],
                       label=dataset if solid.any() else None, **style)
            ax.scatter(group.loc[~solid, "measured"], group.loc[~solid, "predicted"],
                       label=None if solid.any() else dataset, **hollow)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        # the points lie along the diagonal: the legends go in the empty corners
        ax.legend(fontsize=6, loc="upper left" if what == "allreduce seconds" else "lower right")
    fig.suptitle("syncsim against published measurements (hollow: latency-bound, compute-bound, a calibration row or "
                 "outside the model)")
    fig.tight_layout()
    path = out / "parity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
