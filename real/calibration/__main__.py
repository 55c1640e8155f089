"""``python -m real.calibration ...``: one rank of a calibration probe (real.calibration.ranks)."""

import os
import sys

from real.calibration.ranks import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # As real.worker: the probe's results are written; leave without running destructors, which gloo's
    # threads can abort at the interpreter's exit and so fail a probe that measured what it should.
    os._exit(code)
