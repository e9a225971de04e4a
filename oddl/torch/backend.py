"""A `torch.distributed` backend named ``oddl``: every collective crosses the optical circuits.

    import oddl.torch.backend  # registers the backend
    dist.init_process_group("oddl")  # under torchrun; ODDL_LOCAL_API names the agent

This module creates the process groups torch.distributed asks for and registers the backend:
the world group over the agent's job, a subgroup as flows among its members
(oddl.torch.flow_group) or on gloo beside. The group itself, with every collective it carries,
is `oddl.torch.process_group` (docs/how-to/torch-backend.md says what goes at how many bytes).
Only importable where torch is installed (the extra `oddl[torch]`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

import torch.distributed as dist

from oddl.common.errors import ConfigError
from oddl.torch.channel import (
    ENV_API,
    ENV_FALLBACK,
    ENV_JOB,
    ENV_SUBGROUPS,
    Channel,
    UnsupportedCollective,
    channel_for,
    counters,
    joined_channel,
    reset_counters,
)
from oddl.torch.flow_group import MeshChannel, subgroup_session
from oddl.torch.process_group import BACKEND, OddlProcessGroup
from oddl.torch.subgroup import GlooServedGroup, gloo_beside
from oddl.torch.timeouts import seconds

logger = logging.getLogger(__name__)

__all__ = ["BACKEND", "ENV_API", "ENV_FALLBACK", "ENV_JOB", "OddlProcessGroup",
           "UnsupportedCollective", "counters", "create", "register", "reset_counters"]

HANDSHAKE_TIMEOUT_S = 60.0


# ---- creation and registration -------------------------------------------------------------

def create(dist_opts: Any, backend_opts: Any = None) -> dist.ProcessGroup:
    """The creator torch.distributed calls for ``init_process_group("oddl")`` and for each
    ``new_group``: the world's group over the agent's job, a smaller one as flows among its
    members (or on gloo, `_subgroup`)."""
    rank, world = int(dist_opts.group_rank), int(dist_opts.group_size)
    ranks = list(dist_opts.global_ranks_in_group or [])
    timeout_s = seconds(dist_opts.timeout)
    name = str(dist_opts.group_id or "")
    if dist.is_initialized() and ranks and len(ranks) != dist.get_world_size():
        return _subgroup(dist_opts, rank, world, timeout_s, name, ranks)
    channel, shaken = joined_channel(rank, world, timeout_s, HANDSHAKE_TIMEOUT_S, dist_opts.store)
    channel.submit("rank path", lambda: channel.lease_rank_path(dist_opts.store, rank, world),
                   collective=False, after_failure=True).wait()
    _WORLD.update(to_job=shaken.to_job, session=shaken.session)
    fallback = None
    mode = os.environ.get(ENV_FALLBACK, "").strip().lower()
    if mode == "gloo":
        fallback = gloo_beside(dist_opts, "oddl-fallback", rank, world, timeout_s)
    elif mode:
        raise ConfigError(f"{ENV_FALLBACK}={mode!r}: use 'gloo' or leave it unset")
    logger.info("oddl backend: rank %d of %d (job rank %d) via agent %s (job %s), fallback %s",
                rank, world, shaken.to_job[rank], channel.api, channel.job or "its only job",
                mode or "none")
    return OddlProcessGroup(rank, world, channel, fallback, name, shaken.to_job,
                            shaken.session, timeout_s)


_WORLD: dict[str, Any] = {}
"""The world group's handshake (each global rank's job rank, the run's session)."""


def _subgroup(dist_opts: Any, rank: int, world: int, timeout_s: float, name: str,
              ranks: list[int]) -> dist.ProcessGroup:
    """A group of fewer ranks than the world: over the optics as flows among its members
    (`oddl.torch.flow_group`), or, with ODDL_TORCH_SUBGROUPS=gloo, a gloo group beside."""
    mode = os.environ.get(ENV_SUBGROUPS, "").strip().lower() or "flows"
    if mode == "gloo":
        gloo = gloo_beside(dist_opts, "oddl-subgroup", rank, world, timeout_s)
        return GlooServedGroup(rank, world, gloo, name, ranks)
    if mode != "flows":
        raise ConfigError(f"{ENV_SUBGROUPS}={mode!r}: use 'flows' (the default) or 'gloo'")
    if not _WORLD:
        raise ConfigError("a subgroup of the oddl backend needs its world group first: "
                          "init_process_group('oddl') before new_group")
    job_ranks = [_WORLD["to_job"][r] for r in ranks]
    session = subgroup_session(_WORLD["session"], name or ",".join(map(str, ranks)))
    if rank == 0:
        logger.info("oddl backend: the subgroup of ranks %s runs over the optics as flows "
                    "among its members (job ranks %s)", ranks, job_ranks)
    # a MeshChannel is a Channel to the group's code: same calls, ranks as member indices
    mesh = cast(Channel, MeshChannel(channel_for(rank, timeout_s), job_ranks, rank, session))
    return OddlProcessGroup(rank, world, mesh, None, name, None, f"{session}p", timeout_s)


def register() -> None:
    """Register the backend (done on import; repeating it is harmless)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])


register()
