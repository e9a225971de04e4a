"""Which tensors' memory the rank path may read and write in place (`oddl.torch.native.overlap`):
an all-to-all's or a listed all-gather's blocks go straight between the call's tensors only
where no output shares a byte with an input, or with another output."""

from __future__ import annotations

import numpy as np
import torch

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
