"""An all-to-all of blocks of any sizes as one rank's own plan (the rank path, record 0040).

The job's all-to-all plan, leased for blocks of one element, says who sends to whom in which
step. A rank that knows the sizes of its call — what it sends to each peer and what it
expects from each, as `all_to_all_single`'s split sizes and `all_to_all`'s tensors say —
fills them in (`sized_steps`): no round that sums the sizes first, no block padded to the
largest. Each block has a place of its own in a sparse layout (`place`): input block j at
j·`STRIDE`, output block i at (N + i)·`STRIDE`, each block flush with the end of its
stretch, so the offset in a chunk's header names the block it belongs to and, in its first
chunk, the block's size. The receiver checks each chunk's offset and length against what it
expects from that sender, as for every plan; where the two ranks' sizes differ the first
chunk already differs and the call fails on every rank (`CallsDiffer`), never with a wrong
result — also where the receiver expects a whole number of chunks of a longer block. An
empty block travels as one element at its stretch's start: a receiver that expects nothing
and a sender that sends one element still tell each other apart, and a sender that sends
nothing where something is expected is found at once, not by a receive timeout. Pure.
"""

from __future__ import annotations

from oddl.protos.schedule_wire import StepSpec

__all__ = ["STRIDE", "one_element_blocks", "place", "sized_steps"]

STRIDE = 1 << 40
"""Elements between two blocks' places in the sparse layout: the largest block there is."""


def place(block: int, n: int) -> int:
    """Where block `block` (input blocks 0..N−1, output blocks N..2N−1) of `n` elements
    starts in the sparse layout: flush with the end of its stretch, so its first chunk's
    offset says its size; an empty block's one element at the stretch's start."""
    return block * STRIDE if n == 0 else (block + 1) * STRIDE - n


def one_element_blocks(steps: tuple[StepSpec, ...], world: int) -> bool:
    """Whether `steps`, the job's all-to-all for blocks of one element, move each block
    straight from its sender to its receiver (no rank forwards another's block), each
    exactly once: the plans `sized_steps` can fill in. A job whose all-to-all forwards
    blocks (over a ring of circuits) keeps padded blocks and the sizes round."""
    pairs = set()
    for step in steps:
        for s, d, off, length, at in zip(step.src, step.dst, step.offset, step.length,
                                         step.landing, strict=True):
            if s == d or length != 1 or off != d or at != world + s or (s, d) in pairs:
                return False
            pairs.add((s, d))
    return len(pairs) == world * (world - 1)


def sized_steps(steps: tuple[StepSpec, ...], rank: int, sent: tuple[int, ...],
                received: tuple[int, ...]) -> tuple[StepSpec, ...]:
    """`steps` (`one_element_blocks`) with this rank's sizes filled in: its transfer to j
    carries sent[j] elements from input block j's place to the receiver's output block of
    this rank; its transfer from i, received[i] elements into output block i's place. An
    empty block is one element (`place`). Transfers between two other ranks carry nothing
    in this rank's plan (it neither knows their sizes nor waits for them)."""
    world = len(sent)
    out = []
    for step in steps:
        offsets, lengths, landings = [], [], []
        for s, d in zip(step.src, step.dst, strict=True):
            if s == rank:
                n = sent[d]
                offsets.append(place(d, n))
                landings.append(place(world + rank, n))
            elif d == rank:
                n = received[s]
                offsets.append(place(rank, n))
                landings.append(place(world + s, n))
            else:
                n = -1
                offsets.append(0)
                landings.append(0)
            lengths.append(max(n, 1) if n >= 0 else 0)
        out.append(StepSpec(step.op, step.src, step.dst, tuple(offsets), tuple(lengths),
                            tuple(landings)))
    return tuple(out)
