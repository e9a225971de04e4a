"""`python -m lab`: the lab rehearsal (lab/rehearse.py)."""

import sys

from lab.rehearse import main

sys.exit(main())
