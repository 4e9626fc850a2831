"""The PostgreSQL store's operations, written once.

``_postgres_async.py`` is the hand-written source; ``_postgres_sync.py`` is
generated from it by ``scripts/unasync.py`` (CI runs it with ``--check``).
Edit the async file, then run ``python scripts/unasync.py``.

:class:`AsyncAccess` hands out connections (an owned pool, the user's pool, or
one connection used under a lock); :class:`AsyncCore` runs the statements of
``_postgres_sql`` on them and maps driver errors at this boundary.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from .._errors import ConflictError
from ._postgres_sql import (
    LATEST_VERSION,
    MigrationStatus,
    Shared,
    is_connection_failure,
    log,
    map_error,
)
from ._protocol import CheckpointRow, Head

__all__ = ["AsyncAccess", "AsyncCore"]

T = TypeVar("T")

# A read that hit a dead connection is retried at once (the pool has been
# checked or the connection reopened by then). Writes are never retried here:
# the layer above retries them after reading the head.
READ_ATTEMPTS = 3


def _scope() -> object:
    """What an owned pool belongs to; a pool from another scope is never touched."""
    return asyncio.get_running_loop()


async def _fetch(
    conn: AsyncConnection[Any], query: bytes, params: Mapping[str, Any] | None
) -> list[tuple[Any, ...]]:
    # tuple_row whatever the user's pool configured; binary results skip the
    # hex decoding of bytea.
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(query, params, binary=True)
    return await cur.fetchall()


class AsyncAccess:
    """Where connections come from.

    One of: ``factory`` (an owned pool, created unopened and opened lazily in
    the current scope), ``pool`` (the user's open pool, used as is), or else
    one connection (``connection``, or opened from ``conninfo`` on first use),
    serialized by a lock and reopened from ``conninfo`` when it breaks. Connections from a user's pool are switched
    to autocommit (and to no prepared statements when ``no_prepare``) for the
    duration of one operation and switched back.
    """

    def __init__(
        self,
        *,
        factory: Callable[[], AsyncConnectionPool[Any]] | None = None,
        pool: AsyncConnectionPool[Any] | None = None,
        connection: AsyncConnection[Any] | None = None,
        conninfo: str = "",
        no_prepare: bool = False,
    ) -> None:
        self._factory = factory
        self._pool = pool
        self._scope: object = None
        self._create_lock = threading.Lock()
        self._conn = connection
        self._conninfo = conninfo
        self._owns_conn = False
        # Neither pool given: one connection (the user's, or opened from conninfo).
        single = factory is None and pool is None
        self._conn_lock = asyncio.Lock() if single else None
        self._no_prepare = no_prepare

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection in autocommit mode for one operation."""
        if self._conn_lock is not None:
            async with self._conn_lock:
                yield await self._live_connection()
            return
        pool = await self._current_pool()
        async with pool.connection() as conn:
            autocommit, prepare = conn.autocommit, conn.prepare_threshold
            if not autocommit:
                await conn.set_autocommit(True)
            if self._no_prepare:
                conn.prepare_threshold = None
            try:
                yield conn
            finally:
                # A dead connection is discarded by the pool; nothing to restore.
                if not (conn.broken or conn.closed):
                    conn.prepare_threshold = prepare
                    if not autocommit:
                        await conn.set_autocommit(False)

    async def _live_connection(self) -> AsyncConnection[Any]:
        conn = self._conn
        if conn is not None and not (conn.closed or conn.broken):
            if not conn.autocommit:  # the user's connection, on first use
                await conn.set_autocommit(True)
            if self._no_prepare:
                conn.prepare_threshold = None
            return conn
        if conn is not None and self._owns_conn:
            await conn.close()
        # The user's connection died: open our own replacement (closed by us).
        conn = await AsyncConnection.connect(
            self._conninfo,
            autocommit=True,
            prepare_threshold=None if self._no_prepare else 5,
        )
        self._conn, self._owns_conn = conn, True
        return conn

    async def _current_pool(self) -> AsyncConnectionPool[Any]:
        pool = self._pool
        if self._factory is None:
            assert pool is not None, "AsyncAccess needs a factory, a pool or a connection"
            return pool
        scope = _scope()
        if pool is None or self._scope != scope:
            with self._create_lock:  # never held across an await
                pool = self._pool
                if pool is None or self._scope != scope:
                    # A pool of another event loop (or of the parent process,
                    # after a fork) cannot be used or closed from here.
                    pool = self._factory()
                    self._pool, self._scope = pool, scope
        await pool.open()  # idempotent; cheap once open
        return pool

    async def recover(self) -> None:
        """After a connection failure: drop the pool's dead idle connections too,
        so that the next operation gets a live one."""
        pool = self._pool
        if self._conn_lock is not None or pool is None:
            return  # a single connection is reopened on its next use
        if self._factory is not None and self._scope != _scope():
            return
        try:
            await pool.check()
        except Exception as exc:  # the failure being handled is what gets reported
            log.debug("pool check after a connection failure failed: %r", exc)

    def detach(self) -> tuple[AsyncConnectionPool[Any] | None, object, AsyncConnection[Any] | None]:
        """Hand over what the store owns (pool, its scope, connection) to be closed elsewhere."""
        pool = self._pool if self._factory is not None else None
        conn = self._conn if self._owns_conn else None
        if pool is not None:
            self._pool = None
        if conn is not None:
            self._conn = None
        return pool, self._scope, conn

    async def close(self) -> None:
        """Close what the store opened itself; the user's pool or connection stay open."""
        pool, self._pool = (self._pool, None) if self._factory is not None else (None, self._pool)
        if pool is not None and self._scope == _scope():
            await pool.close()
        if self._conn is not None and self._owns_conn:
            conn, self._conn = self._conn, None
            await conn.close()


class AsyncCore:
    """The store's operations on connections from one :class:`AsyncAccess`."""

    def __init__(self, shared: Shared, access: AsyncAccess) -> None:
        self._shared = shared
        self._q = shared.queries
        self.access = access

    async def _run(
        self,
        action: str,
        thread_id: str | None,
        op: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        read: bool,
    ) -> T:
        self._shared.check_open()
        if self._shared.needs_migration:
            await self.migrate()
        return await self._attempt(action, thread_id, op, read=read)

    async def _attempt(
        self,
        action: str,
        thread_id: str | None,
        op: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        read: bool,
    ) -> T:
        attempt = 0
        while True:
            attempt += 1
            used: AsyncConnection[Any] | None = None
            try:
                async with self.access.connection() as conn:
                    used = conn
                    return await op(conn)
            except psycopg.Error as exc:
                error = map_error(exc, action, thread_id, self._shared.url)
                if is_connection_failure(exc, used):
                    await self.access.recover()
                    if read and attempt < READ_ATTEMPTS:
                        log.debug("retrying %s after a connection failure: %r", action, exc)
                        continue
                raise error from exc

    # -- schema ----------------------------------------------------------------

    async def migrate(self, check: bool = False) -> MigrationStatus:
        """Bring the schema to ``LATEST_VERSION`` (idempotent; safe from many
        processes at once), or with ``check=True`` only report where it is."""
        self._shared.check_open()
        q = self._q

        async def version(conn: AsyncConnection[Any]) -> tuple[bool, int]:
            probe = await _fetch(conn, q.probe, {"schema": q.schema})
            if not probe[0][1]:
                return bool(probe[0][0]), 0
            return True, int((await _fetch(conn, q.current_version, None))[0][0])

        async def op(conn: AsyncConnection[Any]) -> MigrationStatus:
            _, current = await version(conn)
            if check or current >= LATEST_VERSION:
                return MigrationStatus(q.schema, current, LATEST_VERSION)
            applied: list[int] = []
            async with conn.transaction():
                await _fetch(conn, q.lock, {"schema": q.schema})
                # Re-read under the lock: another process may have just migrated.
                schema_exists, current = await version(conn)
                if not schema_exists:
                    # Only when missing: CREATE SCHEMA needs a privilege a
                    # restricted role on a prepared schema may not have.
                    await conn.execute(q.create_schema)
                await conn.execute(q.create_migrations)
                for number, statements in q.migrations:
                    if number > current:
                        for statement in statements:
                            await conn.execute(statement)
                        await conn.execute(q.record_version, {"version": number})
                        applied.append(number)
            return MigrationStatus(
                q.schema, max(current, LATEST_VERSION), LATEST_VERSION, tuple(applied)
            )

        # Idempotent, so a dead connection is retried like a read.
        status = await self._attempt("migrating the schema", None, op, read=True)
        if not check:
            self._shared.needs_migration = False
            if status.ahead:
                log.warning(
                    "schema %s is at version %d, newer than this persistkit's %d; upgrade persistkit",
                    q.schema,
                    status.current,
                    status.target,
                )
        return status

    # -- writes ----------------------------------------------------------------

    async def write(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int
    ) -> Head:
        q = self._q
        params = {
            "t": row.thread_id,
            "ns": row.namespace,
            "cid": row.checkpoint_id,
            "expected": expected_version,
            "parent": row.parent_id,
            "run": row.run_id,
            "payload": row.payload,
        }
        if blobs:
            params["keys"], params["datas"] = list(blobs), list(blobs.values())
            query = q.write_first if expected_version == 0 else q.write_next
        else:
            query = q.write_first_row if expected_version == 0 else q.write_next_row

        async def op(conn: AsyncConnection[Any]) -> Head:
            moved = await _fetch(conn, query, params)
            if moved:
                return Head(row.checkpoint_id, int(moved[0][0]))
            # The CAS matched nothing, so the statement wrote nothing; only this
            # failure path pays a second round trip, to say what it found.
            found = await _fetch(conn, q.head, params)
            raise ConflictError(
                thread_id=row.thread_id,
                namespace=row.namespace,
                expected=expected_version,
                found=int(found[0][1]) if found else 0,
                found_checkpoint=found[0][0] if found else None,
            )

        return await self._run("write", row.thread_id, op, read=False)

    async def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        self._shared.check_open()
        if not blobs:
            return
        params = {"t": thread_id, "keys": list(blobs), "datas": list(blobs.values())}

        async def op(conn: AsyncConnection[Any]) -> None:
            await conn.execute(self._q.put_blobs, params)

        # Idempotent (existing keys are kept), so retried like a read.
        await self._run("storing blobs", thread_id, op, read=True)

    async def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        self._shared.check_open()
        if not rows and not blobs:
            return
        params = {
            "t": thread_id,
            "nss": [r.namespace for r in rows],
            "cids": [r.checkpoint_id for r in rows],
            "payloads": [bytes(r.payload) for r in rows],
            "keys": list(blobs),
            "datas": [bytes(v) for v in blobs.values()],
        }

        async def op(conn: AsyncConnection[Any]) -> None:
            await _fetch(conn, self._q.rewrite, params)

        # Idempotent (the same bytes replace the same records), so retried like a read.
        await self._run("rewriting records", thread_id, op, read=True)

    async def delete_thread(self, thread_id: str) -> bool:
        async def op(conn: AsyncConnection[Any]) -> bool:
            return bool((await _fetch(conn, self._q.delete_thread, {"t": thread_id}))[0][0])

        return await self._run("deleting", thread_id, op, read=False)

    # -- reads -----------------------------------------------------------------

    async def head(self, thread_id: str, namespace: str) -> Head | None:
        async def op(conn: AsyncConnection[Any]) -> Head | None:
            found = await _fetch(conn, self._q.head, {"t": thread_id, "ns": namespace})
            return Head(found[0][0], int(found[0][1])) if found else None

        return await self._run("reading the head", thread_id, op, read=True)

    async def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        params = {"t": thread_id, "ns": namespace, "cid": checkpoint_id}

        async def op(conn: AsyncConnection[Any]) -> CheckpointRow | None:
            found = await _fetch(conn, self._q.get, params)
            if not found:
                return None
            parent_id, run_id, payload = found[0]
            return CheckpointRow(thread_id, namespace, checkpoint_id, parent_id, run_id, payload)

        return await self._run("reading a checkpoint", thread_id, op, read=True)

    async def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        query = self._q.list[(run_id is not None, before is not None)]
        params = {"t": thread_id, "ns": namespace, "run": run_id, "before": before, "limit": limit}

        async def op(conn: AsyncConnection[Any]) -> list[CheckpointRow]:
            return [
                CheckpointRow(thread_id, namespace, cid, parent_id, run, payload)
                for cid, parent_id, run, payload in await _fetch(conn, query, params)
            ]

        return await self._run("listing checkpoints", thread_id, op, read=True)

    async def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        self._shared.check_open()
        if not keys:
            return {}
        params = {"t": thread_id, "keys": list(keys)}

        async def op(conn: AsyncConnection[Any]) -> dict[str, bytes]:
            return dict(await _fetch(conn, self._q.get_blobs, params))

        return await self._run("reading blobs", thread_id, op, read=True)

    async def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        params = {"t": thread_id, "start": start, "stop": stop}

        async def op(conn: AsyncConnection[Any]) -> dict[str, bytes]:
            return dict(await _fetch(conn, self._q.scan_blobs, params))

        return await self._run("scanning blobs", thread_id, op, read=True)

    async def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        params = {"prefix": prefix, "after": after, "limit": limit}

        async def op(conn: AsyncConnection[Any]) -> builtins.list[str]:
            return [found[0] for found in await _fetch(conn, self._q.threads, params)]

        return await self._run("listing threads", None, op, read=True)

    async def namespaces(self, thread_id: str) -> builtins.list[str]:
        async def op(conn: AsyncConnection[Any]) -> builtins.list[str]:
            found = await _fetch(conn, self._q.namespaces, {"t": thread_id})
            return sorted(r[0] for r in found)

        return await self._run("listing namespaces", thread_id, op, read=True)
