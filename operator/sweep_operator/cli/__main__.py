"""`python -m sweep_operator.cli`: the same as `sweepctl`."""

import sys

from . import main

sys.exit(main())
