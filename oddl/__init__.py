"""oddl: a testbed controller for all-optical networks carrying distributed deep learning.

This package is the top floor: the `oddl` command, the launcher, the demos and the torch backend.
"""

from oddl.common import __version__

__all__ = ["__version__"]
