"""Package shim for the FUTEBOL WSS agent's wire modules kept in tests/clients (see README.md).

The original package ``__init__`` only looks up its version with pkg_resources; it is not
copied. Nothing of the original is changed in ``lib/``.
"""
