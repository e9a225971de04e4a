"""`python -m oddl` runs the command line."""

import sys

from oddl.cli import main

sys.exit(main())
