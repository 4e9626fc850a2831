"""One feed of a board's hints per process, shared by every watch of that board.

A store's watch costs something per watch: a ``LISTEN`` connection on PostgreSQL, a
pub/sub connection on Redis, a polling loop on SQLite and S3. A hundred watchers of one
board in a process would pay it a hundred times (and a PostgreSQL server allows about a
hundred connections in all). So the watches of one board on one store share a hub: one
``Backend.watch_open`` and one thread that waits on it and hands every hint to each
watch's own queue. The hub opens when its first watch does (before that watch lists the
board, so no write falls between the two) and closes with its last.

The watches of a hub also share what they read: a hint of ``(key, version)`` makes every
watch read that key, so the first to read it keeps the entry in the hub and the others take
it from there (a bounded cache of the latest entries), one read per write instead of one per
watch. Sync watches wait on a condition; async ones on an ``asyncio.Event`` that the hub's thread
sets through their loop. A hint a watch has not taken yet is merged with the next one for
the same key (the newer version wins), as a store's own feed may do.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from .._errors import BackendUnavailableError, PersistkitError, StoreClosedError
from ..backends._protocol import Backend, KvEntry, KvHint, KvWatch

__all__ = ["subscribe"]

_HUBS: dict[tuple[int, str], _Hub] = {}
_LOCK = threading.Lock()
_CACHED = 4096  # latest entries a hub keeps for its watches
_WAIT = 0.5  # how long the hub's thread waits on the feed before looking at its watches again


class Subscription(KvWatch):
    """One watch's share of a hub: a ``KvWatch`` whose hints the hub's thread pushes."""

    def __init__(self, hub: _Hub) -> None:
        self._hub = hub
        self._ready = threading.Condition()
        self._pending: dict[str | None, int] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._waker: Callable[[], None] | None = None

    def push(self, hints: builtins.list[KvHint]) -> None:
        with self._ready:
            for h in hints:
                self._pending[h.key] = max(h.version, self._pending.get(h.key, 0))
            self._ready.notify_all()
            waker, self._waker = self._waker, None
        if waker is not None:
            waker()

    def fail(self, error: BaseException) -> None:
        with self._ready:
            self._error = error
            self._ready.notify_all()
            waker, self._waker = self._waker, None
        if waker is not None:
            waker()

    def _take(self) -> builtins.list[KvHint] | None:
        """Under the lock: the pending hints, or None if there are none (raises when closed or failed)."""
        if self._closed:
            raise StoreClosedError("this watch was closed; open a new one")
        if self._error is not None:
            raise self._error
        if not self._pending:
            return None
        found = [KvHint(k, v) for k, v in self._pending.items()]
        self._pending.clear()
        return found

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._ready:
            while True:
                found = self._take()
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._ready.wait(left)

    async def ahints(self, timeout: float) -> builtins.list[KvHint]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while True:
            event = asyncio.Event()
            with self._ready:
                found = self._take()
                if found is not None:
                    return found
                self._waker = functools.partial(_wake, loop, event)
            left = deadline - loop.time()
            if left <= 0:
                return []
            try:
                await asyncio.wait_for(event.wait(), left)
            except TimeoutError:
                with self._ready:
                    self._waker = None
                    found = self._take()
                return found or []

    def cached(self, key: str, at_least: int) -> KvEntry | None:
        """The hub's latest read of ``key``, if it is at version ``at_least`` or later."""
        return self._hub.cached(key, at_least)

    def remember(self, entry: KvEntry) -> None:
        self._hub.remember(entry)

    def close(self) -> None:
        with self._ready:
            if self._closed:
                return
            self._closed = True
            self._ready.notify_all()
        self._hub.leave(self)

    async def aclose(self) -> None:
        self.close()


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    with contextlib.suppress(RuntimeError):  # the waiting loop has closed: nobody waits any more
        loop.call_soon_threadsafe(event.set)


class _Hub:
    """The shared feed of one board (scope) on one store, and the thread that reads it."""

    def __init__(self, backend: Backend, scope: str) -> None:
        self.key = (id(backend), scope)
        self.backend = backend  # held: the id in the key must not be reused while the hub lives
        self.feed: KvWatch = backend.watch_open(scope)  # opened here: before the first watch lists
        self.subs: set[Subscription] = set()
        self.stopped = False
        self._read: OrderedDict[str, KvEntry] = OrderedDict()  # the latest entries its watches read
        self._read_lock = threading.Lock()
        threading.Thread(target=self._run, name=f"persistkit-board-watch-{scope}", daemon=True).start()

    def _run(self) -> None:
        try:
            while not self.stopped:
                try:
                    hints = self.feed.hints(_WAIT)
                except BackendUnavailableError:
                    time.sleep(_WAIT)  # the store is away: its next answer says "list again"
                    continue
                except PersistkitError as exc:  # closed, or a fault a retry cannot mend
                    self._fail(exc)
                    return
                if hints:
                    with _LOCK:
                        subs = list(self.subs)
                    for sub in subs:
                        sub.push(hints)
        finally:
            self.feed.close()

    def _fail(self, error: BaseException) -> None:
        with _LOCK:
            self.stopped = True
            if _HUBS.get(self.key) is self:
                del _HUBS[self.key]
            subs = list(self.subs)
        for sub in subs:
            sub.fail(error)

    def cached(self, key: str, at_least: int) -> KvEntry | None:
        with self._read_lock:
            entry = self._read.get(key)
        return entry if entry is not None and entry.version >= at_least else None

    def remember(self, entry: KvEntry) -> None:
        with self._read_lock:
            known = self._read.get(entry.key)
            if known is None or known.version < entry.version:
                self._read[entry.key] = entry
                self._read.move_to_end(entry.key)
                while len(self._read) > _CACHED:
                    self._read.popitem(last=False)

    def leave(self, sub: Subscription) -> None:
        with _LOCK:
            self.subs.discard(sub)
            if not self.subs and not self.stopped:
                self.stopped = True  # the thread closes the feed when its wait returns
                if _HUBS.get(self.key) is self:
                    del _HUBS[self.key]


def subscribe(backend: Backend, scope: str) -> Subscription:
    """A watch of ``scope`` on ``backend`` that shares this process's feed of it (blocking:
    the first watch of a board opens the store's feed)."""
    with _LOCK:
        hub = _HUBS.get((id(backend), scope))
        if hub is None or hub.stopped:
            hub = _HUBS[(id(backend), scope)] = _Hub(backend, scope)
        sub = Subscription(hub)
        hub.subs.add(sub)
        return sub
