"""`python -m regroup ...` (what `accelerate launch -m regroup train ...` runs)."""

import sys

from regroup.cli import main

sys.exit(main())
