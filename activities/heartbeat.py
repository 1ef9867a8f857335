"""Heartbeats for activities that wait: a worker that dies mid-activity is then noticed after
the heartbeat timeout instead of the whole start-to-close bound, and a cancel reaches the
activity while it waits."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Iterator
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")
_PROGRESS: contextvars.ContextVar[list[object]] = contextvars.ContextVar("heartbeat_progress")


def record_progress(*details: object) -> None:
    """Heartbeats `details` now and with every later heartbeat of this attempt: a retried
    attempt reads them back from `activity.info().heartbeat_details` to resume (a submitted
    job's id, say) instead of starting over."""
    holder = _PROGRESS.get(None)
    if holder is not None:
        holder[:] = details
    activity.heartbeat(*details)


@contextlib.contextmanager
def heartbeating_thread() -> Iterator[None]:
    """For blocking calls in thread-pool activities: heartbeats from a side thread while the
    call runs longer than a third of the heartbeat timeout (short calls send none: each
    heartbeat is a call to the server). Does nothing without a heartbeat timeout."""
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    if not timeout:
        yield
        return
    stop = threading.Event()
    progress: list[object] = []
    token = _PROGRESS.set(progress)
    context = contextvars.copy_context()  # the activity's, for activity.heartbeat

    def beat() -> None:
        while not stop.wait(timeout.total_seconds() / 3):
            context.run(activity.heartbeat, *progress)

    threading.Thread(target=beat, name="activity-heartbeat", daemon=True).start()
    try:
        yield
    finally:
        stop.set()
        _PROGRESS.reset(token)


async def heartbeating(work: Awaitable[T], every_s: float = 1.0) -> T:
    """For async activities: awaits `work` while heartbeating; cancelling the activity cancels
    `work` (for a generate request, vLLM aborts it)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            activity.heartbeat()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
