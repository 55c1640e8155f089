"""``python -m real.calibrate --model NAME --world N --out FILE.json``: measure this setup for syncsim.

Writes ``{"cluster": ..., "workload": ..., "fit": ...}``: ``Cluster.from_json`` and ``Workload.from_json``
read the first two keys, so ``simulate`` predicts this very setup; "fit" keeps the raw sweeps and the
quality of each fit. What is measured and how: real.calibration.machine.
"""

from __future__ import annotations

import sys

from real.calibration.compression import measure_compression
from real.calibration.fits import fit_linear, fit_theil_sen, link_fits
from real.calibration.machine import main, measure_network
from real.calibration.machine_probe import MAX_REPEATS, measure_forward_backward

__all__ = ["main", "fit_linear", "fit_theil_sen", "link_fits", "measure_forward_backward", "measure_compression",
           "measure_network", "MAX_REPEATS"]

if __name__ == "__main__":
    sys.exit(main())
