"""The PostgreSQL kv space's operations and watch, written once (async).

``_postgres_kv_async.py`` is the hand-written source; ``_postgres_kv_sync.py`` is
generated from it by ``scripts/unasync.py``. :class:`AsyncKvCore` runs the statements of
``_postgres_kv_sql`` through the store's core (its connections, migration check, read
retries and error mapping); :class:`AsyncWatchCore` holds one LISTEN connection (see
``_postgres_kv.py`` for the public watch classes and the design).
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection

from .._errors import AccessDeniedError, ConflictError, StoreClosedError
from ._postgres_async import AsyncCore, Cur, _fetch
from ._postgres_kv_sql import NOT_ALL_MOVED, KvQueries, channel, covers, glob_of, hint_of
from ._postgres_sql import log, map_error
from ._protocol import KvEntry, KvHint, KvOp

__all__ = ["AsyncKvCore", "AsyncWatchCore"]

# A waiting watch wakes at least this often to notice a close from another thread.
_WAIT_SLICE = 0.25


def _entry(key: str, found: tuple[Any, ...]) -> KvEntry:
    version, value = found
    return KvEntry(key, int(version), None if value is None else bytes(value))


class AsyncKvCore:
    """The kv primitives of one store, on its core's connections."""

    def __init__(self, core: AsyncCore, conninfo: str, connect: Mapping[str, Any]) -> None:
        self._core = core
        self._shared = core._shared
        self._q = KvQueries(self._shared.queries.schema, self._shared.queries.quoted_schema)
        self._conninfo = conninfo
        self._connect = dict(connect)

    async def get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        query = self._q.get if version is None else self._q.get_version
        params = {"scope": scope, "key": key, "version": version}

        async def op(cur: Cur) -> KvEntry | None:
            found = await _read(cur, query, params, self._shared.url, scope, key)
            return _entry(key, found[0]) if found else None

        return await self._core._run(f"kv read of key {key!r} in scope {scope!r}", None, op, read=True)

    async def history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        params = {"scope": scope, "key": key, "before": before, "limit": None if limit is None else max(limit, 0)}

        async def op(cur: Cur) -> builtins.list[KvEntry]:
            return [_entry(key, found) for found in await _read(cur, self._q.history, params, self._shared.url, scope, key)]

        return await self._core._run(f"kv history of key {key!r} in scope {scope!r}", None, op, read=True)

    async def list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        query = self._q.list[after is not None]
        params = {"scope": scope, "prefix": prefix, "after": after, "limit": None if limit is None else max(limit, 0)}

        async def op(cur: Cur) -> builtins.list[KvEntry]:
            found = await _read(cur, query, params, self._shared.url, scope, prefix + "*")
            return [KvEntry(k, int(v), None if value is None else bytes(value)) for k, v, value in found]

        return await self._core._run(f"kv listing of scope {scope!r}", None, op, read=True)

    async def write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        if not ops:
            return
        # Rows are locked in key order, so two batches over the same keys never deadlock.
        ordered = sorted(ops, key=lambda o: o.key)
        params = {
            "scope": scope,
            "keys": [o.key for o in ordered],
            "expected": [o.expected for o in ordered],
            "values": [None if o.value is None else bytes(o.value) for o in ordered],
            "keep": max(keep, 1),
            "channel": channel(self._q.schema, scope),
            "n": len(ordered),
        }

        async def op(cur: Cur) -> None:
            try:
                await _fetch(cur, self._q.write, params)
            except psycopg.errors.InsufficientPrivilege as exc:
                raise await self._denied(cur, scope, ops, exc) from exc
            except psycopg.Error as exc:
                if exc.sqlstate != NOT_ALL_MOVED:
                    raise
                await self._conflict(cur, scope, ops)

        await self._core._run(f"kv write of {len(ops)} key(s) in scope {scope!r}", None, op, read=False)

    async def _conflict(self, cur: Cur, scope: str, ops: Sequence[KvOp]) -> None:
        """Raise the ConflictError of the first op (in the caller's order) whose key is not
        at its expected version (the write was rolled back)."""
        found = await _fetch(cur, self._q.found, {"scope": scope, "keys": [o.key for o in ops]})
        versions = [int(f[0]) for f in found]
        first = next((i for i, o in enumerate(ops) if versions[i] != o.expected), 0)
        raise ConflictError(key=ops[first].key, namespace=scope, expected=ops[first].expected, found=versions[first])

    async def _denied(
        self, cur: Cur, scope: str, ops: Sequence[KvOp], exc: psycopg.Error
    ) -> AccessDeniedError:
        """The AccessDeniedError for a write the database refused (row-level security, or
        no privilege on the kv tables), naming the first key no write grant covers."""
        keys = [o.key for o in ops]
        try:
            rows = await _fetch(cur, self._q.ungranted, {"scope": scope, "keys": keys})
            grants = await _fetch(cur, self._q.grants, {"scope": scope})
        except psycopg.Error as second:  # e.g. no privilege on kv_grants either
            log.debug("reading the role's grants after a refused write failed: %r", second)
            rows, grants = [], []
        key = rows[0][0] if rows else keys[0]
        return _denial(self._shared.url, scope, key, "write", grants, exc)

    async def denied(self, scope: str, key: str, operation: str, *, prefix: bool = False) -> AccessDeniedError | None:
        """After a delete found no key (or a claim no item under ``key``, a prefix): the
        AccessDeniedError when row-level security limits this connection's role and no write
        grant of the scope covers the key (or any key under the prefix); None otherwise."""

        async def op(cur: Cur) -> AccessDeniedError | None:
            [(limited,)] = await _fetch(cur, self._q.limited, {"table": self._q.kv_keys})
            if not limited:
                return None
            grants = await _fetch(cur, self._q.grants, {"scope": scope})
            if any(mode == "write" and covers(pattern, key, prefix=prefix) for mode, pattern in grants):
                return None
            return _denial(self._shared.url, scope, key + ("*" if prefix else ""), operation, grants, None)

        return await self._core._run(f"kv grants of scope {scope!r}", None, op, read=True)

    async def drop(self, scope: str) -> bool:
        async def op(cur: Cur) -> bool:
            try:
                return bool((await _fetch(cur, self._q.drop, {"scope": scope}))[0][0])
            except psycopg.errors.InsufficientPrivilege as exc:
                raise _denial(self._shared.url, scope, "*", "drop", [], exc) from exc

        return await self._core._run(f"dropping kv scope {scope!r}", None, op, read=False)

    async def watch(self, scope: str) -> AsyncWatchCore:
        """A listening watch core (the caller wraps it in its public class)."""
        self._shared.check_open()
        if self._shared.needs_migration:
            await self._core.migrate()
        watch = AsyncWatchCore(
            self._conninfo, self._connect, channel(self._q.schema, scope), scope, self._shared.url
        )
        await watch.start()
        return watch


async def _read(
    cur: Cur, query: bytes, params: Mapping[str, Any], url: str, scope: str, key: str
) -> builtins.list[tuple[Any, ...]]:
    try:
        return await _fetch(cur, query, params)
    except psycopg.errors.InsufficientPrivilege as exc:  # no privilege on the table at all
        raise _denial(url, scope, key, "read", [], exc) from exc


def _denial(
    url: str, scope: str, key: str, operation: str, grants: Sequence[tuple[Any, ...]], exc: psycopg.Error | None
) -> AccessDeniedError:
    shown = ", ".join(f"{mode} {glob_of(pattern)!r}" for mode, pattern in grants) or "none readable"
    detail = (
        "row-level security hides the keys outside its write grants" if exc is None
        else " ".join(str(exc).split()) or type(exc).__name__
    )
    return AccessDeniedError(
        f"PostgreSQL store {url}: the database refused the {operation} of key {key!r} in scope {scope!r} for this "
        f"connection's role ({detail}); its grants in the scope: {shown}. "
        + ("Nothing was written. " if operation != "read" else "")
        + "Grant access with persistkit.backends.postgres.grant_board_access (as the schema's owner).",
        key=key,
        operation=operation,
    )


class AsyncWatchCore:
    """One LISTEN connection on one scope's channel, reconnected on the next wait after
    it drops (that wait then returns ``[KvHint(None)]``: hints may have been lost)."""

    def __init__(self, conninfo: str, connect: Mapping[str, Any], chan: str, scope: str, url: str) -> None:
        self._conninfo = conninfo
        self._connect = {**connect, "autocommit": True}
        self._listen = f'LISTEN "{chan}"'.encode()
        self.channel = chan
        self._scope = scope
        self._url = url
        self._conn: AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self.closed = False

    async def start(self) -> None:
        """Connect and LISTEN: writes committed after this returns are hinted."""
        try:
            conn = await AsyncConnection.connect(self._conninfo, **self._connect)
            try:
                await conn.execute(self._listen)
            except BaseException:
                await conn.close()
                raise
        except psycopg.Error as exc:
            raise map_error(exc, f"listening for kv hints of scope {self._scope!r}", None, self._url) from exc
        self._conn = conn

    async def wait(self, timeout: float) -> builtins.list[KvHint]:
        """Hints that arrive within ``timeout`` seconds (coalesced per key), or ``[]``."""
        async with self._lock:
            self._check_open()
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                await self._reopen()
                return [KvHint(None)]
            deadline = time.monotonic() + max(timeout, 0.0)
            try:
                while True:
                    remaining = max(deadline - time.monotonic(), 0.0)
                    got = await _collect(conn, min(remaining, _WAIT_SLICE))
                    if got or self.closed or remaining <= _WAIT_SLICE:
                        break
            except psycopg.Error as exc:
                if self.closed:  # closed from another thread while waiting
                    await self._release()
                    return []
                log.debug("kv watch on scope %r lost its connection: %r", self._scope, exc)
                await self._reopen()
                return [KvHint(None)]
            if self.closed:
                await self._release()
        latest: dict[str | None, int] = {}
        for payload in got:
            hint = hint_of(payload, self._scope)
            if hint is not None:
                latest[hint.key] = max(hint.version, latest.get(hint.key, 0))
        return [KvHint(key, version) for key, version in latest.items()]

    async def _reopen(self) -> None:
        """Replace a dead connection; a failure is transient and the next wait tries again."""
        await self._release()
        await self.start()

    async def _release(self) -> None:
        old, self._conn = self._conn, None
        if old is not None:
            try:
                await old.close()
            except psycopg.Error as exc:  # already dead: nothing more to release
                log.debug("closing a watch connection failed: %r", exc)

    def _check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(
                f"this watch on scope {self._scope!r} of {self._url} was closed; open a new one"
            )

    async def shutdown(self) -> None:
        """Close the connection (waits for a wait in progress to reach its next slice)."""
        self.closed = True
        async with self._lock:
            await self._release()

    def abandon(self) -> None:
        """Close without waiting (from sync code, for an async connection): mark closed and
        end the session if no wait is using it (a wait in progress closes it itself)."""
        self.closed = True
        conn = self._conn
        if conn is not None and not self._lock.locked():
            self._conn = None
            conn.pgconn.finish()  # libpq's close; needs no event loop


async def _collect(conn: AsyncConnection[Any], timeout: float) -> builtins.list[str]:
    """The payloads of notifications: waits up to ``timeout`` for the first, then takes
    whatever else has arrived without waiting."""
    found = [n.payload async for n in conn.notifies(timeout=timeout, stop_after=1)]
    if found:
        found += [n.payload async for n in conn.notifies(timeout=0)]
    return found
