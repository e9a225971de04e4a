"""`python -m oddl` runs the command line."""

import sys

from oddl.procs import die_with_parent

die_with_parent()

from oddl.cli import main  # noqa: E402 (after the parent-death request)

sys.exit(main())
