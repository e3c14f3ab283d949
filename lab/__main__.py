"""``python -m lab`` is the ``testbed`` command."""

import gc
import sys

from lab.cli import main

code = main()
# Teardown then skips collecting torch's heap, about 1 s on 2 cores: a stopped trainer is gone at once.
gc.freeze()
sys.exit(code)
