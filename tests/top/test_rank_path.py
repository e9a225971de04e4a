"""The rank moves its own bytes (decision record 0040): the lease an agent gives or refuses,
and the world group's all-reduces run in the training processes over direct links.

Four rank processes (tests/workers/rank_path_worker.py) join `init_process_group("oddl")` on
the emulated testbed with direct links and a ring job on the ideal network; the checks here
compute the expected values from the same inputs.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fingerprints import fingerprint
from helpers import EMULATED, run_ranks

from oddl.agents.agent_jobs import AgentJob
from oddl.agents.collective.lease import lease, refusal
from oddl.agents.links.choice import DataLinks
from oddl.agents.links.streams import StreamLink
from oddl.common.errors import CollectiveError, OperationRefused
from oddl.protos import oddl_pb2 as pb

torch = pytest.importorskip("torch")

WORKER = Path(__file__).resolve().parents[1] / "workers" / "rank_path_worker.py"
WORLD = 4


# ---- the lease, without a testbed ------------------------------------------------------------


@pytest.fixture
def stream_links() -> Iterator[DataLinks]:
    link = StreamLink("n0", "127.0.0.1:0")
    yield DataLinks(link)
    link.close()


def _job(network: str) -> AgentJob:
    return AgentJob("job-1", ("n0", "n1"), 0, network, "ring")


def _no_fetch(*_args: Any) -> pb.Schedule:
    raise AssertionError("the schedule is asked for only when a size is leased")


def test_the_lease_is_granted_on_direct_streams_of_the_ideal_network(stream_links):
    fetched: list[tuple[Any, ...]] = []

    def fetch(*args: Any) -> pb.Schedule:
        fetched.append(args)
        return pb.Schedule(job_id="job-1", collective="ring", n_elems=1000)

    job = _job("ideal")
    assert lease(job, stream_links, {"n": 0}, _no_fetch, 1e9) == {
        "granted": True, "host": "127.0.0.1", "line_rate_bps": 1e9}
    ask = {"n": 1000, "dtype": "<f4", "itemsize": 4, "kind": "all_reduce", "root": 0}
    got = lease(job, stream_links, ask, fetch, 1e9)
    assert got["granted"]
    assert pb.Schedule.FromString(base64.b64decode(got["schedule"])).collective == "ring"
    lease(job, stream_links, ask, fetch, 1e9)
    assert fetched == [("job-1", 4000, 4, "all_reduce", 0)], "asked of the controller once"


def test_the_lease_is_refused_where_the_agent_must_stay_in_the_way(stream_links):
    assert "optical network" in refusal(_job("optical"), stream_links)
    assert "circuit network" in refusal(_job("circuit"), stream_links)
    for kind in ("gather", "scatter", "send"):
        got = lease(_job("ideal"), stream_links, {"n": 8, "kind": kind, "itemsize": 4},
                    _no_fetch, 0.0)
        assert got == {"granted": False,
                       "why": f"{kind} stays with the agent; only all_reduce, all_gather, "
                              "reduce_scatter, broadcast, all_to_all are leased"}

    def forwarded(*_args: Any) -> pb.Schedule:
        return pb.Schedule(collective="ring", n_elems=12)  # relays keep segments past n

    got = lease(_job("ideal"), stream_links, {"n": 8, "itemsize": 4}, forwarded, 0.0)
    assert not got["granted"] and "forwards through hosts" in got["why"]
    with pytest.raises(OperationRefused, match="malformed lease request"):
        lease(_job("ideal"), stream_links, {"n": "many"}, _no_fetch, 0.0)
    with pytest.raises(OperationRefused, match="itemsize must be positive"):
        lease(_job("ideal"), stream_links, {"n": 8}, _no_fetch, 0.0)


def _lab_auth(nodes: tuple[str, ...], revoked: tuple[str, ...] = ()) -> dict[str, Any]:
    """Each node's StreamAuth in one lab (fresh CURVE key pairs)."""
    import zmq

    from oddl.agents.links.stream_auth import StreamAuth

    pairs = {n: zmq.curve_keypair() for n in nodes}
    publics = {n: public for n, (public, _secret) in pairs.items()}
    return {n: StreamAuth(n, secret, publics, {publics[r] for r in revoked})
            for n, (_public, secret) in pairs.items()}


def test_authenticated_streams_are_leased_with_the_jobs_keys():
    from oddl.agents.links.stream_auth import JobKeys

    auth = _lab_auth(("n0", "n1"))
    links = [StreamLink(n, "127.0.0.1:0", auth=auth[n]) for n in ("n0", "n1")]
    try:
        job = _job("ideal")
        got = lease(job, DataLinks(links[0]), {"n": 0}, _no_fetch, 0.0)
        assert got["granted"] and set(got["keys"]) == {"n1"}
        # both ends derive the same key; another job's differs; no node's secret goes out
        assert bytes.fromhex(got["keys"]["n1"]) == auth["n1"].job_keys(
            "job-1/rank-path", ["n0"])["n0"]
        assert auth["n0"].job_keys("job-2/rank-path", ["n1"]) != auth["n0"].job_keys(
            "job-1/rank-path", ["n1"])
        assert auth["n0"].secret_z85.hex() not in str(got)
        # the ranks prove each other with them, and a rank with another job's keys is refused
        ranks = [StreamLink(n, "127.0.0.1:0", auth=JobKeys(n, auth[n].job_keys(
            "job-1/rank-path", ["n0", "n1"]))) for n in ("n0", "n1")]
        stranger = StreamLink("n0", "127.0.0.1:0", auth=JobKeys("n0", auth["n0"].job_keys(
            "job-2/rank-path", ["n1"])))
        try:
            for link in (ranks[0], stranger):
                link.set_peers({"n1": ranks[1].address})
            ranks[0].connect("job-1/rank-path")
            with pytest.raises(CollectiveError, match="failed to prove its identity"):
                stranger.connect("job-1/rank-path")
        finally:
            for link in (*ranks, stranger):
                link.close()
    finally:
        for link in links:
            link.close()


def test_a_revoked_peer_is_named_and_the_job_not_leased():
    auth = _lab_auth(("n0", "n1"), revoked=("n1",))
    link = StreamLink("n0", "127.0.0.1:0", auth=auth["n0"])
    try:
        got = lease(_job("ideal"), DataLinks(link), {"n": 0}, _no_fetch, 0.0)
        assert not got["granted"] and "node 'n1' is revoked" in got["why"]
    finally:
        link.close()


def test_reports_of_leased_calls_are_totals_per_group():
    from oddl.agents.collective.lease import LeasedCalls

    leased = LeasedCalls()
    leased.report({"group": "1/a", "done": 3, "failed": 1, "bytes": 12})
    leased.report({"group": "1/a", "done": 3, "failed": 1, "bytes": 12})  # repeated: the same
    leased.report({"group": "2/a", "done": 2, "failed": 0, "bytes": 8})
    assert leased.totals() == (5, 1, 20)
    for bad in ({"group": "x", "done": "many", "failed": 0, "bytes": 0}, {"done": 1},
                {"group": "x", "done": -1, "failed": 0, "bytes": 0}, None):
        with pytest.raises(OperationRefused, match="rank-path report"):
            leased.report(bad)
    assert leased.totals() == (5, 1, 20)


# ---- four ranks over direct links -----------------------------------------------------------


@pytest.fixture(scope="module")
def apis(tmp_path_factory) -> Iterator[list[str]]:
    """The emulated testbed with direct links and a ring job on the ideal network."""
    from oddl.launch.testbed import RunningTestbed, write_config

    tmp = tmp_path_factory.mktemp("rank-path")
    config = write_config(EMULATED, tmp / "direct.toml", {'link = "fabric"': 'link = "direct"'})
    with RunningTestbed(tmp, config) as tb:
        job = tb.operator.submit("rank-path", tb.launched.node_ids, "ring", "ideal")
        yield tb.launched.apis
        tb.operator.cancel(job["id"])


def _world(apis: list[str], scenario: str) -> list[dict[str, Any]]:
    return run_ranks([sys.executable, str(WORKER), scenario], apis, 300)


def _inputs(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(300 + rank + n).integers(-100, 100, n).astype(np.float64)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_the_ranks_reduce_exactly_without_the_agent_in_the_way(apis: list[str]):
    res = _world(apis, "exact")
    assert all(r["leased"] for r in res), "every rank took the lease"
    assert {r["auth"] for r in res} == {"NoneType"}, "unauthenticated agents, plain streams"
    _all_reduces_exact(res)
    _complex_exact(res)
    _other_kinds_exact(res)
    for r in res:  # the agents ran none of them (the handshake's sums came before)...
        assert r["agent_done_after"] == r["agent_done_before"], r
        assert r["rank_path_calls"] == r["calls"] > 4 * 5 + 1
        # ...and heard of every one from the rank's reports (for `oddl status`)
        assert r["in_ranks_after"] - r["in_ranks_before"] == r["rank_path_calls"], r


def _all_reduces_exact(res: list[dict[str, Any]]) -> None:
    """The worker's all-reduces of every size, dtype and op, and of a strided tensor: the
    reduction of the inputs, on every rank."""
    for n in (1, 7, 1000, 300_001):
        stacked = np.stack([_inputs(r, n) for r in range(WORLD)])
        want = {"SUM": stacked.sum(0), "MAX": stacked.max(0), "AVG": stacked.sum(0) / WORLD}
        keys = [key for key in res[0]["results"] if key.startswith(f"{n}/")]
        assert len(keys) == 5, keys
        for key in keys:
            op = key.rsplit("/", 1)[1]
            expect = torch.from_numpy(want[op])
            if "bfloat16" in key:  # summed as float32, rounded once (oddl.torch.native)
                expect = expect.float().to(torch.bfloat16)
            want_fp = fingerprint(expect.float().numpy())
            assert all(r["results"][key] == want_fp for r in res), f"{key}: on every rank"
    strided = fingerprint(np.stack([_inputs(r, 2000)[::2] for r in range(WORLD)]).sum(0))
    assert all(r["results"]["strided"] == strided for r in res)


def _complex_exact(res: list[dict[str, Any]]) -> None:
    """complex64 all-to-alls (pairs of reals on the wire), even, with split sizes and in
    lists: every rank got every block exactly (the worker checks against every rank's
    inputs)."""
    for r in res:
        assert [r["results"][f"complex/{form}"] for form in ("single", "splits", "list")] \
            == [True] * 3, r["rank"]


def _other_kinds_exact(res: list[dict[str, Any]]) -> None:
    """The all-gathers, reduce-scatters, broadcasts and all-to-alls of the worker's
    `other_kinds`: what the inputs say, on every rank."""
    for n in (1, 1000, 300_001):
        for dtype in (torch.int64, torch.float32, torch.bfloat16):
            tag = f"{n}/{dtype}"
            ins = [_inputs(r, n) for r in range(WORLD)]
            blocks = np.stack([_inputs(r, WORLD * n).reshape(WORLD, n) for r in range(WORLD)])
            for r in res:
                got = r["results"]
                assert got[f"gather/{tag}"] == fingerprint(np.concatenate(ins)), tag
                assert got[f"gather-list/{tag}"] == got[f"gather/{tag}"], tag
                assert got[f"gather-list-work-buffers/{tag}"] == [], tag  # no copy out
                assert got[f"broadcast/{tag}"] == fingerprint(ins[2]), tag
                assert got[f"scatter-input-kept/{tag}"], f"{tag}: the input was written"
                me = r["rank"]  # rank i sent `me` + 1 rows of its input of that size
                assert got[f"all_to_all/{tag}"] == [
                    fingerprint(_inputs(i, (me + 1) * n)) for i in range(WORLD)], tag
                exchanged = fingerprint(np.concatenate(
                    [_inputs(i, WORLD * n)[me * n:(me + 1) * n] for i in range(WORLD)]))
                assert got[f"all_to_all_single/{tag}"] == exchanged, tag
                assert got[f"all_to_all-even/{tag}"] == exchanged, tag
                assert got[f"all_to_all_single-in-place/{tag}"] == exchanged, tag
                # rank i sent (me + i) % WORLD rows of n, its input's rows after those it
                # sent to ranks before `me`
                split = []
                for i in range(WORLD):
                    rows = [(j + i) % WORLD * n for j in range(WORLD)]
                    start = sum(rows[:me])
                    split.append(_inputs(i, sum(rows))[start:start + rows[me]])
                assert got[f"all_to_all_single-splits/{tag}"] == \
                    fingerprint(np.concatenate(split)), tag
                # the even ones went from the inputs' memory into the outputs' (the uneven
                # one's blocks are larger)
                assert got[f"all_to_all-work-buffers/{tag}"] == [], tag
                for op, fold in (("SUM", np.sum), ("MAX", np.max)):
                    key = f"scatter/{tag}/{op}"
                    if dtype == torch.int64 and op == "MAX":
                        assert key not in got  # the worker reduces int64 with SUM only
                        continue
                    expect = torch.from_numpy(fold(blocks, axis=0)[r["rank"]])
                    if dtype == torch.bfloat16:  # reduced as float32, rounded once
                        expect = expect.float().to(torch.bfloat16)
                    assert got[key] == fingerprint(expect.float().numpy()), (tag, op)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_one_rank_that_declines_keeps_every_rank_with_the_agents(apis: list[str]):
    res = _world(apis, "one-declines")
    assert not any(r["leased"] for r in res)
    assert all(r["agent_done_after"] - r["agent_done_before"] == r["calls"] for r in res)
    alike = [{k: v for k, v in r["results"].items()
              if not k.startswith(("scatter/", "all_to_all"))}
             for r in res]  # each rank's reduce-scatter block and all-to-all rows are its own
    assert alike[0] == alike[2]
    _all_reduces_exact(res)
    _other_kinds_exact(res)
    _complex_exact(res)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_a_rank_that_leaves_fails_the_call_on_every_other_rank(apis: list[str]):
    res = _world(apis, "crash")
    survivors = [r for r in res if not r.get("left")]
    assert len(survivors) == 3 and all(r["leased"] for r in survivors)
    for r in survivors:
        assert r["error"], f"rank {r['rank']} returned a result without rank 3"
        assert r["took_s"] < 60, r
    assert any("n3" in r["error"] for r in survivors), [r["error"] for r in survivors]


def _failed_on_every_rank(scenario: str, apis: list[str], because: str) -> None:
    """Run `scenario`: every rank held the lease and its call failed within a minute with
    `CallsDiffer`, saying `because` (a rank that found the difference tells the others, and
    they stop waiting for data that will not come)."""
    res = _world(apis, scenario)
    assert len(res) == WORLD and all(r["leased"] for r in res)
    for r in res:
        assert r["error"].startswith("CallsDiffer: "), r
        assert because in r["error"], r
        assert r["took_s"] < 60, r


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_an_all_to_all_single_whose_blocks_differ_fails_on_every_rank(apis: list[str]):
    """Without split sizes c10d promises equal blocks, so no sizes are summed first; a rank
    that breaks the promise gets no result anywhere, never a wrong one: each chunk's offset
    and length are checked, so the call fails at once, naming why."""
    _failed_on_every_rank("broken-contract", apis, "the peers disagree on the plan")


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_split_sizes_that_disagree_fail_on_every_rank(apis: list[str]):
    """Each block travels at its own size with no sizes summed first; a sender and a
    receiver that disagree on one (3 sent where 2 are expected; none sent where 1 is) fail
    every rank's call at once, naming why, never with a wrong result."""
    _failed_on_every_rank("sizes-disagree", apis, "the peers disagree on the plan")


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_an_all_to_all_single_with_split_sizes_on_some_ranks_only_names_the_fix(
        apis: list[str]):
    """gloo runs it; here the ranks with split sizes sum them first and the one without does
    not, so their calls differ: every rank fails, and the error says what to change."""
    _failed_on_every_rank("mixed-splits", apis, "pass them on every rank or on none")
