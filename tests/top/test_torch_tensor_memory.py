"""Which tensors' memory the rank path may read and write in place (`oddl.torch.native.overlap`):
an all-to-all's or a listed all-gather's blocks go straight between the call's tensors only
where no output shares a byte with an input, or with another output. And a rank that finds
its own call wrong before it runs (`RankPath.give_up`) fails its peers at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loopback_ranks import loopback_links

from oddl.agents.clock import wall
from oddl.agents.links.stream_wire import PeerGaveUp
from oddl.common.errors import CollectiveError
from oddl.torch.in_rank import RankPath
from oddl.torch.native import overlap, raw


def _views(*tensors: torch.Tensor) -> list[np.ndarray]:
    return [raw(t, "test").reshape(-1) for t in tensors]


def test_separate_tensors_and_the_blocks_of_one_do_not_overlap():
    whole = torch.zeros(12)
    assert not overlap(_views(*whole.split(3)))  # a tensor's blocks touch, never share
    assert not overlap(_views(torch.zeros(4)), _views(torch.zeros(4), torch.zeros(4)))
    assert not overlap(_views(whole[:6]), _views(whole[6:]))  # halves of one storage
    assert not overlap([], [])


def test_an_output_that_shares_a_byte_with_an_input_or_another_output_overlaps():
    whole = torch.zeros(12)
    assert overlap(_views(whole), _views(whole))  # in place
    assert overlap(_views(whole[:7]), _views(whole[6:]))  # one element in common
    assert overlap(_views(whole[2:4], whole[8:]), _views(whole[9:10]))  # inside another
    assert overlap(_views(whole[:4], whole[3:6]))  # two outputs of one list
    assert not overlap(_views(whole[:4], whole[4:8], whole[:4][:0]))  # an empty one shares none
    # the inputs may share memory among themselves: only reads
    assert not overlap(_views(whole[:6], whole[:6]), _views(torch.zeros(6)))


def test_a_rank_that_finds_its_own_call_wrong_fails_its_peers_at_once():
    """`RankPath.give_up` (a rank whose own block is of one size in and another out): the
    call fails here with the reason, and a peer waiting for this rank's chunks of that call
    hears it at once instead of waiting out its receive timeout."""
    nodes = ("n0", "n1")
    with loopback_links(nodes) as links:
        path = RankPath(None, "job-1", 0, nodes, links["n0"], 0.0)  # type: ignore[arg-type]
        reason = CollectiveError("all_to_all_single: rank 0 sends itself 3 elements and "
                                 "expects 2; its split sizes for itself must agree")
        with pytest.raises(CollectiveError, match="sends itself 3"):
            path.give_up(reason)
        assert (path.seq, path.failed) == (1, 1)
        with pytest.raises(PeerGaveUp, match="sends itself 3"):  # told, not timed out
            links["n1"].recv_chunk(path.label, "n0", 1, 0, wall.now() + 30.0)
