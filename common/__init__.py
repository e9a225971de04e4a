"""The ground floor: errors, configuration (``common.config``), metrics, security
(``common.security``, ``common.revocation``), shared memory and the command-line runner, which
every other layer may import and which imports none of them."""

__version__ = "0.1.0"
