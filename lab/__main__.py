"""``python -m lab`` is the ``testbed`` command."""

import sys

from lab.cli import main

sys.exit(main())
