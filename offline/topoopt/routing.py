"""Routing over a TopoOpt topology: hop distances, shortest-path link loads, coin-change paths.

Shared by our routing (`ecmp_loads`: split evenly over equal-cost next hops) and the
authors' (`oddl.offline.topoopt.authors.single_path_loads`: one next hop per node and target):
both walk the links that lie on shortest paths to each target (`shortest_path_links`) and
push the bytes down from the farthest nodes towards the target (`push_towards_targets`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from oddl.offline.topoopt.job_model import TopoOptError


def coin_change(n: int, jumps: Sequence[int], target: int) -> list[int]:
    """Fewest jumps (with repetition) that add up to `target` mod n, by BFS over Z_n."""
    prev: dict[int, tuple[int, int]] = {0: (0, 0)}
    queue = deque([0])
    while queue and target not in prev:
        x = queue.popleft()
        for p in sorted(jumps):
            y = (x + p) % n
            if y not in prev:
                prev[y] = (x, p)
                queue.append(y)
    if target not in prev:
        raise TopoOptError(f"ring jumps {sorted(jumps)} cannot reach stride {target} on {n} "
                           "nodes; keep a full ring (a jump coprime to N)")
    path = []
    x = target
    while x != 0:
        x, p = prev[x]
        path.append(p)
    return path


def hop_distances(n: int, src: np.ndarray, dst: np.ndarray, sources: int) -> np.ndarray:
    """BFS from nodes 0..sources−1 at once (links are bidirectional): (sources, n) hops.

    Each level expands only the frontier through a CSR adjacency, so the work is about
    sources · links whatever the diameter.
    """
    a = np.concatenate((src, dst))
    b = np.concatenate((dst, src))
    order = np.argsort(a, kind="stable")
    nbr = b[order]
    indptr = np.searchsorted(a[order], np.arange(n + 1))
    deg = np.diff(indptr)
    dist = np.full((sources, n), -1, dtype=np.int64)
    r = np.arange(sources)
    u = r.copy()
    dist[r, u] = 0
    depth = 0
    while len(u):
        cnt = deg[u]
        rr = np.repeat(r, cnt)
        first = np.repeat(indptr[u] - (np.cumsum(cnt) - cnt), cnt)
        v = nbr[first + np.arange(len(rr))]
        fresh = dist[rr, v] < 0
        key = np.unique(rr[fresh] * n + v[fresh])
        r, u = key // n, key % n
        depth += 1
        dist[r, u] = depth
    if (dist < 0).any():
        raise TopoOptError(f"the topology does not connect all {n} nodes; keep a full ring")
    return dist


def shortest_path_links(src: np.ndarray, dst: np.ndarray, dist: np.ndarray, targets: np.ndarray
                        ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
    """Per block of targets: (first target, targets in the block, du, ti, ei).

    ``du[t, e]`` is the hop distance from link e's tail to target t; (ti, ei) are the links
    one hop closer to their target (on a shortest path). Blocks keep the arrays ~2M entries.
    """
    e = len(src)
    chunk = max(1, (1 << 21) // max(e, 1))
    for lo in range(0, len(targets), chunk):
        d = dist[lo:lo + chunk]
        du = d[:, src]  # (k, E): hops from each link's tail to the target
        ti, ei = np.nonzero(d[:, dst] == du - 1)  # links on shortest paths, per target
        yield lo, d.shape[0], du, ti, ei


def push_towards_targets(loads: np.ndarray, n: int, k: int, ei: np.ndarray, lvl: np.ndarray,
                         tail: np.ndarray, head: np.ndarray, f: np.ndarray,
                         share: np.ndarray | None = None) -> None:
    """Add to `loads` the bytes `f` (at node·target) carried on links `ei`, farthest first.

    `lvl` is each link's tail distance to its target, `tail`/`head` its (target, node) keys,
    `share` the fraction of the tail's bytes it carries (None: all of them).
    """
    e = len(loads)
    order = np.argsort(-lvl, kind="stable")
    ei, lvl, tail, head = ei[order], lvl[order], tail[order], head[order]
    if share is not None:
        share = share[order]
    cuts = np.flatnonzero(np.diff(lvl)) + 1
    for part in np.split(np.arange(len(lvl)), cuts):
        c = f[tail[part]] if share is None else f[tail[part]] * share[part]
        loads += np.bincount(ei[part], c, e)
        f += np.bincount(head[part], c, k * n)


def ecmp_loads(n: int, src: np.ndarray, dst: np.ndarray, demand: np.ndarray,
               dist: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Bytes on each directed link when demand[u, i] goes to node targets[i] on shortest
    paths, split evenly over the links to equal-cost next hops at every node.

    `dist[i, u]` is the hop distance between targets[i] and u. Work is proportional to the
    (target, shortest-path link) pairs, whatever the diameter.
    """
    loads = np.zeros(len(src))
    for lo, k, du, ti, ei in shortest_path_links(src, dst, dist, targets):
        tail = ti * n + src[ei]
        head = ti * n + dst[ei]
        share = 1.0 / np.bincount(tail, minlength=k * n)[tail]
        f = demand[:, lo:lo + k].T.astype(float).ravel()  # bytes at u heading to target
        push_towards_targets(loads, n, k, ei, du[ti, ei], tail, head, f, share)
    return loads
