"""PyTorch's own distributed suite for one backend: `python tests/workers/torch_suite_spawn.py OUT.json
TEST_NAME...` with BACKEND (``oddl`` or ``gloo``) and WORLD_SIZE in the environment (and, for
oddl, ODDL_LOCAL_API: the agents' addresses, comma-separated, indexed by rank).

The suite is `torch/testing/_internal/distributed/distributed_test.py` of the installed wheel.
Its upstream runner (PyTorch's test/distributed/test_distributed_spawn.py, not in the wheel)
defines the test class only for gloo, nccl and ucc; this one defines it for any backend, in
the same way: `TestDistBackend` (the spawned ranks, `init_process_group(backend=BACKEND)` with a
file:// init method in a TEMP_DIR made per test) mixed with `DistributedTest._DistTestBase` (the
tests), the ranks started with the "spawn" method, so each rank re-imports this file as its
main module, and with it `oddl.torch.backend`, which registers the backend.

`DistTestCases` (torch.testing._internal.common_distributed) decides some skips by backend
name, most when the suite's module is imported (its decorators); for oddl this file declares,
before that import, by configuration and only what is true: `ddp` (DDP runs over
it), `subgroup` (`new_group(ranks)` is served) and `plugin` (a registered third-party backend,
which `require_backend_is_available` accepts). Not `gpu` or `cuda` (CPU tensors only), and the
tests that name gloo itself (`require_backend_is_available({"gloo"})`, `BACKEND != "gloo"`)
stay skipped for oddl: the runner reports them as such.

Writes one JSON object: test name -> {"status": passed|failed|skipped, "reason": ..., "s": ...}.
"""

from __future__ import annotations

import json
import os
import sys
import time
import unittest
from pathlib import Path

import torch.multiprocessing
from torch.testing._internal.common_distributed import DistTestCases

import oddl.torch.backend  # noqa: F401  registers "oddl", in the spawned ranks too

BACKEND = os.environ["BACKEND"]
ODDL_FEATURES = ("ddp", "subgroup", "plugin")

# before the suite is imported: its decorators read these sets when its module loads
if BACKEND == "oddl":
    for feature in ODDL_FEATURES:
        DistTestCases.backend_feature[feature].add("oddl")

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

GLOO_GATES = ("Only gloo backend supports timeouts",)
"""Skips the suite makes by backend name for what oddl does too (issue 33: a group's timeout
bounds its barrier); with ODDL_SUITE_LIFT_GATES=1 those tests run on oddl as on gloo."""


def lift_gates(suite: type) -> list[str]:
    """Clear `GLOO_GATES` skips on the suite's tests (on every wrapper of each: a decorator
    above the skip copies it); the names lifted."""
    lifted = []
    for name, test in vars(suite).items():
        layer = test
        while layer is not None:
            if getattr(layer, "__unittest_skip_why__", "") in GLOO_GATES:
                layer.__unittest_skip__ = False
                lifted.append(name)
            layer = getattr(layer, "__wrapped__", None)
    return sorted(set(lifted))


if BACKEND == "oddl" and os.environ.get("ODDL_SUITE_LIFT_GATES") == "1":
    lift_gates(DistributedTest._DistTestBase)  # at import: the spawned ranks lift them too


START = os.environ.get("ODDL_SUITE_START", "spawn")
"""How the ranks start: "spawn" as upstream's runner (each rank imports torch and the suite
anew, ~14 of a test's ~18 s on two cores), or "fork" (each rank a copy of this process,
which has imported them once)."""


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """Upstream's test class, for whichever backend BACKEND names."""

    def setUp(self) -> None:
        super().setUp()
        if START == "fork":
            # a spawned rank imports the suite after setUp chose this test's INIT_METHOD (a
            # file in its TEMP_DIR); a forked one has the module the runner imported before
            distributed_test.INIT_METHOD = os.environ["INIT_METHOD"]
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


class _Recorder(unittest.TestResult):
    """Each test's outcome, with the reason for a skip or the last line of a failure."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, dict[str, object]] = {}
        self._started = 0.0

    @staticmethod
    def _name(test: unittest.TestCase) -> str:
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 (unittest's name)
        super().startTest(test)
        self._started = time.monotonic()
        print(f"[{BACKEND}] {self._name(test)} ...", file=sys.stderr, flush=True)

    def _record(self, test: unittest.TestCase, status: str, reason: str = "") -> None:
        took = round(time.monotonic() - self._started, 2)
        self.outcomes[self._name(test)] = {"status": status, "reason": reason[-4000:], "s": took}
        print(f"[{BACKEND}] {self._name(test)} {status} ({took} s)", file=sys.stderr, flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addSuccess(test)
        self._record(test, "passed")

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addFailure(self, test: unittest.TestCase, err: object) -> None:  # noqa: N802
        super().addFailure(test, err)  # type: ignore[arg-type]
        self._record(test, "failed", self.failures[-1][1])

    def addError(self, test: unittest.TestCase, err: object) -> None:  # noqa: N802
        super().addError(test, err)  # type: ignore[arg-type]
        self._record(test, "failed", self.errors[-1][1])

    def addExpectedFailure(self, test: unittest.TestCase, err: object) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)  # type: ignore[arg-type]
        self._record(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def main(argv: list[str]) -> int:
    out, names = Path(argv[0]), argv[1:]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(name) for name in names)
    recorder = _Recorder()
    suite.run(recorder)
    out.write_text(json.dumps(recorder.outcomes, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
