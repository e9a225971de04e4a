"""The training process's side of its shared-memory bucket: which kind, and how the agent
reaches it.

With a local API on a Unix socket (`ipc://`, the default) and a platform with memfd, the
bucket is anonymous memory (`oddl.common.memfd.MemfdBucket`) whose descriptor goes to the agent
over the bucket socket beside the local API (`oddl.agents.local_api.bucket_server`); requests name it by
the token the agent answered. Nothing is named in /dev/shm, and when this process closes the
client, drops it or dies, the connection closes and the agent lets go of the memory. After an
agent restart the connection is found closed before the next request (or the agent answers
``bucket-unknown``) and the same descriptor is handed over again: arrays from
`shared_array()` keep their memory.

Otherwise (`tcp://127.0.0.1`, no memfd) the bucket is a self-cleaning named file
(`oddl.common.shm.SharedBucket`) and requests name its path.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from oddl.agents.client.adopted import AdoptedMemory, AdoptedTable, InRegion, Region
from oddl.agents.local_api import wire as localapi
from oddl.agents.local_api.bucket_server import ADOPTION, REGISTRATION
from oddl.common import memfd
from oddl.common.errors import BucketUnavailable, CollectiveError, OperationRefused
from oddl.common.shm import SharedBucket

logger = logging.getLogger(__name__)

Bucket = memfd.MemfdBucket | SharedBucket
Named = Bucket | InRegion
"""What a request can name: the client's own bucket, or a place in memory it adopted."""
_REPLY_LIMIT = 4096  # longest reply read from the bucket socket (a token is about 70 B)


class BucketLink:
    """One connection to an agent's bucket socket; the token of the bucket last handed over
    on it."""

    def __init__(self, path: Path):
        self.path = path
        self._sock: socket.socket | None = None
        self._token = ""
        self._holder: weakref.ref[memfd.MemfdBucket] | None = None
        self.epoch = 0
        """Counts the connections made: tokens handed out on an earlier one are void."""
        _LINKS.add(self)

    def token_for(self, bucket: memfd.MemfdBucket, timeout_s: float) -> str:
        """The agent's token for `bucket`, handing its descriptor over first if this
        connection has not (a new bucket, a new or restarted agent). BucketUnavailable
        (``bucket-unreachable``) when there is no bucket socket to reach; OperationRefused
        when the agent refuses the bucket; CollectiveError when it does not answer."""
        self.check_open()
        if self._sock is not None and self._holder is not None and self._holder() is bucket:
            return self._token
        self._token = _token_from(self._exchange(REGISTRATION, [bucket.fd], timeout_s),
                                  self.path)
        self._holder = weakref.ref(bucket)
        return self._token

    def adopt(self, fd: int, timeout_s: float) -> str:
        """Hand memory the process adopts over (its descriptor `fd`); the agent's token for
        it, valid on this connection (`epoch`). Errors as `token_for`."""
        self.check_open()
        return _token_from(self._exchange(ADOPTION, [fd], timeout_s), self.path)

    def release(self, token: str, timeout_s: float) -> None:
        """Tell the agent to unmap the adopted bucket `token` (its memory was freed)."""
        self.check_open()
        if self._sock is not None:
            self._exchange(json.dumps({"op": "release", "token": token}).encode(), [],
                           timeout_s)

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def check_open(self) -> None:
        """Forget the connection if the agent closed it (a restart)."""
        if self._sock is not None and self._closed_by_agent():
            self.reset()

    def _exchange(self, message: bytes, fds: list[int], timeout_s: float) -> bytes:
        """Send one message (connecting first if needed); the agent's reply."""
        if self._sock is None:
            self._sock = self._connect(time.monotonic() + timeout_s)
            self.epoch += 1
        try:
            socket.send_fds(self._sock, [message], fds)
            self._sock.settimeout(timeout_s)
            return self._sock.recv(_REPLY_LIMIT)
        except TimeoutError:
            self.reset()
            raise CollectiveError(f"the agent's bucket socket {self.path} did not answer within "
                                  f"{timeout_s:.0f} s; is the agent stuck?") from None
        except OSError as exc:  # it closed meanwhile (a restart): the caller tries again
            self.reset()
            raise BucketUnavailable(f"the agent's bucket socket {self.path} closed while "
                                    f"handing over a bucket ({exc})",
                                    kind="bucket-unknown") from exc

    def _closed_by_agent(self) -> bool:
        """True when the agent's end has closed (it never sends unasked)."""
        assert self._sock is not None
        poller = select.poll()
        poller.register(self._sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(0))

    def _connect(self, deadline: float) -> socket.socket:
        """Connect, waiting until `deadline` for an agent that is (re)starting."""
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                sock.connect(str(self.path))
                return sock
            except PermissionError as exc:
                sock.close()
                raise BucketUnavailable(
                    f"cannot reach the agent's bucket socket {self.path} ({exc}); this user "
                    "must be in the local API's group (usermod -aG GROUP USER)",
                    kind="bucket-unreachable") from exc
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                if time.monotonic() >= deadline:
                    raise BucketUnavailable(
                        f"no agent takes buckets at {self.path} ({exc}); an agent of an older "
                        "oddl, or one that stopped", kind="bucket-unreachable") from exc
                time.sleep(0.02)

    def reset(self) -> None:
        """Forget the connection (closed by the agent, or refused the token)."""
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._holder = None
        self._token = ""

    close = reset


_LINKS: weakref.WeakSet[BucketLink] = weakref.WeakSet()


def _forget_links_in_child() -> None:
    """In a forked child (a DataLoader worker): close this process's copies of the bucket
    connections, so that the agent still lets go when the parent closes or dies."""
    for link in list(_LINKS):
        link.reset()


os.register_at_fork(after_in_child=_forget_links_in_child)


def _token_from(reply: bytes, path: Path) -> str:
    try:
        answer: Any = json.loads(reply)
    except (ValueError, RecursionError):
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("token"), str):
        return str(answer["token"])
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        raise OperationRefused(f"the agent refused the bucket: {answer['message']}")
    raise CollectiveError(f"unexpected reply from the agent's bucket socket {path}: "
                          f"{reply[:80]!r}")


class ClientBuckets:
    """A client's bucket and how requests name it (see the module docstring)."""

    def __init__(self, address: str):
        self.address = address
        path = localapi.bucket_socket(address)
        self._link = BucketLink(path) if path is not None and memfd.supported() else None
        self.bucket: Bucket | None = None
        self.adopted = AdoptedTable()
        self._finalizer = weakref.finalize(self, _close, self._link)

    @property
    def passes_descriptors(self) -> bool:
        """Whether the bucket is anonymous memory handed over as a descriptor."""
        return self._link is not None

    def for_bytes(self, nbytes: int) -> Bucket:
        """The bucket, replaced by a bigger one if it holds fewer than `nbytes` bytes."""
        if self.bucket is None or self.bucket.size < nbytes:
            self.discard()
            self.bucket = (memfd.MemfdBucket(nbytes) if self._link is not None else
                           SharedBucket(nbytes, group=localapi.shared_group(self.address)))
        return self.bucket

    def discard(self) -> None:
        """Never hand the current bucket out again (the agent may still write into it)."""
        if self.bucket is not None:
            self.bucket.close()
            self.bucket = None

    def naming(self, bucket: Named, timeout_s: float) -> dict[str, str | int]:
        """The request header fields that name `bucket` to the agent."""
        if isinstance(bucket, SharedBucket):
            return {"shm": str(bucket.path)}
        assert self._link is not None
        if isinstance(bucket, InRegion):
            return {"bucket": self._region_token(bucket.region, timeout_s),
                    "offset": bucket.offset}
        return {"bucket": self._link.token_for(bucket, timeout_s)}

    def adopt(self, memory: AdoptedMemory, timeout_s: float) -> bool:
        """Hand `memory` to the agent as an extra bucket (decision record 0017): arrays
        inside it are then reduced in place. False (with a warning) when the agent refuses
        it or cannot be reached that way: arrays in it keep taking the copy path."""
        if self._link is None:
            return False
        epoch = self._link.epoch
        for gone in self.adopted.add(memory):  # freed, replaced or beyond the bound
            if gone.token and gone.epoch == epoch:
                try:
                    self._link.release(gone.token, timeout_s)
                except (BucketUnavailable, CollectiveError) as exc:  # costs memory only
                    logger.debug("%s: could not release adopted memory: %s", self.address,
                                 exc)
        region = self.adopted.find_memory(memory)
        assert region is not None
        try:
            self._region_token(region, timeout_s)
        except (OperationRefused, BucketUnavailable) as exc:
            self.adopted.forget(region)
            logger.warning("%s: not adopted, arrays in it are copied into the bucket: %s",
                           self.address, exc)
            return False
        return True

    def holding(self, a: np.ndarray) -> Named | None:
        """What holds `a` already, so that it is reduced in place: the bucket (an array from
        `shared_array()`), or memory this client adopted; None when `a` must be copied."""
        if self.bucket is not None and self.bucket.owns(a):
            return self.bucket
        return self.adopted.find(a)

    def _region_token(self, region: Region, timeout_s: float) -> str:
        """The agent's token for an adopted region, handing it over (again) if this
        connection has not: a new connection, or the agent forgot it."""
        assert self._link is not None
        self._link.check_open()
        if region.token and region.epoch == self._link.epoch and self._link.connected:
            return region.token
        fd = region.memory.descriptor()
        if fd is None:
            raise BucketUnavailable("the adopted memory was freed", kind="bucket-unknown")
        region.token = self._link.adopt(fd, timeout_s)
        region.epoch = self._link.epoch
        return region.token

    def agent_forgot(self) -> None:
        """The agent holds no such token (it restarted): hand the bucket over again."""
        if self._link is not None:
            self._link.reset()

    def close(self) -> None:
        """Release the bucket and the connection to the bucket socket."""
        self.discard()
        self._finalizer()


def _close(link: BucketLink | None) -> None:
    if link is not None:
        link.close()
