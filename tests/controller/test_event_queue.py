"""A node's event queue (`oddl.controller.event_queue`): pushed from threads, awaited on a loop."""

from __future__ import annotations

import asyncio
import threading

from oddl.controller.event_queue import EventQueue, wake_all
from oddl.protos import oddl_pb2 as pb


def _ended(job: str) -> pb.ScheduleEvent:
    return pb.ScheduleEvent(ended=pb.JobEnded(job_id=job))


def test_keyed_events_replace_in_place_and_others_keep_order() -> None:
    q = EventQueue()
    q.put(_ended("a"), key="k")
    q.put(_ended("b"))
    q.put(_ended("c"), key="k")  # replaces "a" where it stood
    assert [q.get_nowait().ended.job_id for _ in range(2)] == ["c", "b"]
    assert q.get_nowait() is None
    q.put(_ended("d"), key="k")  # the key was sent: a new event, at the end
    assert q.get_nowait().ended.job_id == "d"


async def _consume(q: EventQueue, n: int, started: threading.Event) -> list[str]:
    got: list[str] = []
    started.set()
    while len(got) < n:
        event = q.get_nowait()
        if event is None:
            await q.wait()
            continue
        got.append(event.ended.job_id)
    return got


def test_a_stream_parked_on_a_loop_wakes_for_pushes_from_threads() -> None:
    """Many streams parked on one loop; pushes from other threads wake each (one hop per
    loop for all of them)."""
    queues = [EventQueue() for _ in range(50)]
    started = [threading.Event() for _ in queues]

    def push() -> None:
        for e in started:
            e.wait(60)
        for k in range(3):
            wake_all([q.put(_ended(str(k))) for q in queues])

    async def main() -> list[list[str]]:
        pusher = threading.Thread(target=push)
        pusher.start()
        try:
            return await asyncio.wait_for(asyncio.gather(
                *(_consume(q, 3, s) for q, s in zip(queues, started, strict=True))), 120)
        finally:
            pusher.join()

    assert asyncio.run(main()) == [["0", "1", "2"]] * len(queues)


def test_a_kick_wakes_a_stream_without_an_event() -> None:
    async def main() -> bool:
        q = EventQueue()
        waiting = asyncio.create_task(q.wait())
        await asyncio.sleep(0)
        wake_all([q.kick()])
        await asyncio.wait_for(waiting, 60)
        return q.get_nowait() is None
    assert asyncio.run(main())
