"""`python -m cli ...` is the same as the `gridtune` command."""

import sys

from cli import main

sys.exit(main())
