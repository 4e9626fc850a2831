"""``board.watch(pattern)``: change events of the keys that match a glob pattern.

The store sends hints (``Backend.watch_open``: pushed by PostgreSQL ``NOTIFY`` and Redis
``PUBLISH``, polled cheaply by SQLite and S3), one feed per board per process, shared by all
its watches (``_hub``); a hint is never the data, so the watch
reads the key and emits a :class:`~persistkit.blackboard._entries.BoardChange` when its version
is newer than the last one it emitted for that key. A store without ``watch`` is polled
with ``kv_list`` every ``poll_interval`` seconds (1 s by default).

No change is missed, even across a dropped connection: the watch remembers the version it
last saw of every matching key (its ``position``), and when hints may have been lost (the
store says so after reconnecting, or a poll saw the store move) it lists the keys again and
emits every key whose version moved past its position, and a ``delete`` for every key that
went away. Changes of one key may coalesce: a watcher that falls behind sees the key's
latest version, not each one in between (``board.history`` has those). A watcher that stops
and starts again passes ``since=watch.position`` to go on from where it was. Memory: one
entry per matching key.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, StoreClosedError
from .._io import call
from ..backends._protocol import KvEntry, KvHint, KvWatch
from . import _entries as E
from ._entries import BoardChange
from ._hub import Subscription, subscribe

if TYPE_CHECKING:
    from ._board import BoardCore as Board

__all__ = ["AsyncBoardWatch", "BoardWatch"]

POLL_INTERVAL = 1.0
_PAGE = 1000


class _Tracker:
    """The watch's bookkeeping, without I/O: what to read, and what to emit."""

    def __init__(self, board: Board, pattern: str, since: dict[str, int] | None, allow: Callable[[str], bool] | None) -> None:
        if not isinstance(pattern, str) or not pattern or "\x00" in pattern:
            raise ConfigurationError(f"pattern must be a glob such as 'research/*' ('*' for every key), got {pattern!r}")
        if since is not None and not (
            isinstance(since, dict) and all(isinstance(k, str) and isinstance(v, int) for k, v in since.items())
        ):
            raise ConfigurationError("since must be a watch's position: a dict of key -> version")
        self.board = board
        self.pattern = pattern
        self.prefix = E.literal_prefix(pattern)
        self.allow = allow  # a scoped handle's read check: other keys are never read nor emitted
        # A position may come from a wider watch (or be made up): only the keys this watch may
        # see are kept, so it never reads nor reports another key.
        self.seen: dict[str, int] = {k: v for k, v in (since or {}).items() if self.matches(k)}
        # What the caller has been given (or was there when the watch started): the position.
        # ``seen`` runs ahead of it by the changes still queued.
        self.delivered: dict[str, int] = dict(self.seen)
        self.emit_listing = since is not None  # the first listing reports what moved since then
        self.queue: deque[BoardChange] = deque()
        self.closed = False

    def matches(self, key: str) -> bool:
        return E.matches(self.pattern, key) and (self.allow is None or self.allow(key))

    def wanted(self, hint: KvHint) -> bool:
        return hint.key is not None and self.matches(hint.key) and hint.version > self.seen.get(hint.key, 0)

    def on_entry(self, key: str, entry: KvEntry | None) -> None:
        if entry is None or entry.version <= self.seen.get(key, 0):
            return
        self.seen[key] = entry.version
        self.queue.append(BoardChange(key, entry.version, "delete" if entry.value is None else "put"))

    def on_listing(self, listed: dict[str, int]) -> list[str]:
        """Emit what the listing shows moved; the keys that went away (read them for their
        delete's version)."""
        emit = self.emit_listing
        self.emit_listing = True
        for key, version in listed.items():
            if version > self.seen.get(key, 0):
                self.seen[key] = version
                if emit:
                    self.queue.append(BoardChange(key, version, "put"))
                else:
                    self.delivered[key] = version
        return [k for k in self.seen if k not in listed]

    def pop(self) -> BoardChange:
        change = self.queue.popleft()
        self.delivered[change.key] = change.version
        return change

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(f"this watch of {self.pattern!r} on board {self.board.name!r} was closed")


class BoardWatch:
    """An iterator of :class:`BoardChange` (blocking). ``next(timeout)`` returns one or None;
    close it (or use it as a context manager) when done."""

    def __init__(self, board: Board, pattern: str, *, poll_interval: float | None = None, since: dict[str, int] | None = None,
        allow: Callable[[str], bool] | None = None,
    ) -> None:
        self._t = _Tracker(board, pattern, since, allow)
        self._interval = _interval(poll_interval)
        self._store = board.store
        # Open the feed before the first listing, so that no write falls between the two.
        # One feed per board in this process, shared by its watches (``_hub``).
        self._feed: KvWatch | None = subscribe(board.store.backend, board.name) if board.store.backend.supports_watch else None
        self._relist()

    @property
    def position(self) -> dict[str, int]:
        """The version of every matching key as of the last change ``next`` returned (changes still
        queued are not in it): pass it as ``since=`` to go on later without missing one."""
        return dict(self._t.delivered)

    def _relist(self) -> None:
        listed: dict[str, int] = {}
        after = None
        while True:
            page: list[KvEntry] = self._store.call_sync(call("kv_list", self._t.board.name, prefix=self._t.prefix, after=after, limit=_PAGE))
            listed.update((e.key, e.version) for e in page if self._t.matches(e.key))
            if len(page) < _PAGE:
                break
            after = page[-1].key
        for key in self._t.on_listing(listed):
            self._read(key)

    def _read(self, key: str, at_least: int = 0) -> None:
        feed = self._feed
        entry = feed.cached(key, at_least) if isinstance(feed, Subscription) and at_least else None
        if entry is None:
            entry = self._store.call_sync(call("kv_get", self._t.board.name, key))
            if isinstance(feed, Subscription) and entry is not None:
                feed.remember(entry)
        self._t.on_entry(key, entry)

    def next(self, timeout: float | None = None) -> BoardChange | None:
        """The next change, waiting up to ``timeout`` seconds (None: until there is one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._t.queue:
            self._t.check_open()
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                return None
            if self._feed is None:
                time.sleep(min(wait, self._interval))
                hints = [KvHint(None)]
            else:
                hints = self._feed.hints(min(wait, 1.0))
            for hint in hints:
                if hint.key is None:
                    self._relist()
                elif self._t.wanted(hint):
                    self._read(hint.key, hint.version)
        return self._t.pop()

    def __iter__(self) -> Iterator[BoardChange]:
        while True:
            change = self.next()
            if change is not None:
                yield change

    def close(self) -> None:
        self._t.closed = True
        if self._feed is not None:
            self._feed.close()

    def __enter__(self) -> BoardWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncBoardWatch:
    """``board.awatch(pattern)``: ``async for change in watch`` (or ``await watch.next(timeout)``).

    Opening needs the event loop, so the watch starts when it is first awaited: ``watch =
    await board.awatch(p)`` or ``async with board.awatch(p) as watch`` (changes from then on
    are reported), or the first ``next`` / iteration step.
    """

    def __init__(self, board: Board, pattern: str, *, poll_interval: float | None = None, since: dict[str, int] | None = None,
        allow: Callable[[str], bool] | None = None,
    ) -> None:
        self._t = _Tracker(board, pattern, since, allow)
        self._interval = _interval(poll_interval)
        self._store = board.store
        self._feed: KvWatch | None = None
        self._started = False

    @property
    def position(self) -> dict[str, int]:
        return dict(self._t.delivered)

    async def _start(self) -> None:
        if not self._started:
            self._started = True
            backend = self._store.backend
            if backend.supports_watch:
                try:  # the process's shared feed of the board (opened in a thread: it may connect)
                    self._feed = await asyncio.to_thread(subscribe, backend, self._t.board.name)
                except ConfigurationError:  # a store with only an async client: a feed of its own
                    self._feed = await backend.awatch_open(self._t.board.name)
            await self._relist()

    async def _relist(self) -> None:
        listed: dict[str, int] = {}
        after = None
        while True:
            page: list[KvEntry] = await self._store.call_async(call("kv_list", self._t.board.name, prefix=self._t.prefix, after=after, limit=_PAGE))
            listed.update((e.key, e.version) for e in page if self._t.matches(e.key))
            if len(page) < _PAGE:
                break
            after = page[-1].key
        for key in self._t.on_listing(listed):
            await self._read(key)

    async def _read(self, key: str, at_least: int = 0) -> None:
        feed = self._feed
        entry = feed.cached(key, at_least) if isinstance(feed, Subscription) and at_least else None
        if entry is None:
            entry = await self._store.call_async(call("kv_get", self._t.board.name, key))
            if isinstance(feed, Subscription) and entry is not None:
                feed.remember(entry)
        self._t.on_entry(key, entry)

    async def next(self, timeout: float | None = None) -> BoardChange | None:
        await self._start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._t.queue:
            self._t.check_open()
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                return None
            if self._feed is None:
                await asyncio.sleep(min(wait, self._interval))
                hints = [KvHint(None)]
            else:
                hints = await self._feed.ahints(min(wait, 1.0))
            for hint in hints:
                if hint.key is None:
                    await self._relist()
                elif self._t.wanted(hint):
                    await self._read(hint.key, hint.version)
        return self._t.pop()

    def __aiter__(self) -> AsyncIterator[BoardChange]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[BoardChange]:
        while True:
            change = await self.next()
            if change is not None:
                yield change

    async def aclose(self) -> None:
        self._t.closed = True
        if self._feed is not None:
            await self._feed.aclose()

    async def __aenter__(self) -> AsyncBoardWatch:
        await self._start()
        return self

    def __await__(self) -> Generator[Any, None, AsyncBoardWatch]:
        return self.__aenter__().__await__()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _interval(poll_interval: float | None) -> float:
    if poll_interval is None:
        return POLL_INTERVAL
    if not isinstance(poll_interval, (int, float)) or isinstance(poll_interval, bool) or not 0 < poll_interval <= 3600:
        raise ConfigurationError(f"poll_interval must be seconds > 0 (at most an hour), got {poll_interval!r}")
    return float(poll_interval)
