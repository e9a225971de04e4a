"""`python -m oddl` runs the command line."""

import sys

from oddl.launch.processes import die_with_parent

die_with_parent()

from oddl.cli.main import main  # noqa: E402 (after the parent-death request)

sys.exit(main())
