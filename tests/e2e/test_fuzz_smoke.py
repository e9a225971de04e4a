"""A short smoke of `make fuzz` inside `make test`: every fuzz target (fuzz/fuzz_targets.py)
gets its seeds and a few hundred mutated inputs, without atheris; none may crash.

The full runs (coverage-guided, ≥ 10^5 inputs per target) are `make fuzz`.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))

import fuzz_targets  # noqa: E402

TARGETS = fuzz_targets.all_targets()
INPUTS = 300


def _mutants(seeds: list[bytes], n: int, rng: random.Random):
    """Seeds, then byte flips, insertions, deletions, splices and random bytes."""
    yield from seeds
    pool = [s for s in seeds if s] or [b"\x00"]
    for _ in range(n):
        data = bytearray(rng.choice(pool))
        for _ in range(rng.randint(1, 8)):
            op = rng.randrange(5)
            pos = rng.randrange(len(data) + 1)
            if op == 0 and data:
                data[pos % len(data)] ^= 1 << rng.randrange(8)
            elif op == 1:
                data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            elif op == 2 and data:
                del data[pos:pos + rng.randint(1, 8)]
            elif op == 3:
                other = rng.choice(pool)
                data[pos:] = other[rng.randrange(len(other) + 1):]
            else:
                data = bytearray(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        yield bytes(data)


@pytest.fixture(scope="module", autouse=True)
def one_controller():
    with fuzz_targets.shared_controller():  # the gRPC targets share it, as in one process
        yield


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_target_survives_mutated_inputs(name):
    target = TARGETS[name]
    run = target.make()
    rng = random.Random(name)
    try:
        count = 0
        for data in _mutants(target.seeds, INPUTS, rng):
            try:
                run(data)
            except target.allowed:
                pass
            except Exception as exc:
                raise AssertionError(f"{name} crashed on input {data!r}: {exc!r}") from exc
            count += 1
        assert count == len(target.seeds) + INPUTS
    finally:
        target.close()
