"""Server-Sent Events of a stream: an ASGI-ready async generator (docs/streams.md, "Serve it").

Each record is one SSE event: ``id:`` its offset (so the browser's ``EventSource`` sends it
back as ``Last-Event-ID`` when it reconnects), ``event:`` its kind, ``data:`` one line of JSON.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import suppress
from typing import Any

from ._format import StreamEvent

__all__ = ["sse", "sse_event"]


def sse_event(ev: StreamEvent) -> bytes:
    """One record as the bytes of one Server-Sent Event."""
    payload: dict[str, Any] = {"data": ev.data, "run": ev.run_id, "step": ev.step, "attempt": ev.attempt}
    if ev.to is not None:
        payload["to"] = ev.to
    if ev.copy_of is not None:
        payload["copy_of"] = ev.copy_of
    data = json.dumps(payload, default=str, ensure_ascii=False)
    return f"id: {ev.offset}\nevent: {ev.kind}\ndata: {data}\n\n".encode()


async def sse(
    store: Any, thread_id: str, stream: str = "default", *, last_event_id: str | int | None = None,
    namespace: str = "", final_only: bool = False, timeout: float | None = None, retry_ms: int = 1000,
    heartbeat: float | None = 15.0,
) -> AsyncIterator[bytes]:
    """The records of ``thread_id``'s stream after ``last_event_id`` (the request's
    ``Last-Event-ID`` header; None: from the start) as Server-Sent Events, following the live
    tail until the run's ``end`` record. Hand it to a streaming response, e.g. Starlette's
    ``StreamingResponse(pk.sse(store, thread_id, last_event_id=request.headers.get("last-event-id")),
    media_type="text/event-stream")``. ``heartbeat``: seconds of quiet after which a comment
    line is sent (proxies close idle connections); None sends none."""
    import asyncio

    after = last_event_id if last_event_id not in (None, "") else 0
    reader = store.read_stream(thread_id, stream, after=after, namespace=namespace, final_only=final_only, timeout=timeout)
    yield f"retry: {int(retry_ms)}\n\n".encode()
    records: AsyncGenerator[StreamEvent, None] = reader.__aiter__()
    pending: asyncio.Task[StreamEvent] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(records.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=heartbeat)
            if not done:
                yield b": keepalive\n\n"  # the reader keeps waiting in its task
                continue
            try:
                ev = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield sse_event(ev)
    finally:  # done, or the client went away: stop the reader (its watch is closed by it)
        if pending is not None:
            pending.cancel()
            with suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        await records.aclose()
