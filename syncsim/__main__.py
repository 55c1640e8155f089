"""``python -m syncsim``: the same command line as ``syncsim`` (see syncsim.cli)."""

import sys

from syncsim.cli import main

sys.exit(main())
