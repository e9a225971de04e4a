"""The ground floor: errors, configuration (``oddl.common.config``), metrics, security
(``oddl.common.security``, ``oddl.common.revocation``), shared memory (``oddl.common.shm``), the emulated light
table (``oddl.common.lighttable``), which extra brings which optional package (``oddl.common.extras``),
and the wire formats the agents share (clock, pairing, collective kinds); every other layer may
import it and it imports none of them."""

if __name__ != "oddl.common":  # one name per module (docs/decisions/0025-one-import-root.md)
    raise ImportError(f"{__name__} is oddl's common/ folder: import it as oddl.common")

__version__ = "0.1.0"
