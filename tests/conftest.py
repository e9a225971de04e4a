"""Shared test options: `--hardware FILE` runs the driver conformance suite on a lab testbed."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hardware", metavar="TESTBED.toml", default=None,
                     help="run the driver conformance suite against the devices of this lab "
                          "testbed file instead of the emulators (changes laser channels and "
                          "WSS routes on the bench)")
