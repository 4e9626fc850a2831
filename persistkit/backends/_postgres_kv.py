"""The PostgreSQL store's ``kv`` and ``watch`` capabilities (the mixin :class:`PostgresKv`).

The operations live in ``_postgres_kv_async.py`` (hand-written) and its generated twin
``_postgres_kv_sync.py``; the SQL, channel and payload in ``_postgres_kv_sql.py``;
database-enforced access (row-level security) in ``_postgres_kv_access.py``.

Writes. ``kv_write`` is ONE statement on an autocommit connection (one round trip, one
transaction): every op's compare-and-swap on ``kv_keys``, the new versions, the removal
of versions beyond ``keep`` and a ``pg_notify`` per moved key. If any op did not move its
key, the statement's last step (``kv_all_moved``, migration 4) fails it with SQLSTATE
``PKC01``, which rolls everything back, the queued notifications included; the store
then reads the keys' versions and raises the ``ConflictError`` of the first op (in the
caller's order) not at its expected version. (``BEGIN`` / statement / ``COMMIT`` with the
decision in Python was measured first: three round trips, and under CPU contention each
is a wake-up of the server and the client, which is what a p99 pays for.) Rows are locked in key order, so batches over
the same keys do not deadlock. Writes are not retried here: a connection lost around the
commit is a ``BackendUnavailableError`` saying the outcome is unknown (read the key).
Reads are retried at once on a dead connection, as the store's other reads.

Watch. ``watch_open`` opens ONE dedicated connection per watch and ``LISTEN``s on its
scope's channel. Chosen over one connection per process multiplexing every watch: a
watch owns its connection's whole life (a killed connection affects that watch alone,
and its next ``hints`` reconnects, ``LISTEN``s again and returns ``[KvHint(None)]`` so the
reader re-lists: nothing committed after the new ``LISTEN`` is missed, and the re-list
covers the gap), there is no dispatcher thread to start, fork or stop, and the async
twin waits on its own ``AsyncConnection`` in its own event loop. The cost is one server
connection per open watch: a process with many watchers of one scope should share one
watch of it (the layer above fans its hints out). A watch needs a session: open the
store on a direct (or session-pooled) URL, since behind a transaction-pooling PgBouncer
the ``LISTEN`` is not kept and hints would not arrive. Delivery is a socket read on the
listener as the writer commits, no polling: measured write-to-hint (from the start of
``kv_write`` to ``hints`` returning, local server, a 2-core machine under a load of ~4)
p50 0.5-0.9 ms, p99 6-7 ms, nearly all of it the write's own commit.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import AccessDeniedError, ConfigurationError
from ._postgres_async import AsyncCore
from ._postgres_kv_async import AsyncKvCore, AsyncWatchCore
from ._postgres_kv_sync import KvCore, WatchCore
from ._postgres_sql import Shared
from ._postgres_sync import Core
from ._protocol import Backend, KvEntry, KvHint, KvOp, KvWatch

__all__ = ["AsyncPgWatch", "PgWatch", "PostgresKv"]


class PgWatch(KvWatch):
    """A watch opened by ``watch_open``: its own LISTEN connection (sync)."""

    def __init__(self, core: WatchCore) -> None:
        self._core = core

    @property
    def channel(self) -> str:
        """The NOTIFY channel this watch listens on."""
        return self._core.channel

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        return self._core.wait(timeout)

    def close(self) -> None:
        self._core.shutdown()


class AsyncPgWatch(KvWatch):
    """A watch opened by ``awatch_open``: its own ``AsyncConnection``, read with ``ahints``
    in the event loop that opened it."""

    def __init__(self, core: AsyncWatchCore) -> None:
        self._core = core

    @property
    def channel(self) -> str:
        """The NOTIFY channel this watch listens on."""
        return self._core.channel

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        raise ConfigurationError(
            "this PostgreSQL watch was opened with awatch_open: read it with `await watch.ahints(timeout)` "
            "in the event loop that opened it, or open a sync one with watch_open"
        )

    async def ahints(self, timeout: float) -> builtins.list[KvHint]:
        return await self._core.wait(timeout)

    def close(self) -> None:
        self._core.abandon()

    async def aclose(self) -> None:
        await self._core.shutdown()


class PostgresKv(Backend):
    """kv and watch for :class:`~persistkit.backends.postgres.PostgresBackend` (a mixin)."""

    _shared: Shared
    _sync: Core | None
    _async: AsyncCore | None
    _kv: KvCore | None = None
    _akv: AsyncKvCore | None = None

    def _kv_attach(self, conninfo: str, connect: Mapping[str, Any]) -> None:
        """Give the kv primitives the store's cores, and what a watch connects with."""
        self._kv = KvCore(self._sync, conninfo, connect) if self._sync is not None else None
        self._akv = AsyncKvCore(self._async, conninfo, connect) if self._async is not None else None

    def _kv_sync(self) -> KvCore:
        self._shared.check_open()
        if self._kv is None:
            raise ConfigurationError(
                f"the PostgreSQL store {self.url} was opened on an async connection: "
                "use the async methods (akv_get, akv_write, awatch_open, ...)"
            )
        return self._kv

    def _kv_async(self) -> AsyncKvCore | None:
        self._shared.check_open()
        return self._akv

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        return self._kv_sync().get(scope, key, version)

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return self._kv_sync().history(scope, key, before=before, limit=limit)

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        return self._kv_sync().list(scope, prefix=prefix, after=after, limit=limit)

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        self._kv_sync().write(scope, ops, keep=keep)

    def kv_drop(self, scope: str) -> bool:
        return self._kv_sync().drop(scope)

    def watch_open(self, scope: str) -> KvWatch:
        return PgWatch(self._kv_sync().watch(scope))

    def kv_denied(self, scope: str, key: str, operation: str, *, prefix: bool = False) -> AccessDeniedError | None:
        return self._kv_sync().denied(scope, key, operation, prefix=prefix)

    async def akv_denied(self, scope: str, key: str, operation: str, *, prefix: bool = False) -> AccessDeniedError | None:
        core = self._kv_async()
        if core is None:
            return await asyncio.to_thread(self.kv_denied, scope, key, operation, prefix=prefix)
        return await core.denied(scope, key, operation, prefix=prefix)

    async def akv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        core = self._kv_async()
        if core is None:
            return await asyncio.to_thread(self.kv_get, scope, key, version)
        return await core.get(scope, key, version)

    async def akv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        core = self._kv_async()
        if core is None:
            return await asyncio.to_thread(self.kv_history, scope, key, before=before, limit=limit)
        return await core.history(scope, key, before=before, limit=limit)

    async def akv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        core = self._kv_async()
        if core is None:
            return await asyncio.to_thread(self.kv_list, scope, prefix=prefix, after=after, limit=limit)
        return await core.list(scope, prefix=prefix, after=after, limit=limit)

    async def akv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        core = self._kv_async()
        if core is None:
            return await asyncio.to_thread(self.kv_write, scope, ops, keep=keep)
        await core.write(scope, ops, keep=keep)

    async def akv_drop(self, scope: str) -> bool:
        core = self._kv_async()
        if core is None:
            return await asyncio.to_thread(self.kv_drop, scope)
        return await core.drop(scope)

    async def awatch_open(self, scope: str) -> KvWatch:
        core = self._kv_async()
        if core is None:
            return await asyncio.to_thread(self.watch_open, scope)
        return AsyncPgWatch(await core.watch(scope))
