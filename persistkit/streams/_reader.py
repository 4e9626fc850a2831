"""``store.read_stream``: the records of a stream after an offset, then its live tail.

One reader object is both a sync and an async iterator. What to make of the batches it
lists is decided once (:class:`Follow`, no I/O); the two loops only differ in how they list
and how they wait: the store's ``watch`` (opened before the first listing, so a write in
between is hinted, not missed) where it has one, else a poll every ``poll_interval``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .._errors import ConfigurationError
from .._io import call
from ..backends._capabilities import require
from . import _format as F
from ._format import StreamEvent

__all__ = ["Follow", "StreamReader"]

_PAGE = 64


class Follow:
    """What a reader has seen and what it yields next (no I/O)."""

    def __init__(self, codec: Any, after: int, final_only: bool, where: str) -> None:
        self.codec = codec
        self.last = after
        self.final_only = final_only
        self.where = where
        self.cursor = F.batch_key(max(after + 1 - F.MAX_BATCH, 1) - 1)  # list batches after this key
        self.held: list[StreamEvent] = []  # final_only: events not final yet
        self.ended = False  # the last record read is a run's end

    def feed(self, entries: list[Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for e in entries:
            batch = F.load_batch(self.codec, e.key, e.value, self.where)
            self.cursor = e.key
            if batch.start > self.last + 1:  # batches are dense: what is missing was trimmed by a prune
                self.last = batch.start - 1
                out.append(pruned(self.last))
            for i in range(len(batch.records)):
                off = batch.start + i
                if off <= self.last:
                    continue
                self.last = off
                out.extend(self._take(F.event_of(self.codec, batch, i, self.where)))
        return out

    def _take(self, ev: StreamEvent) -> list[StreamEvent]:
        self.ended = ev.kind == "end"
        if not self.final_only:
            return [ev]
        if ev.kind == "event":
            self.held.append(ev)
            return []
        if ev.kind == "end":
            out = self.held if ev.data == "completed" else []
            self.held = []
            return [*out, ev]
        if ev.kind == "pruned":
            return [ev]
        assert ev.to is not None
        if ev.kind == "rewind":
            self.held = [h for h in self.held if h.offset <= ev.to]
        out = [h for h in self.held if h.offset <= ev.to]
        self.held = [h for h in self.held if h.offset > ev.to]
        return out


def pruned(to: int) -> StreamEvent:
    """The record a reader gets in place of offsets a prune trimmed (up to ``to``): not
    stored, at offset ``to`` (a reader reconnecting after it goes on from the next one)."""
    return StreamEvent(to, "pruned", None, "", "", 0, 0.0, to)


class StreamReader:
    """``for ev in store.read_stream(...)`` or ``async for ev in store.read_stream(...)``."""

    def __init__(
        self, store: Any, thread_id: str, stream: str, namespace: str, after: object, final_only: bool,
        follow: bool, timeout: float | None, poll_interval: float,
    ) -> None:
        require(store.backend, "kv", "store.read_stream (durable streams)")
        if not isinstance(thread_id, str) or not thread_id:
            raise ConfigurationError(f"thread_id must be a non-empty str, got {thread_id!r}")
        if not isinstance(namespace, str):
            raise ConfigurationError(f"namespace must be a str, got {namespace!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ConfigurationError(f"timeout must be seconds >= 0 or None, got {timeout!r}")
        if not isinstance(poll_interval, (int, float)) or not 0 < poll_interval <= 60:
            raise ConfigurationError(f"poll_interval must be seconds in (0, 60], got {poll_interval!r}")
        self.store = store
        self.name = F.check_stream(stream)
        self.scope = F.scope_of(thread_id, namespace, self.name)
        self.after = F.check_offset(after)
        self.final_only = bool(final_only)
        self.follow = bool(follow)
        self.timeout = timeout
        self.poll = float(poll_interval)
        self.where = f"thread {thread_id!r} stream {self.name!r}"

    def _follow(self) -> Follow:
        return Follow(self.store.codec, self.after, self.final_only, self.where)

    def _wait(self, idle_since: float) -> float | None:
        """Seconds to wait for the next hint, or None when the timeout has passed."""
        if self.timeout is None:
            return self.poll if not self.store.backend.supports_watch else 1.0
        left = self.timeout - (time.monotonic() - idle_since)
        if left <= 0:
            return None
        return min(left, self.poll if not self.store.backend.supports_watch else 1.0)

    def __iter__(self) -> Iterator[StreamEvent]:
        f, backend = self._follow(), self.store.backend
        watch = backend.watch_open(self.scope) if self.follow and backend.supports_watch else None
        idle = time.monotonic()
        try:
            while True:
                entries = self.store.call_sync(call("kv_list", self.scope, prefix="b", after=f.cursor, limit=_PAGE))
                out = f.feed(entries)
                yield from out
                if len(entries) == _PAGE:
                    continue  # more to list before the tail
                if not self.follow or f.ended:
                    return  # at the tail: a follower stops once the run it saw last has ended
                if out:
                    idle = time.monotonic()
                    continue
                wait = self._wait(idle)
                if wait is None:
                    return
                if watch is not None:
                    watch.hints(wait)
                else:
                    time.sleep(wait)
        finally:
            if watch is not None:
                watch.close()

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        import asyncio

        f, backend = self._follow(), self.store.backend
        watch = await backend.awatch_open(self.scope) if self.follow and backend.supports_watch else None
        idle = time.monotonic()
        try:
            while True:
                entries = await self.store.call_async(call("kv_list", self.scope, prefix="b", after=f.cursor, limit=_PAGE))
                out = f.feed(entries)
                for ev in out:
                    yield ev
                if len(entries) == _PAGE:
                    continue  # more to list before the tail
                if not self.follow or f.ended:
                    return  # at the tail: a follower stops once the run it saw last has ended
                if out:
                    idle = time.monotonic()
                    continue
                wait = self._wait(idle)
                if wait is None:
                    return
                if watch is not None:
                    await watch.ahints(wait)
                else:
                    await asyncio.sleep(wait)
        finally:
            if watch is not None:
                await watch.aclose()
