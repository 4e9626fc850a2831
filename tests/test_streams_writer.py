"""The stream writer's fencing, without a real lease takeover: a writer that holds an older
lease token than the one that wrote the stream's next batch stops (a zombie), and its later
events never reach a reader; the newer holder's rewind takes back what the zombie left."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import persistkit as pk
from persistkit.streams._writer import RunStreams
from persistkit.testing.stream_suite import view


def _run(store: pk.Store, thread: str, run_id: str, token: int) -> Any:
    """What a RunStreams reads of a run (the engine's Run has these)."""
    return SimpleNamespace(
        store=store, codec=store.codec, thread_id=thread, namespace="", run_id=run_id,
        lease=SimpleNamespace(token=token), _index={}, _max_child={}, _marks={}, _attach={},
    )


def _frame(run: Any) -> Any:
    return SimpleNamespace(run=run, path="", seq=None)


def test_a_writer_overtaken_by_a_newer_lease_holder_stops(local_store: pk.Store) -> None:
    thread = f"zombie-{uuid.uuid4().hex[:8]}"
    old = _run(local_store, thread, "r1", token=1)
    zombie = RunStreams(old, None)
    zombie.add(_frame(old), "default", "a")
    zombie.flush()
    new = _run(local_store, thread, "r1", token=2)  # the run continued elsewhere under a newer lease
    holder = RunStreams(new, None)
    holder.add(_frame(new), "default", "b")
    holder.flush()
    zombie.add(_frame(old), "default", "c")  # the zombie goes on: it meets the holder's batch
    zombie.flush()
    assert zombie.streams["default"].lost is not None and "lease token 2" in zombie.streams["default"].lost
    records = list(local_store.read_stream(thread, follow=False))
    assert [r.kind for r in records] == ["event", "rewind", "event"]
    assert view(records) == ["b"] and records[1].to == 0
    assert records[2].attempt == 2  # the same run's next attempt at this stream


def test_sse_sends_a_keepalive_while_the_stream_is_quiet(local_store: pk.Store) -> None:
    import asyncio

    thread = f"sse-{uuid.uuid4().hex[:8]}"
    with pk.resume(thread, store=local_store):
        pk.emit({"token": "hi"})

    async def collect() -> list[bytes]:
        return [chunk async for chunk in pk.sse(local_store, thread, last_event_id="2", timeout=0.5, heartbeat=0.05)]

    chunks = asyncio.run(collect())  # after the end record: waits for the next run, quietly
    assert chunks[0].startswith(b"retry:") and b": keepalive\n\n" in chunks[1:]
    first = asyncio.run(_first(local_store, thread))
    assert first.startswith(b"id: 1\nevent: event\ndata: ") and b'"token": "hi"' in first
    assert asyncio.run(_leave_while_waiting(local_store, thread)) == b": keepalive\n\n"


async def _leave_while_waiting(store: pk.Store, thread: str) -> bytes:
    gen = pk.sse(store, thread, last_event_id=2, heartbeat=0.05)
    await gen.__anext__()  # retry:
    chunk = await gen.__anext__()  # the reader waits for the next run in its task
    await gen.aclose()  # the client leaves mid-wait: the waiting reader is cancelled and closed
    return chunk


async def _first(store: pk.Store, thread: str) -> bytes:
    gen = pk.sse(store, thread)
    await gen.__anext__()  # retry:
    chunk = await gen.__anext__()
    await gen.aclose()  # a client that goes away: the reader task is cancelled, nothing leaks
    return chunk
