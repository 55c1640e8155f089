"""``python -m studies.published``."""

import sys

from studies.common import run_main
from studies.published.study import main

if __name__ == "__main__":
    sys.exit(run_main(main, "python -m studies.published"))
