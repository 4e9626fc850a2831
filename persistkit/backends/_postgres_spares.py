"""The async side's spare PostgreSQL connections (beyond the dedicated one).

An operation that finds the store's dedicated connection of its event loop
busy (another task is on it) takes a spare: an idle one, or one it opens
itself, in its own task. Nothing ever runs in the background. That is the
difference from ``psycopg_pool.AsyncConnectionPool``, which grows in a task of
its own: when a program's ``asyncio.run()`` ended while that task was still
connecting (the caller had been served by a connection handed back
meanwhile), psycopg reported the cancelled connect as a failure, the pool
scheduled a retry, and the loop's shutdown waited for it forever. Here a
cancelled connect is the cancelled caller's, and an idle spare left behind
by a loop that ended is closed by the garbage collector (libpq needs no loop).

At most ``max_size`` spares are out at once (a caller waits up to
``timeout`` seconds for one, then gets ``PoolTimeout``); idle ones are kept
for reuse, replaced when dead or older than an hour, and closed after ten
idle minutes (checked when a spare is taken) or by :meth:`close`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import PoolClosed, PoolTimeout

from ._postgres_async import MAX_LIFETIME

__all__ = ["AsyncSpares"]

# An idle spare is closed when it has not been used for this many seconds.
MAX_IDLE = 600.0
_IDLE = psycopg.pq.TransactionStatus.IDLE


class _Spare:
    __slots__ = ("conn", "opened", "used")

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.conn = conn
        self.opened = self.used = time.monotonic()

    def usable(self, now: float) -> bool:
        conn = self.conn
        return not (
            conn.closed
            or conn.broken
            or conn.pgconn.transaction_status != _IDLE
            or now - self.opened > MAX_LIFETIME
            or now - self.used > MAX_IDLE
        )


class AsyncSpares:
    """Spare connections of one event loop; see the module's docstring."""

    def __init__(
        self, conninfo: str, kwargs: Mapping[str, Any], *, max_size: int, timeout: float
    ) -> None:
        self._conninfo = conninfo
        self._kwargs = dict(kwargs)
        self._timeout = timeout
        self._free = asyncio.Semaphore(max_size)
        self._idle: list[_Spare] = []
        self._closed = False

    async def open(self) -> None:
        """Nothing is opened ahead of need (the pool interface's ``open``)."""

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        if self._closed:
            raise PoolClosed("the store was closed")
        try:
            await asyncio.wait_for(self._free.acquire(), self._timeout)
        except TimeoutError:
            raise PoolTimeout(f"no connection became free in {self._timeout:g} s") from None
        try:
            spare = await self._take()
            try:
                yield spare.conn
            finally:
                await self._give_back(spare)
        finally:
            self._free.release()

    async def _take(self) -> _Spare:
        now = time.monotonic()
        while self._idle:
            spare = self._idle.pop()  # the most recently used: the likeliest alive
            if spare.usable(now):
                return spare
            await spare.conn.close()
        return _Spare(await AsyncConnection.connect(self._conninfo, **self._kwargs))

    async def _give_back(self, spare: _Spare) -> None:
        spare.used = time.monotonic()
        if self._closed or not spare.usable(spare.used):
            await spare.conn.close()
        else:
            self._idle.append(spare)

    async def check(self) -> None:
        """After a connection failure: the idle spares are likely dead too; drop them
        all (the next operations open fresh ones)."""
        idle, self._idle = self._idle, []
        for spare in idle:
            await spare.conn.close()

    async def close(self) -> None:
        """Close the idle spares; those in use are closed when handed back."""
        self._closed = True
        await self.check()

    def finish(self) -> None:
        """:meth:`close` without an event loop (libpq's close), from any thread."""
        self._closed = True
        idle, self._idle = self._idle, []
        for spare in idle:
            spare.conn.pgconn.finish()
