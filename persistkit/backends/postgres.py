"""PostgreSQL store (psycopg 3): native sync and async, one round trip per write.

Opened by ``pk.connect("postgresql://user:password@host:5432/db?schema=persistkit")``
(installed by ``pip install 'persistkit[postgres]'``). The operations live in
``_postgres_async.py`` (hand-written) and ``_postgres_sync.py`` (generated from
it by ``scripts/unasync.py``); the SQL lives in ``_postgres_sql.py``.

Errors, mapped where the driver is called::

    psycopg OperationalError / InterfaceError, pool timeout,
    serialization failure (40001), deadlock (40P01)   -> BackendUnavailableError
    the head CAS matched nothing                       -> ConflictError
    a kv op's key not at its expected version          -> ConflictError (key=)
    insufficient_privilege (42501) on the kv tables,
    row-level security refusing a kv write             -> AccessDeniedError
    any other psycopg.Error                            -> BackendError

The kv space and its watch (``store.board()``) live in ``_postgres_kv.py`` (a mixin of
this class); database-enforced access per role in ``_postgres_kv_access.py``
(:func:`grant_board_access`, :func:`revoke_board_access`). Retention's primitives
(``prune_rows``, ``delete_blobs``, ``blob_sizes``) are the mixin of ``_postgres_prune.py``.
"""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .._errors import BackendError, BackendUnavailableError, ConfigurationError, PersistkitError
from . import URL_PASSWORD_MASK, mask_url, unknown_options
from ._postgres_async import AsyncAccess, AsyncCore
from ._postgres_kv import PostgresKv
from ._postgres_kv_access import grant, revoke
from ._postgres_prune import PostgresPrune
from ._postgres_spares import AsyncSpares
from ._postgres_sql import LATEST_VERSION, MigrationStatus, Queries, Shared
from ._postgres_sync import Access, Core
from ._protocol import CheckpointRow, Head, LeaseRecord

__all__ = ["LATEST_VERSION", "MigrationStatus", "PostgresBackend", "grant_board_access", "revoke_board_access"]

# Options persistkit reads itself (from the URL query or as keywords); every
# other URL query parameter goes to libpq untouched.
OPTIONS = ("schema", "pgbouncer", "prepare", "min_size", "max_size", "timeout", "migrate")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# Connection.connect() keywords that are not libpq parameters.
_NOT_CONNINFO = {"autocommit", "prepare_threshold", "row_factory", "cursor_factory", "context"}


class PostgresBackend(PostgresKv, PostgresPrune):
    """Checkpoints in PostgreSQL tables ``checkpoints`` (a thread's head is its row
    with the highest version), ``runs``, ``blobs``, ``leases`` (and ``migrations``) of one schema; every row carries its ``thread_id``, so one
    database serves many tenants. The kv space: ``kv_keys``, ``kv_versions``, ``kv_grants``.

    Open it from a URL (:meth:`from_url`), a user's ``psycopg_pool`` pools
    (``PostgresBackend(pool=..., async_pool=..., conninfo=...)``) or one user
    connection (:meth:`from_connection`). The user's pools and connection are
    never closed by :meth:`close`; connections for the missing side (sync or
    async) are opened from ``conninfo`` or from the other pool's conninfo.

    The store's own connections: one dedicated connection per process (sync)
    and per event loop (async), opened on first use (the sync one by the
    migration at open) and kept, so a single-threaded agent pays no pool
    checkout per step. Callers that find it busy share a pool of the other
    ``max_size - 1`` connections, created on that first contention.

    Options (URL query parameters or keywords; keywords win):

    ``schema``
        Schema of the tables, default ``"persistkit"``; created if missing.
    ``pgbouncer``
        ``true`` behind PgBouncer in transaction mode (before 1.21): disables
        server-side prepared statements (``prepare_threshold=None``), which
        such a pooler cannot route. Everything else already suits it:
        statements are schema-qualified, there is no session state, and the
        migration lock is transaction-scoped. ``prepare=false`` does the same.
    ``min_size``, ``max_size``, ``timeout``
        Connections per side, the dedicated one included (default 1..10; the
        sync overflow pool keeps ``min_size - 1`` open once created), and how
        long an operation waits for a connection, or a connect for the server
        (default 30 s), before ``BackendUnavailableError``.
    ``migrate``
        ``true`` (default): bring the schema up to date when the store opens,
        under an advisory lock so that many processes may start at once.
        ``false``: leave it to ``persistkit migrate URL`` (see :meth:`migrate`).

    A write is ONE statement on an autocommit connection (one round trip and
    one transaction): the head's compare-and-swap, the checkpoint row and the
    blobs. Writes are not retried here; reads are retried at once on a dead
    connection.
    """

    schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    native_async: ClassVar[bool] = True
    # kv and watch: _postgres_kv.py; prune (retention): _postgres_prune.py
    capabilities: ClassVar[frozenset[str]] = frozenset({"fencing", "leases", "kv", "watch", "prune"})

    _sync: Core | None = None  # None: opened on an async connection
    _async: AsyncCore | None = None  # None: opened on a sync connection

    def __init__(
        self,
        *,
        conninfo: str | None = None,
        pool: ConnectionPool[Any] | None = None,
        async_pool: AsyncConnectionPool[Any] | None = None,
        schema: str = "persistkit",
        pgbouncer: bool = False,
        prepare: bool = True,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 30.0,
        migrate: bool = True,
        url: str | None = None,
    ) -> None:
        if pool is None and async_pool is None and not conninfo:
            raise ConfigurationError(
                "PostgresBackend needs conninfo=, pool= or async_pool= "
                "(or use PostgresBackend.from_url / from_connection)"
            )
        _check_sizes(min_size, max_size, timeout)
        no_prepare = bool(pgbouncer) or not prepare
        if conninfo is None:
            source = pool if pool is not None else async_pool
            assert source is not None
            conninfo = _pool_conninfo(source)
        conninfo = _with_app_name(conninfo)
        shown = url or conninfo
        self._setup(schema, mask_url(shown) if "://" in shown else _mask_conninfo(shown), migrate)
        owned_kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": None if no_prepare else 5,
        }
        info = conninfo
        # Each side holds one dedicated connection per process (per event loop
        # on the async side); the overflow (a pool on the sync side, spare
        # connections on the async side) only serves callers that find it busy,
        # so it gets the rest of max_size and is created on first contention.
        # max_size=1: no overflow, a busy connection is waited for (up to timeout).
        overflow = max_size - 1
        pool_sizes: dict[str, Any] = {
            "min_size": min(max(min_size - 1, 0), overflow),
            "max_size": overflow,
            "timeout": timeout,
        }
        # A direct connect is bounded like a pool wait, unless the URL says otherwise.
        connect = {} if "connect_timeout" in conninfo_to_dict(info) else {
            "connect_timeout": max(2, round(timeout))
        }

        def sync_pool() -> ConnectionPool[Any]:
            return ConnectionPool(
                info, kwargs=owned_kwargs, open=False, name="persistkit", **pool_sizes
            )

        def async_spares() -> AsyncSpares:
            # Not psycopg_pool's async pool: it connects in a background task,
            # which could hang the shutdown of a loop that ends while it runs
            # (asyncio.run() per call is common); see _postgres_spares.py.
            return AsyncSpares(info, {**owned_kwargs, **connect}, max_size=overflow, timeout=timeout)

        self._sync = Core(
            self._shared,
            Access(pool=pool, no_prepare=no_prepare)
            if pool is not None
            else Access(
                conninfo=info,
                connect=connect,
                factory=sync_pool if overflow else None,
                no_prepare=no_prepare,
                timeout=timeout,
            ),
        )
        self._async = AsyncCore(
            self._shared,
            AsyncAccess(pool=async_pool, no_prepare=no_prepare)
            if async_pool is not None
            else AsyncAccess(
                conninfo=info,
                connect=connect,
                factory=async_spares if overflow else None,
                no_prepare=no_prepare,
                timeout=timeout,
            ),
        )
        # kv and watch (_postgres_kv.py); a watch connects on its own with these.
        self._kv_attach(info, connect)
        if migrate:
            # On the user's pool, or else on the dedicated connection, opened
            # now: a wrong password or an unreachable server fails here with
            # libpq's own message, and the first step finds it open.
            self.migrate()

    def _setup(self, schema: str, shown_url: str, migrate: bool) -> None:
        self.url = shown_url
        self._shared = Shared(Queries(schema), shown_url, migrate=migrate)
        self._sync = None
        self._async = None

    # -- opening ---------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """Open ``postgresql://user:password@host:port/db?schema=...&sslmode=...``.

        persistkit's own query parameters and keywords are listed in
        :data:`OPTIONS` (see the class docstring); the rest goes to libpq.
        """
        parts = urlsplit(url)
        if parts.scheme.lower() not in cls.schemes:
            raise ConfigurationError(f"not a PostgreSQL URL: {mask_url(url)!r}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        # libpq's parameters, and "ssl" (libpq reads ssl=true in a URI as sslmode=require).
        libpq = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()} | {"ssl"}
        unknown = set(options) - set(OPTIONS) | {k for k, _ in query if k not in OPTIONS and k not in libpq}
        if unknown:
            raise unknown_options(
                "PostgreSQL", url, unknown, OPTIONS,
                "in the URL query also libpq's connection parameters (sslmode, connect_timeout, "
                "application_name, options, ...)",
            )
        merged: dict[str, Any] = {k: v for k, v in query if k in OPTIONS}
        merged.update(options)
        # Percent-encoded, never '+' for a space: libpq's URI parser decodes only %XX.
        libpq_query = urlencode([(k, v) for k, v in query if k not in OPTIONS], quote_via=quote)
        conninfo = urlunsplit(parts._replace(query=libpq_query))
        return cls(conninfo=conninfo, url=url, **_coerce(merged, url))

    @classmethod
    def from_connection(
        cls,
        conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
        *,
        schema: str = "persistkit",
        pgbouncer: bool = False,
        migrate: bool = True,
    ) -> PostgresBackend:
        """Use one connection the caller opened (operations take turns on it).

        The store switches it to autocommit and uses it exclusively until
        closed; it does not close it. If it breaks, the store opens its own
        replacement from the same parameters. A sync connection serves the
        async methods from a worker thread; an async one serves only the
        async methods (and migrates on the first of them).
        """
        self = cls.__new__(cls)
        dsn = conn.info.dsn
        password = conn.info.password
        conninfo = make_conninfo(dsn, password=password) if password else dsn
        self._setup(schema, _mask_conninfo(dsn), migrate)
        no_prepare = bool(pgbouncer)
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise ConfigurationError(
                "from_connection: the connection is inside a transaction; commit or roll back first"
            )
        if isinstance(conn, psycopg.AsyncConnection):
            self._async = AsyncCore(
                self._shared, AsyncAccess(connection=conn, conninfo=conninfo, no_prepare=no_prepare)
            )
            self._kv_attach(conninfo, {})
            return self
        self._sync = Core(
            self._shared, Access(connection=conn, conninfo=conninfo, no_prepare=no_prepare)
        )
        self._kv_attach(conninfo, {})
        if migrate:
            self._sync.migrate()
        return self

    # -- schema ----------------------------------------------------------------

    def migrate(self, check: bool = False) -> MigrationStatus:
        """Bring the tables to this persistkit's schema version (idempotent, safe
        from many processes at once), or with ``check=True`` only report it:
        ``status.behind`` is True when ``persistkit migrate`` is needed.

        ``persistkit migrate [--check] URL`` calls
        ``PostgresBackend.from_url(URL, migrate=False).migrate(check=...)``.
        """
        core = self._sync_core()
        try:
            return core.migrate(check)
        except BackendError as exc:
            raise _connect_error(exc, self.url) from exc.__cause__

    async def amigrate(self, check: bool = False) -> MigrationStatus:
        """The async twin of :meth:`migrate`."""
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.migrate, check)
        try:
            return await core.migrate(check)
        except BackendError as exc:
            raise _connect_error(exc, self.url) from exc.__cause__

    def _sync_core(self) -> Core:
        self._shared.check_open()
        if self._sync is None:
            raise ConfigurationError(
                f"the PostgreSQL store {self.url} was opened on an async connection: "
                "use the async methods (awrite, ahead, ...)"
            )
        return self._sync

    def _async_core(self) -> AsyncCore | None:
        self._shared.check_open()
        return self._async

    # -- sync operations ---------------------------------------------------------

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        return self._sync_core().write(row, blobs, expected_version)

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        self._sync_core().put_blobs(thread_id, blobs)

    def head(self, thread_id: str, namespace: str) -> Head | None:
        return self._sync_core().head(thread_id, namespace)

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        return self._sync_core().get(thread_id, namespace, checkpoint_id)

    def head_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        return self._sync_core().head_row(thread_id, namespace)

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        return self._sync_core().list(
            thread_id, namespace, run_id=run_id, before=before, limit=limit
        )

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        return self._sync_core().get_blobs(thread_id, keys)

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        return self._sync_core().scan_blobs(thread_id, start, stop)

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        return self._sync_core().threads(prefix=prefix, after=after, limit=limit)

    def delete_thread(self, thread_id: str) -> bool:
        return self._sync_core().delete_thread(thread_id)

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        return self._sync_core().namespaces(thread_id)

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        self._sync_core().rewrite(thread_id, rows, blobs)

    # -- async operations (a sync-only connection answers from a thread) ---------

    async def awrite(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int
    ) -> Head:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.write, row, blobs, expected_version)
        return await core.write(row, blobs, expected_version)

    async def aput_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.put_blobs, thread_id, blobs)
        await core.put_blobs(thread_id, blobs)

    async def ahead(self, thread_id: str, namespace: str) -> Head | None:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.head, thread_id, namespace)
        return await core.head(thread_id, namespace)

    async def ahead_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.head_row, thread_id, namespace)
        return await core.head_row(thread_id, namespace)

    async def aget(
        self, thread_id: str, namespace: str, checkpoint_id: str
    ) -> CheckpointRow | None:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.get, thread_id, namespace, checkpoint_id)
        return await core.get(thread_id, namespace, checkpoint_id)

    async def alist(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[CheckpointRow]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(
                self.list, thread_id, namespace, run_id=run_id, before=before, limit=limit
            )
        return await core.list(thread_id, namespace, run_id=run_id, before=before, limit=limit)

    async def aget_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.get_blobs, thread_id, keys)
        return await core.get_blobs(thread_id, keys)

    async def ascan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.scan_blobs, thread_id, start, stop)
        return await core.scan_blobs(thread_id, start, stop)

    async def athreads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.threads, prefix=prefix, after=after, limit=limit)
        return await core.threads(prefix=prefix, after=after, limit=limit)

    async def adelete_thread(self, thread_id: str) -> bool:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.delete_thread, thread_id)
        return await core.delete_thread(thread_id)

    async def anamespaces(self, thread_id: str) -> builtins.list[str]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.namespaces, thread_id)
        return await core.namespaces(thread_id)

    async def arewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.rewrite, thread_id, rows, blobs)
        await core.rewrite(thread_id, rows, blobs)

    # -- lifecycle ---------------------------------------------------------------

    def close(self) -> None:
        """Close the pools and connections the store opened. Idempotent."""
        self._shared.closed = True
        if self._sync is not None:
            self._sync.access.close()
        if self._async is not None:
            _close_async_from_sync(self._async.access)

    async def aclose(self) -> None:
        """Close from a coroutine (the async pool is closed in its own loop)."""
        self._shared.closed = True
        if self._async is not None:
            await self._async.access.close()
            _close_async_from_sync(self._async.access)  # pools of other loops
        if self._sync is not None:
            await asyncio.to_thread(self._sync.access.close)

    # -- leases (persistkit.coordination) ----------------------------------------------

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return self._sync_core().write_fenced(row, blobs, expected_version, fence)

    def write_fenced_swap(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int,
        lease_version: int, lease_data: bytes,
    ) -> tuple[Head, bool]:
        return self._sync_core().write_fenced_swap(row, blobs, expected_version, fence, lease_version, lease_data)

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        return self._sync_core().lease_get(thread_id, namespace)

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        return self._sync_core().lease_swap(thread_id, namespace, expected, token, data)

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        return self._sync_core().lease_list(prefix=prefix)

    async def awrite_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.write_fenced, row, blobs, expected_version, fence)
        return await core.write_fenced(row, blobs, expected_version, fence)

    async def awrite_fenced_swap(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int,
        lease_version: int, lease_data: bytes,
    ) -> tuple[Head, bool]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(
                self.write_fenced_swap, row, blobs, expected_version, fence, lease_version, lease_data
            )
        return await core.write_fenced_swap(row, blobs, expected_version, fence, lease_version, lease_data)

    async def alease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.lease_get, thread_id, namespace)
        return await core.lease_get(thread_id, namespace)

    async def alease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.lease_swap, thread_id, namespace, expected, token, data)
        return await core.lease_swap(thread_id, namespace, expected, token, data)

    async def alease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.lease_list, prefix=prefix)
        return await core.lease_list(prefix=prefix)

    def __repr__(self) -> str:
        return f"PostgresBackend({self.url!r}, schema={self._shared.queries.schema!r})"


def grant_board_access(
    url: str, role: str, *, board: str, read: Sequence[str] = (), write: Sequence[str] = ()
) -> None:
    """Let database role ``role`` read keys of board ``board`` (its kv scope) matching the
    ``read`` and ``write`` globs and write those matching ``write``, enforced by the server
    (row-level security; see ``_postgres_kv_access.py`` for what it does and does not
    protect). Replaces the role's earlier grants in that board. Run it with ``url`` of
    the schema's owner; the agent then connects as ``role``
    (``postgresql://role@host/db?schema=...``), where a refused write raises
    ``AccessDeniedError`` and keys outside the grants are invisible."""
    store = PostgresBackend.from_url(url)
    try:
        grant(store._sync_core(), role, board, list(read), list(write))
    finally:
        store.close()


def revoke_board_access(url: str, role: str, *, board: str | None = None) -> None:
    """Remove ``role``'s grants in ``board`` (all boards when ``None``); a role with no
    grant left also loses its privileges on the schema's tables."""
    store = PostgresBackend.from_url(url)
    try:
        revoke(store._sync_core(), role, board)
    finally:
        store.close()


def _close_async_from_sync(access: AsyncAccess) -> None:
    """Close what the async side opened in its current event loop, from any thread and
    without that loop: libpq's close needs none."""
    spares, _loop, conn = access.detach()
    if conn is not None:
        conn.pgconn.finish()
    if isinstance(spares, AsyncSpares):  # the only overflow the store makes itself
        spares.finish()


def _check_sizes(min_size: int, max_size: int, timeout: float) -> None:
    if not (isinstance(min_size, int) and isinstance(max_size, int) and 0 <= min_size <= max_size):
        raise ConfigurationError(
            f"min_size={min_size!r}, max_size={max_size!r}: need integers with 0 <= min_size <= max_size"
        )
    if max_size < 1:
        raise ConfigurationError(f"max_size={max_size!r}: need at least 1")
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigurationError(f"timeout={timeout!r}: need a number of seconds > 0")


def _coerce(options: dict[str, Any], url: str) -> dict[str, Any]:
    """Typed option values from URL strings or keywords."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        try:
            if name in ("pgbouncer", "prepare", "migrate"):
                out[name] = _bool(value)
            elif name in ("min_size", "max_size"):
                out[name] = int(value)
            elif name == "timeout":
                out[name] = float(value)
            else:
                out[name] = value
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"PostgreSQL store option {name}={value!r} in {mask_url(url)}: {exc}"
            ) from exc
    return out


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected true or false")


def _with_app_name(conninfo: str) -> str:
    """Name our sessions in pg_stat_activity unless the user named them."""
    params = conninfo_to_dict(conninfo)
    if "application_name" in params or "PGAPPNAME" in os.environ:
        return conninfo
    return make_conninfo(conninfo, application_name="persistkit")


def _pool_conninfo(pool: ConnectionPool[Any] | AsyncConnectionPool[Any]) -> str:
    """The conninfo of a user's pool, to open a pool for the other (sync/async) side."""
    conninfo, kwargs = pool.conninfo, pool.kwargs
    if not isinstance(conninfo, str) or not isinstance(kwargs, dict | None):
        raise ConfigurationError(
            "the pool's conninfo/kwargs are callables: pass conninfo= to PostgresBackend too"
        )
    extra = {k: v for k, v in (kwargs or {}).items() if k not in _NOT_CONNINFO}
    return make_conninfo(conninfo, **extra)


def _mask_conninfo(conninfo: str) -> str:
    params = conninfo_to_dict(conninfo)
    if "password" in params:
        params["password"] = URL_PASSWORD_MASK
    return make_conninfo("", **params)


# libpq's words for a connection that never opened, and what the user should fix.
_CONNECT_FAILURES: tuple[tuple[tuple[str, ...], str, type[PersistkitError]], ...] = (
    (("password authentication failed", "no pg_hba.conf entry", "role ", "authentication"),
     "the server refused the login: check the user name and password in the URL (or $PGPASSWORD, "
     "~/.pgpass) and the server's pg_hba.conf", ConfigurationError),
    (("database ",), "that database does not exist on the server: check the database name at the "
     "end of the URL, or create it (createdb)", ConfigurationError),
    (("resolve host", "translate host name", "name or service not known", "nodename nor servname"),
     "the host name does not resolve: check the host in the URL", ConfigurationError),
    (("invalid ", "unrecognized", "missing \"=\""),
     "a connection parameter in the URL is invalid", ConfigurationError),
    # refused or reset: the server may be down or restarting (the first connect and the hundredth
    # are the same outage), so a retry can succeed; the message also names what to check
    (("connection refused", "no such file or directory", "connection reset", "server closed the connection"),
     "nothing accepts connections there (yet): the server is down or restarting, or the URL's host and "
     "port are wrong. Safe to retry once it is up (a job queue retries pk.RetryableError); if it "
     "persists, check the host and port and that the server is running", BackendUnavailableError),
    (("timeout expired",), "the server did not answer in time: check the URL's host and port (a firewall "
     "may drop the packets), or give it longer with ?connect_timeout=SECONDS", BackendUnavailableError),
)


def _connect_error(exc: BackendError, url: str) -> PersistkitError:
    """The error for a failure on a store's FIRST use (its migration at open), when a
    connection could not even be opened: a wrong URL (a login, database, host name or
    parameter: not transient, a retry fails the same way) or a server that is not
    answering (refused, reset, timed out: ``BackendUnavailableError``, as on any later
    connect). Any other failure is returned as it was."""
    cause = exc.__cause__
    if not isinstance(cause, psycopg.OperationalError) or cause.sqlstate not in (None, "28P01", "28000", "3D000"):
        return exc
    text = str(cause).lower()
    for needles, fix, error in _CONNECT_FAILURES:
        if any(n in text for n in needles) and (needles != ("database ",) or "does not exist" in text):
            detail = " ".join(str(cause).split()) or type(cause).__name__
            message = f"cannot connect to the PostgreSQL store {url}: {fix} ({detail})"
            mapped = error(message)
            if needles == ("database ",):
                # the CLI reports a store in a database that does not exist as not found (exit 3)
                mapped.missing_database = True  # type: ignore[attr-defined]
            return mapped
    return exc
