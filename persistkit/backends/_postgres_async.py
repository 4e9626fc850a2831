"""The PostgreSQL store's operations, written once.

``_postgres_async.py`` is the hand-written source; ``_postgres_sync.py`` is
generated from it by ``scripts/unasync.py`` (CI runs it with ``--check``).
Edit the async file, then run ``python scripts/unasync.py``.

:class:`AsyncAccess` hands out cursors (on the store's dedicated connection of
the current scope, else its overflow pool; on the user's pool; or on the
user's connection, under a lock); :class:`AsyncCore` runs the statements of
``_postgres_sql`` on them and maps driver errors at this boundary.

The overflow of the store's own connections is an :class:`AsyncOverflow`:
on the async side the spare connections of ``_postgres_spares.py`` (opened
in the calling task, so nothing is left running when an event loop ends),
on the sync side psycopg_pool's pool.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .._errors import ConflictError, LeaseLostError
from ._postgres_sql import (
    LATEST_VERSION,
    MigrationStatus,
    Shared,
    is_connection_failure,
    log,
    map_error,
    reused_id,
)
from ._protocol import CheckpointRow, Head, LeaseRecord, new_head

__all__ = ["AsyncAccess", "AsyncCore"]

T = TypeVar("T")

# A read that hit a dead connection is retried at once (the pool has been
# checked or the connection reopened by then). Writes are never retried here:
# the layer above retries them after reading the head.
READ_ATTEMPTS = 3
# Runs a core remembers having noted (a bound on memory; forgetting costs one probe).
_NOTED_MAX = 4096
# A dedicated connection is replaced after this many seconds, as psycopg_pool
# does with its connections (max_lifetime), so server-side memory is returned.
MAX_LIFETIME = 3600.0
# Connections inherited through fork(): never used, and never closed (closing
# would end the parent's session) nor collected (which would warn) by the child.
_INHERITED: list[object] = []

Cur = AsyncCursor[tuple[Any, ...]]


class AsyncOverflow(Protocol):
    """Where an operation that finds the dedicated connection busy gets one: the
    part of a pool's interface used here (a user's pool is used the same way)."""

    async def open(self) -> None: ...

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...

    async def check(self) -> None: ...

    async def close(self) -> None: ...


_IDLE = psycopg.pq.TransactionStatus.IDLE


def _scope() -> object:
    """What an owned connection or pool belongs to; one of another scope is never used."""
    return asyncio.get_running_loop()


async def _take_now(lock: asyncio.Lock) -> bool:
    """Take ``lock`` if it is free, never waiting."""
    return not lock.locked() and await lock.acquire()


async def _take(lock: asyncio.Lock, timeout: float | None) -> bool:
    """Take ``lock``, waiting at most ``timeout`` seconds (None: as long as it takes)."""
    try:
        return await asyncio.wait_for(lock.acquire(), timeout)
    except TimeoutError:
        return False


async def _fetch(cur: Cur, query: bytes, params: Mapping[str, Any] | None) -> list[tuple[Any, ...]]:
    # Binary results skip the hex decoding of bytea.
    await cur.execute(query, params, binary=True)
    return await cur.fetchall()


async def _inserted(cur: Cur, query: bytes, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """A write's rows; none when a concurrent writer of the same version (or checkpoint
    id) committed first: the statement wrote nothing, and the caller reads the head."""
    try:
        return await _fetch(cur, query, params)
    except psycopg.errors.UniqueViolation:
        return []


class _Slot:
    """What the store holds in one scope (a process, or an event loop): a
    connection with the cursor every operation on it reuses, the lock its
    users take turns on, and the pool that serves callers finding it busy."""

    __slots__ = ("conn", "cursor", "lock", "opened", "owned", "pid", "pool", "scope")

    def __init__(self, scope: object, conn: AsyncConnection[Any] | None = None) -> None:
        self.scope = scope
        self.pid = os.getpid()
        self.lock = asyncio.Lock()
        self.conn = conn
        self.cursor: Cur | None = None
        self.owned = conn is None
        self.opened = 0.0
        self.pool: AsyncOverflow | None = None


class AsyncAccess:
    """Where connections come from.

    * ``conninfo`` (the store's own connections): ONE dedicated connection per
      scope (process, or event loop for the async side), opened on first use
      and kept; its cursor is reused. An operation that finds it busy (another
      thread or task is on it) takes a connection from ``factory``'s pool,
      created on that first contention; without ``factory`` it waits up to
      ``timeout`` seconds for the dedicated one. Single-threaded use thus never
      pays a pool checkout.
    * ``pool``: the user's open pool; one checkout per operation.
    * ``connection``: the user's connection, used under a lock and replaced by
      one opened from ``conninfo`` if it breaks.

    The user's connections are switched to autocommit (and to no prepared
    statements when ``no_prepare``); those of a user's pool for the duration
    of one operation only.
    """

    def __init__(
        self,
        *,
        conninfo: str = "",
        connect: Mapping[str, Any] | None = None,
        factory: Callable[[], AsyncOverflow] | None = None,
        pool: AsyncConnectionPool[Any] | None = None,
        connection: AsyncConnection[Any] | None = None,
        no_prepare: bool = False,
        timeout: float = 30.0,
    ) -> None:
        self._conninfo = conninfo
        self._connect: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": None if no_prepare else 5,
            **(connect or {}),
        }
        self._factory = factory
        self._user_pool = pool
        self._no_prepare = no_prepare
        self._timeout = timeout
        self._create_lock = threading.Lock()
        # The user's connection belongs to no scope: it is never swapped for another.
        self._scoped = connection is None
        self._slot: _Slot | None = None if connection is None else _Slot(None, connection)

    @asynccontextmanager
    async def cursor(self) -> AsyncIterator[Cur]:
        """A cursor on an autocommit connection, for one operation."""
        if self._user_pool is not None:
            async with self._pooled(self._user_pool, restore=True) as cur:
                yield cur
            return
        slot = self._current_slot()
        if not await _take_now(slot.lock):
            if self._factory is not None:  # busy: another thread or task is on it
                async with self._pooled(await self._overflow(slot), restore=False) as cur:
                    yield cur
                return
            if not await _take(slot.lock, self._timeout if self._scoped else None):
                raise PoolTimeout(f"no connection became free in {self._timeout:g} s")
        try:
            yield await self._held_cursor(slot)
        finally:
            slot.lock.release()

    def _current_slot(self) -> _Slot:
        slot = self._slot
        if slot is not None and (not self._scoped or slot.scope == _scope()):
            return slot
        with self._create_lock:  # never held across an await
            slot = self._slot
            scope = _scope()
            if slot is None or slot.scope != scope:
                if slot is not None:
                    _retire(slot)
                slot = self._slot = _Slot(scope)
            return slot

    async def _held_cursor(self, slot: _Slot) -> Cur:
        conn, cur = slot.conn, slot.cursor
        if conn is not None and slot.owned and (
            conn.closed
            or conn.broken
            # Not idle between operations: e.g. a cancelled statement still running.
            or conn.pgconn.transaction_status != _IDLE
            or time.monotonic() - slot.opened > MAX_LIFETIME
        ):
            await conn.close()
            conn = slot.conn = slot.cursor = None
        elif conn is not None and (conn.closed or conn.broken):  # the user's, dead
            conn = slot.conn = slot.cursor = None
        if cur is not None and conn is not None:
            return cur
        if conn is None:
            # Ours, or a replacement for the user's connection that died (closed by us).
            conn = await AsyncConnection.connect(self._conninfo, **self._connect)
            slot.conn, slot.owned, slot.opened = conn, True, time.monotonic()
        else:  # the user's connection, on first use
            if not conn.autocommit:
                await conn.set_autocommit(True)
            if self._no_prepare:
                conn.prepare_threshold = None
        cur = slot.cursor = conn.cursor(row_factory=tuple_row)
        return cur

    async def _overflow(self, slot: _Slot) -> AsyncOverflow:
        pool = slot.pool
        if pool is None:
            assert self._factory is not None
            with self._create_lock:
                pool = slot.pool
                if pool is None:
                    pool = slot.pool = self._factory()
        await pool.open()  # idempotent; cheap once open
        return pool

    @asynccontextmanager
    async def _pooled(self, pool: AsyncOverflow, *, restore: bool) -> AsyncIterator[Cur]:
        async with pool.connection() as conn:
            if not restore:  # our own pool's connections are set up at connect
                yield conn.cursor(row_factory=tuple_row)
                return
            autocommit, prepare = conn.autocommit, conn.prepare_threshold
            if not autocommit:
                await conn.set_autocommit(True)
            if self._no_prepare:
                conn.prepare_threshold = None
            try:
                yield conn.cursor(row_factory=tuple_row)
            finally:
                # A dead connection is discarded by the pool; nothing to restore.
                if not (conn.broken or conn.closed):
                    conn.prepare_threshold = prepare
                    if not autocommit:
                        await conn.set_autocommit(False)

    async def recover(self) -> None:
        """After a connection failure: drop the pool's dead idle connections too,
        so that the next operation gets a live one (a dead dedicated connection
        is replaced on its next use)."""
        slot = self._slot
        pool = self._user_pool if self._user_pool is not None else slot.pool if slot else None
        if pool is None or (slot is not None and self._scoped and slot.scope != _scope()):
            return
        try:
            await pool.check()
        except Exception as exc:  # the failure being handled is what gets reported
            log.debug("pool check after a connection failure failed: %r", exc)

    def detach(self) -> tuple[AsyncOverflow | None, object, AsyncConnection[Any] | None]:
        """Hand over what the store owns in its current slot (the overflow pool,
        its scope, the connection) to be closed elsewhere."""
        with self._create_lock:
            slot = self._slot
            if slot is None:
                return None, None, None
            if slot.pid != os.getpid():
                self._slot = None
                _retire(slot)
                return None, None, None
            pool, slot.pool = slot.pool, None
            conn = slot.conn if slot.owned else None
            if conn is not None:
                slot.conn = slot.cursor = None
            return pool, slot.scope, conn

    async def close(self) -> None:
        """Close what the store opened itself in this scope; the user's pool or
        connection stay open."""
        slot = self._slot
        if slot is None or slot.pid != os.getpid() or (self._scoped and slot.scope != _scope()):
            return
        pool, slot.pool = slot.pool, None
        if pool is not None:
            await pool.close()
        if slot.conn is not None and slot.owned:
            conn, slot.conn, slot.cursor = slot.conn, None, None
            await conn.close()


def _retire(slot: _Slot) -> None:
    """Let go of a slot of another scope without using it."""
    if slot.pid != os.getpid():
        # Inherited through fork(): the parent's sessions, not ours to end.
        _INHERITED.append(slot)
        return
    conn = slot.conn
    if conn is not None and slot.owned and not slot.lock.locked():
        # Another event loop's (in the same process), idle: libpq's close needs
        # no loop. One in use is left to the garbage collector.
        slot.conn = slot.cursor = None
        conn.pgconn.finish()
    # Its pool (if any) is left to that loop: closing it needs the loop.


class AsyncCore:
    """The store's operations on connections from one :class:`AsyncAccess`."""

    def __init__(self, shared: Shared, access: AsyncAccess) -> None:
        self._shared = shared
        self._q = shared.queries
        self.access = access
        # (thread, namespace, run) this core wrote a row of: their later writes leave
        # out the runs insert (see _postgres_sql.py). A thread's first write always
        # notes its run, so a thread deleted and written again is noted anew.
        self._noted: set[tuple[str, str, str | None]] = set()

    def _write_sql(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, fenced: bool, swap: bool = False
    ) -> bytes:
        first = expected == 0
        run = first or (row.thread_id, row.namespace, row.run_id) not in self._noted
        return self._q.writes[(fenced, first, run, bool(blobs), swap)]

    def _wrote(self, row: CheckpointRow) -> None:
        if len(self._noted) >= _NOTED_MAX:
            self._noted.clear()
        self._noted.add((row.thread_id, row.namespace, row.run_id))

    async def _run(
        self,
        action: str,
        thread_id: str | None,
        op: Callable[[Cur], Awaitable[T]],
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
        op: Callable[[Cur], Awaitable[T]],
        *,
        read: bool,
    ) -> T:
        attempt = 0
        while True:
            attempt += 1
            used: AsyncConnection[Any] | None = None
            try:
                async with self.access.cursor() as cur:
                    used = cur.connection
                    return await op(cur)
            except psycopg.Error as exc:
                error = map_error(exc, action, thread_id, self._shared.url, write=not read)
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

        async def version(cur: Cur) -> tuple[bool, int]:
            probe = await _fetch(cur, q.probe, {"schema": q.schema})
            if not probe[0][1]:
                return bool(probe[0][0]), 0
            return True, int((await _fetch(cur, q.current_version, None))[0][0])

        async def op(cur: Cur) -> MigrationStatus:
            _, current = await version(cur)
            if check or current >= LATEST_VERSION:
                return MigrationStatus(q.schema, current, LATEST_VERSION)
            applied: list[int] = []
            async with cur.connection.transaction():
                await _fetch(cur, q.lock, {"schema": q.schema})
                # Re-read under the lock: another process may have just migrated.
                schema_exists, current = await version(cur)
                if not schema_exists:
                    # Only when missing: CREATE SCHEMA needs a privilege a
                    # restricted role on a prepared schema may not have.
                    await cur.execute(q.create_schema)
                await cur.execute(q.create_migrations)
                for number, statements in q.migrations:
                    if number > current:
                        for statement in statements:
                            await cur.execute(statement)
                        await cur.execute(q.record_version, {"version": number})
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
        query = self._write_sql(row, blobs, expected_version, False)

        async def op(cur: Cur) -> Head:
            moved = await _inserted(cur, query, params)
            if moved:
                self._wrote(row)
                return new_head(row.checkpoint_id, int(moved[0][0]))  # per step: no frozen __init__
            # The head was not at the expected version, so the statement wrote nothing; only this
            # failure path pays a second round trip, to say what it found.
            found = await _fetch(cur, q.head, params)
            if found and int(found[0][1]) == expected_version:
                raise reused_id(row, self._shared.url)
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

        async def op(cur: Cur) -> None:
            await cur.execute(self._q.put_blobs, params)

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

        async def op(cur: Cur) -> None:
            await _fetch(cur, self._q.rewrite, params)

        # Idempotent (the same bytes replace the same records), so retried like a read.
        await self._run("rewriting records", thread_id, op, read=True)

    async def delete_thread(self, thread_id: str) -> bool:
        self._noted = {k for k in self._noted if k[0] != thread_id}

        async def op(cur: Cur) -> bool:
            return bool((await _fetch(cur, self._q.delete_thread, {"t": thread_id}))[0][0])

        return await self._run("deleting", thread_id, op, read=False)

    # -- prune (retention; the SQL and why it is one statement: _postgres_sql.py) ----------

    async def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        if not checkpoint_ids:
            self._shared.check_open()
            return 0
        # The runs entries this prune may drop: noted again by this core's next write of them
        # (other cores keep theirs; list(run_id=...) does without an entry).
        self._noted = {k for k in self._noted if k[:2] != (thread_id, namespace)}
        params = {"t": thread_id, "ns": namespace, "ids": sorted(set(checkpoint_ids))}

        async def op(cur: Cur) -> int:
            # Never prepared: a generic plan, blind to how many ids and rows there are,
            # joins them in nested loops (quadratic; see _PRUNE_SQL); planned per call it hashes.
            await cur.execute(self._q.prune["prune_rows"], params, binary=True, prepare=False)
            return int((await cur.fetchall())[0][0])

        return await self._run("pruning checkpoints", thread_id, op, read=False)

    async def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        if not keys:
            self._shared.check_open()
            return 0
        params = {"t": thread_id, "keys": sorted(set(keys))}

        async def op(cur: Cur) -> int:
            await cur.execute(self._q.prune["delete_blobs"], params)
            return max(cur.rowcount, 0)

        return await self._run("deleting blobs", thread_id, op, read=False)

    async def blob_sizes(self, thread_id: str) -> dict[str, int]:
        async def op(cur: Cur) -> dict[str, int]:
            return {k: int(n) for k, n in await _fetch(cur, self._q.prune["blob_sizes"], {"t": thread_id})}

        return await self._run("sizing blobs", thread_id, op, read=True)

    # -- reads -----------------------------------------------------------------

    async def head(self, thread_id: str, namespace: str) -> Head | None:
        async def op(cur: Cur) -> Head | None:
            found = await _fetch(cur, self._q.head, {"t": thread_id, "ns": namespace})
            return Head(found[0][0], int(found[0][1])) if found else None

        return await self._run("reading the head", thread_id, op, read=True)

    async def head_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        async def op(cur: Cur) -> tuple[Head, CheckpointRow] | None:
            found = await _fetch(cur, self._q.head_row, {"t": thread_id, "ns": namespace})
            if not found:
                return None
            checkpoint_id, version, parent_id, run_id, payload = found[0]
            row = CheckpointRow(thread_id, namespace, checkpoint_id, parent_id, run_id, payload)
            return Head(checkpoint_id, int(version)), row

        return await self._run("reading the head", thread_id, op, read=True)

    async def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        params = {"t": thread_id, "ns": namespace, "cid": checkpoint_id}

        async def op(cur: Cur) -> CheckpointRow | None:
            found = await _fetch(cur, self._q.get, params)
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

        async def op(cur: Cur) -> list[CheckpointRow]:
            return [
                CheckpointRow(thread_id, namespace, cid, parent_id, run, payload)
                for cid, parent_id, run, payload in await _fetch(cur, query, params)
            ]

        return await self._run("listing checkpoints", thread_id, op, read=True)

    async def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        self._shared.check_open()
        if not keys:
            return {}
        params = {"t": thread_id, "keys": list(keys)}

        async def op(cur: Cur) -> dict[str, bytes]:
            return dict(await _fetch(cur, self._q.get_blobs, params))

        return await self._run("reading blobs", thread_id, op, read=True)

    async def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        params = {"t": thread_id, "start": start, "stop": stop}

        async def op(cur: Cur) -> dict[str, bytes]:
            return dict(await _fetch(cur, self._q.scan_blobs, params))

        return await self._run("scanning blobs", thread_id, op, read=True)

    async def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        params = {"prefix": prefix, "after": after, "limit": limit}

        async def op(cur: Cur) -> builtins.list[str]:
            return [found[0] for found in await _fetch(cur, self._q.threads, params)]

        return await self._run("listing threads", None, op, read=True)

    async def namespaces(self, thread_id: str) -> builtins.list[str]:
        async def op(cur: Cur) -> builtins.list[str]:
            found = await _fetch(cur, self._q.namespaces, {"t": thread_id})
            return sorted(r[0] for r in found)

        return await self._run("listing namespaces", thread_id, op, read=True)

    # -- leases (persistkit.coordination) ------------------------------------------

    async def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return (await self._write_fenced(row, blobs, expected_version, fence, None))[0]

    async def write_fenced_swap(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int,
        lease_version: int, lease_data: bytes,
    ) -> tuple[Head, bool]:
        return await self._write_fenced(row, blobs, expected_version, fence, (lease_version, lease_data))

    async def _write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int,
        swap: tuple[int, bytes] | None,
    ) -> tuple[Head, bool]:
        """A fenced write, and with ``swap`` (the lease record's version and new data) the
        lease's compare-and-swap in the same statement: (the new head, whether it swapped)."""
        lq = self._q.lease
        params = {
            "t": row.thread_id,
            "ns": row.namespace,
            "cid": row.checkpoint_id,
            "expected": expected_version,
            "parent": row.parent_id,
            "run": row.run_id,
            "payload": row.payload,
            "fence": fence,
        }
        if blobs:
            params["keys"], params["datas"] = list(blobs), list(blobs.values())
        if swap is not None:
            params["lversion"], params["ldata"] = swap[0], bytes(swap[1])
        query = self._write_sql(row, blobs, expected_version, True, swap is not None)

        async def op(cur: Cur) -> tuple[Head, bool]:
            moved = await _inserted(cur, query, params)
            if moved:
                self._wrote(row)
                return Head(row.checkpoint_id, int(moved[0][0])), swap is not None and bool(moved[0][1])
            # Nothing moved: a stale token, or a moved head (only this path reads more).
            lease = await _fetch(cur, lq["lease_get"], params)
            token = int(lease[0][0]) if lease else 0
            if token != fence:
                raise LeaseLostError(thread_id=row.thread_id, namespace=row.namespace, token=fence, found=token)
            found = await _fetch(cur, self._q.head, params)
            if found and int(found[0][1]) == expected_version:
                raise reused_id(row, self._shared.url)
            raise ConflictError(
                thread_id=row.thread_id,
                namespace=row.namespace,
                expected=expected_version,
                found=int(found[0][1]) if found else 0,
                found_checkpoint=found[0][0] if found else None,
            )

        return await self._run("write", row.thread_id, op, read=False)

    async def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        async def op(cur: Cur) -> LeaseRecord | None:
            found = await _fetch(cur, self._q.lease["lease_get"], {"t": thread_id, "ns": namespace})
            return LeaseRecord(int(found[0][0]), bytes(found[0][1]), int(found[0][2])) if found else None

        return await self._run("reading the lease", thread_id, op, read=True)

    async def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        query = self._q.lease["lease_create" if expected == 0 else "lease_swap"]
        params = {"t": thread_id, "ns": namespace, "expected": expected, "token": token, "data": bytes(data)}

        async def op(cur: Cur) -> bool:
            return bool(await _fetch(cur, query, params))

        return await self._run("swapping the lease", thread_id, op, read=False)

    async def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        async def op(cur: Cur) -> builtins.list[tuple[str, str, LeaseRecord]]:
            found = await _fetch(cur, self._q.lease["lease_list"], {"prefix": prefix})
            return [(t, ns, LeaseRecord(int(tok), bytes(d), int(v))) for t, ns, tok, d, v in found]

        return await self._run("listing leases", None, op, read=True)
