"""The ground floor: errors, configuration (``common.config``), metrics, security
(``common.security``, ``common.revocation``), shared memory (``common.shm``), the emulated light
table (``common.lighttable``), which extra brings which optional package (``common.extras``),
and the wire formats the agents share (clock, pairing, collective kinds); every other layer may
import it and it imports none of them."""

__version__ = "0.1.0"
