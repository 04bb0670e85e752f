"""`python -m tuner.cli ...` is the same as the `gridtune` command."""

import sys

from tuner.cli import main

sys.exit(main())
