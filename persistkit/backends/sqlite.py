"""The embedded default store: one SQLite file, safe across threads and processes.

URLs
----
``sqlite:///relative/path.db``
    A file relative to the working directory at open time.
``sqlite:////absolute/path.db``
    An absolute path. Missing parent directories are created.

Options (in the query string, or as keyword arguments of ``open_backend``)
---------------------------------------------------------------------------
``synchronous=NORMAL`` (default)
    WAL with ``synchronous=NORMAL``: a committed step survives a crash of the
    process; a power loss may lose the last few commits, never corrupts.
``synchronous=FULL``
    Also survives power loss of the last commits; costs an fsync per step.
``busy_timeout=<ms>`` (default 5000)
    How long a writer waits for another writer's lock before the write fails
    with :class:`~persistkit.BackendUnavailableError` (which is retried).
``watch_interval=<ms>`` (default 5)
    How often a kv watch polls the file for other connections' commits
    (``backends/_sqlite_kv.py``); writes of this process wake it at once.

How it uses SQLite (the habits of python-diskcache's ``core.py``):

* WAL journal, so readers never block the writer and the writer never blocks
  readers; ``synchronous=NORMAL`` because in WAL mode that is crash-safe and
  skips the per-commit fsync.
* An autocommit connection (``isolation_level=None``). A step is one
  ``INSERT`` (a trigger checks the head inside it; the head is the newest
  versioned row, so there is no head row to update), whose implicit
  transaction takes the write lock before anything is read; several
  statements run in explicit ``BEGIN IMMEDIATE ... COMMIT``: the write lock is
  taken up front, so two writers queue on ``busy_timeout`` instead of
  deadlocking on a lock upgrade (a deferred transaction that reads first fails
  with SQLITE_BUSY at once).
* One connection per OS thread (sqlite3 connections must not be shared
  while in use), reopened in a forked child (SQLite forbids carrying an open
  connection across ``fork``), pragmas applied to every new connection
  because most of them are per connection.
* Constant SQL strings: the sqlite3 module caches their prepared statements.
* Every ``sqlite3`` exception is mapped at this boundary: lock contention to
  ``BackendUnavailableError``, everything else to ``BackendError``, always
  ``raise ... from exc``.
"""

from __future__ import annotations

# builtins.list: inside the class body, `list` names the list() method.
import builtins
import contextlib
import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qsl

from .._errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    LeaseLostError,
    SchemaVersionError,
    StoreClosedError,
)
from . import unknown_options
from ._protocol import CheckpointRow, Head, LeaseRecord, ThreadedAsync, new_head
from ._sqlite_kv import SQLiteKv, watch_interval
from ._sqlite_kv import is_busy as _is_busy
from ._sqlite_kv import prefix_end as _prefix_end
from ._sqlite_prune import SQLitePrune

__all__ = ["SCHEMA_VERSION", "SQLiteBackend"]

_OPTIONS = ("busy_timeout", "synchronous", "watch_interval")
#: The directory of the default store (``pk.connect()`` with no URL): the one directory created on demand.
DEFAULT_DIR = ".persistkit"
#: What the compare-and-swap trigger says when the head is not where the writer expected it.
_CONFLICT = "persistkit: the thread head moved"
# Whether NEW may become the head: 1 if the head (the newest versioned row of
# NEW's thread) is at the version before and sorts before NEW, 0 if not, NULL
# if there is no head. One seek of the primary key. The writer tells a moved
# head from an id out of order by reading the head after the refusal.
_NEW_FOLLOWS_HEAD = """SELECT version = NEW.version - 1 AND checkpoint_id < NEW.checkpoint_id
                FROM pk_checkpoints
                WHERE thread_id = NEW.thread_id AND namespace = NEW.namespace AND version IS NOT NULL
                ORDER BY checkpoint_id DESC LIMIT 1"""
_SYNCHRONOUS = ("NORMAL", "FULL")
#: What the fence trigger says when a fenced write's lease token is not the thread's.
_FENCE = "persistkit: the lease token is stale"

# Versioned migrations of our own tables; entry i moves the schema from
# version i to i + 1. Never edit a released entry: append a new one.
# WITHOUT ROWID only for heads (tiny rows, always looked up by their key).
# Checkpoints and blobs are rowid tables: a WITHOUT ROWID row lives in an
# index b-tree, where anything over ~1000 bytes (4 KB pages) spills into an
# overflow page of its own, and our payloads are 0.2-2 KB. Measured, 200
# writes of a 1 KB blob + a row (SQLite 3.40, 4 KB pages), bytes on disk:
#   300 B rows:  all WITHOUT ROWID 1,060,864   this layout 442,368
#   1.5 KB rows: all WITHOUT ROWID 1,904,640   this layout 770,048
# and the rowid layout was no slower per write.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE pk_heads (
            thread_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            PRIMARY KEY (thread_id, namespace)
        ) WITHOUT ROWID""",
        """CREATE TABLE pk_checkpoints (
            thread_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            parent_id TEXT,
            run_id TEXT,
            payload BLOB NOT NULL,
            PRIMARY KEY (thread_id, namespace, checkpoint_id)
        )""",
        # list(run_id=...) newest first walks this index in order.
        """CREATE INDEX pk_checkpoints_run
            ON pk_checkpoints (thread_id, namespace, run_id, checkpoint_id)""",
        """CREATE TABLE pk_blobs (
            thread_id TEXT NOT NULL,
            key TEXT NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (thread_id, key)
        )""",
    ),
    # 2: the per-row run index cost a fourth page (a 4 KB WAL frame) on every
    # commit. A run's first checkpoint id, written once per run, bounds the scan
    # of list(run_id=...) instead: an INSERT OR IGNORE of a key that exists
    # dirties no page. Measured on the 200 x 1 KB benchmark: ~20% off a write.
    (
        "DROP INDEX pk_checkpoints_run",
        """CREATE TABLE pk_runs (
            thread_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            run_id TEXT NOT NULL,
            first_id TEXT NOT NULL,
            PRIMARY KEY (thread_id, namespace, run_id)
        ) WITHOUT ROWID""",
        """INSERT INTO pk_runs (thread_id, namespace, run_id, first_id)
            SELECT thread_id, namespace, run_id, MIN(checkpoint_id) FROM pk_checkpoints
            WHERE run_id IS NOT NULL GROUP BY thread_id, namespace, run_id""",
    ),
    # 3: a step is one INSERT. The row carries the head version it creates; a
    # trigger refuses it unless the head is at the version before (the
    # compare-and-swap), another moves the head and notes the run. One statement
    # in autocommit is its own write transaction (the lock is taken before the
    # trigger reads the head), so BEGIN and COMMIT are no longer two more
    # statements from Python: measured ~10 us off a write on the 200 x 1 KB
    # benchmark. Rows written without a version (before 3, or by hand) fire nothing.
    (
        "ALTER TABLE pk_checkpoints ADD COLUMN version INTEGER",
        f"""CREATE TRIGGER pk_checkpoints_cas BEFORE INSERT ON pk_checkpoints
            WHEN NEW.version IS NOT NULL BEGIN
              SELECT RAISE(ABORT, '{_CONFLICT}') WHERE coalesce((SELECT version FROM pk_heads
                WHERE thread_id = NEW.thread_id AND namespace = NEW.namespace), 0) != NEW.version - 1;
            END""",
        """CREATE TRIGGER pk_checkpoints_head AFTER INSERT ON pk_checkpoints
            WHEN NEW.version IS NOT NULL BEGIN
              INSERT INTO pk_heads (thread_id, namespace, checkpoint_id, version)
                VALUES (NEW.thread_id, NEW.namespace, NEW.checkpoint_id, NEW.version)
                ON CONFLICT (thread_id, namespace) DO UPDATE
                SET checkpoint_id = excluded.checkpoint_id, version = excluded.version;
              INSERT OR IGNORE INTO pk_runs (thread_id, namespace, run_id, first_id)
                SELECT NEW.thread_id, NEW.namespace, NEW.run_id, NEW.checkpoint_id
                WHERE NEW.run_id IS NOT NULL;
            END""",
    ),
    # 4: no heads table. The head of (thread, namespace) is its newest row that
    # carries a version (every row persistkit writes does; ids sort in write
    # order). The heads page was a third page, so a third 4 KB WAL frame, on
    # every commit: measured on 200 x 1 KB writes, 58 -> 45 us a write (the raw
    # INSERT+COMMIT floor: 42-44 us), 3.41 -> 2.40 WAL frames a commit, so the
    # WAL also fills (and is checkpointed, an fsync) 30% less often.
    # The old head row takes the head's version; rows newer than the old head
    # (there are none unless the file was edited) lose theirs: the head stays.
    (
        """UPDATE pk_checkpoints SET version = NULL WHERE version IS NOT NULL
            AND checkpoint_id > coalesce((SELECT h.checkpoint_id FROM pk_heads h
              WHERE h.thread_id = pk_checkpoints.thread_id AND h.namespace = pk_checkpoints.namespace), '')""",
        """UPDATE pk_checkpoints SET version = (SELECT h.version FROM pk_heads h
              WHERE h.thread_id = pk_checkpoints.thread_id AND h.namespace = pk_checkpoints.namespace
              AND h.checkpoint_id = pk_checkpoints.checkpoint_id)
            WHERE EXISTS (SELECT 1 FROM pk_heads h
              WHERE h.thread_id = pk_checkpoints.thread_id AND h.namespace = pk_checkpoints.namespace
              AND h.checkpoint_id = pk_checkpoints.checkpoint_id)""",
        "DROP TRIGGER pk_checkpoints_cas",
        "DROP TRIGGER pk_checkpoints_head",
        "DROP TABLE pk_heads",
        f"""CREATE TRIGGER pk_checkpoints_cas BEFORE INSERT ON pk_checkpoints
            WHEN NEW.version IS NOT NULL BEGIN
              SELECT RAISE(ABORT, '{_CONFLICT}')
                WHERE coalesce(({_NEW_FOLLOWS_HEAD}), NEW.version = 1) = 0;
            END""",
        """CREATE TRIGGER pk_checkpoints_run AFTER INSERT ON pk_checkpoints
            WHEN NEW.version IS NOT NULL AND NEW.run_id IS NOT NULL BEGIN
              INSERT OR IGNORE INTO pk_runs (thread_id, namespace, run_id, first_id)
                VALUES (NEW.thread_id, NEW.namespace, NEW.run_id, NEW.checkpoint_id);
            END""",
    ),
    # 5: leases (persistkit.coordination). A fenced write inserts into the view
    # pk_fenced: its trigger refuses a stale token, then inserts the row, whose own
    # triggers do the head's compare-and-swap — one statement, one transaction,
    # one more seek (of the lease row, not written) than an unfenced write.
    (
        """CREATE TABLE pk_leases (
            thread_id TEXT NOT NULL,
            namespace TEXT NOT NULL,
            token INTEGER NOT NULL,
            data BLOB NOT NULL,
            version INTEGER NOT NULL,
            PRIMARY KEY (thread_id, namespace)
        ) WITHOUT ROWID""",
        """CREATE VIEW pk_fenced AS SELECT thread_id, namespace, checkpoint_id, parent_id, run_id,
            payload, version, 0 AS fence FROM pk_checkpoints WHERE 0""",
        f"""CREATE TRIGGER pk_fenced_insert INSTEAD OF INSERT ON pk_fenced BEGIN
              SELECT RAISE(ABORT, '{_FENCE}') WHERE coalesce((SELECT token FROM pk_leases
                WHERE thread_id = NEW.thread_id AND namespace = NEW.namespace), 0) != NEW.fence;
              INSERT INTO pk_checkpoints
                (thread_id, namespace, checkpoint_id, parent_id, run_id, payload, version)
                VALUES (NEW.thread_id, NEW.namespace, NEW.checkpoint_id, NEW.parent_id,
                        NEW.run_id, NEW.payload, NEW.version);
            END""",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)

_META = """CREATE TABLE IF NOT EXISTS pk_meta (
    key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID"""
_GET_VERSION = "SELECT value FROM pk_meta WHERE key = 'schema_version'"
_SET_VERSION = """INSERT INTO pk_meta (key, value) VALUES ('schema_version', ?)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value"""

# The head: the newest row that carries a version (see migration 4).
_HEAD = """SELECT checkpoint_id, version FROM pk_checkpoints
    WHERE thread_id = ? AND namespace = ? AND version IS NOT NULL
    ORDER BY checkpoint_id DESC LIMIT 1"""
_PUT_BLOB = "INSERT OR IGNORE INTO pk_blobs (thread_id, key, data) VALUES (?, ?, ?)"
# The triggers of migration 4 check the head (and note the run).
_PUT_ROW = """INSERT INTO pk_checkpoints
    (thread_id, namespace, checkpoint_id, parent_id, run_id, payload, version)
    VALUES (?, ?, ?, ?, ?, ?, ?)"""
_PUT_FENCED = """INSERT INTO pk_fenced
    (thread_id, namespace, checkpoint_id, parent_id, run_id, payload, version, fence)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)"""
_LEASE_GET = "SELECT token, data, version FROM pk_leases WHERE thread_id = ? AND namespace = ?"
_LEASE_CREATE = """INSERT INTO pk_leases (thread_id, namespace, token, data, version)
    VALUES (?, ?, ?, ?, 1) ON CONFLICT (thread_id, namespace) DO NOTHING"""
_LEASE_SWAP = """UPDATE pk_leases SET token = ?, data = ?, version = version + 1
    WHERE thread_id = ? AND namespace = ? AND version = ?"""
_LEASE_LIST = """SELECT thread_id, namespace, token, data, version FROM pk_leases
    WHERE thread_id >= ? ORDER BY thread_id, namespace"""
_HEAD_ROW = """SELECT checkpoint_id, version, parent_id, run_id, payload FROM pk_checkpoints
    WHERE thread_id = ? AND namespace = ? AND version IS NOT NULL
    ORDER BY checkpoint_id DESC LIMIT 1"""
_GET_ROW = """SELECT parent_id, run_id, payload FROM pk_checkpoints
    WHERE thread_id = ? AND namespace = ? AND checkpoint_id = ?"""
_LIST_BASE = """SELECT checkpoint_id, parent_id, run_id, payload FROM pk_checkpoints
    WHERE thread_id = ? AND namespace = ?"""
# (filter by run_id, filter by before) -> SQL; four constant strings, so four
# cached statements.
# A run's rows all sort at or after its first checkpoint id (no pk_runs entry:
# NULL, so no rows); the primary key serves the scan from there.
_LIST: dict[tuple[bool, bool], str] = {
    (run, before): _LIST_BASE
    + (
        " AND checkpoint_id >= (SELECT first_id FROM pk_runs"
        " WHERE thread_id = ?1 AND namespace = ?2 AND run_id = ?3) AND run_id = ?3"
        if run
        else ""
    )
    + (" AND checkpoint_id < ?" if before else "")
    + " ORDER BY checkpoint_id DESC LIMIT ?"
    for run in (False, True)
    for before in (False, True)
}
# json_each turns one JSON array parameter into a key set: one constant
# statement for any number of keys (no per-length IN (?, ?, ...) strings
# evicting each other from the statement cache, no variable-count limit).
_GET_BLOBS = """SELECT key, data FROM pk_blobs
    WHERE thread_id = ? AND key IN (SELECT value FROM json_each(?))"""
_SCAN_BLOBS = """SELECT key, data FROM pk_blobs
    WHERE thread_id = ? AND key >= ? AND key < ? ORDER BY key"""
# A prefix is a half-open range [prefix, successor): it uses the primary key
# and, unlike LIKE/GLOB, has no wildcard characters to escape.
# Distinct thread ids by a skip scan of the primary key: one seek per thread, not
# one step per row (SELECT DISTINCT would walk every checkpoint of every thread).
# ?1 prefix, ?2 after, ?3 end of the prefix range ('' when unbounded), ?4 limit.
_THREADS = """WITH RECURSIVE t(id) AS (
        SELECT (SELECT min(thread_id) FROM pk_checkpoints WHERE thread_id >= ?1 AND thread_id > ?2)
        UNION ALL
        SELECT (SELECT min(thread_id) FROM pk_checkpoints WHERE thread_id > t.id)
        FROM t WHERE t.id IS NOT NULL AND (?3 = '' OR t.id < ?3)
        LIMIT CASE WHEN ?4 < 0 THEN -1 ELSE ?4 + 1 END
    ) SELECT id FROM t WHERE id IS NOT NULL AND (?3 = '' OR id < ?3) LIMIT ?4"""
_NAMESPACES = "SELECT DISTINCT namespace FROM pk_checkpoints WHERE thread_id = ?"
# Maintenance (key rotation): replace bytes of rows and blobs that exist; never insert.
_REWRITE_ROW = """UPDATE pk_checkpoints SET payload = ?
    WHERE thread_id = ? AND namespace = ? AND checkpoint_id = ?"""
_REWRITE_BLOB = "UPDATE pk_blobs SET data = ? WHERE thread_id = ? AND key = ?"
_DELETE = (
    "DELETE FROM pk_checkpoints WHERE thread_id = ?",
    "DELETE FROM pk_blobs WHERE thread_id = ?",
    "DELETE FROM pk_runs WHERE thread_id = ?",
)

# Connections inherited by a forked child. The child must never use them,
# and must not close them either: closing runs SQLite's unlock/checkpoint
# logic against lock state that belongs to the parent. Keeping a reference
# stops the garbage collector from closing them.
_FORK_ORPHANS: list[sqlite3.Connection] = []

#: This process's id, kept current by a fork hook: ``os.getpid()`` is a system
#: call (glibc no longer caches it), and ``_conn`` asks on every statement.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class _Connection(sqlite3.Connection):
    """A subclass only so that connections can be weakly referenced."""


class SQLiteBackend(SQLiteKv, SQLitePrune, ThreadedAsync):
    """Checkpoints in one SQLite file (WAL). Thread-safe and multi-process safe."""

    schemes: ClassVar[tuple[str, ...]] = ("sqlite",)
    capabilities: ClassVar[frozenset[str]] = frozenset({"fencing", "leases", "kv", "watch", "prune"})

    def __init__(
        self, path: str, *, url: str, synchronous: str, busy_timeout: int, watch_interval: float = 5.0
    ) -> None:
        self.path = path
        self.url = url
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.watch_interval = watch_interval  # milliseconds
        self._closed = False
        self._pid = os.getpid()
        self._local = threading.local()
        self._lock = threading.Lock()
        # Every live connection of this process and the thread that uses it, so close() can
        # close them; weak, so a connection dies with the thread that owned it.
        self._conns: weakref.WeakKeyDictionary[_Connection, weakref.ref[threading.Thread]] = weakref.WeakKeyDictionary()
        parent = os.path.dirname(path)
        # Only the default location is made on demand: elsewhere a missing directory is
        # far more often a typo in the path, and creating it would start a fresh, empty
        # store in place of the user's (a resumed agent would silently start over).
        default = parent == os.path.abspath(DEFAULT_DIR) and os.path.isdir(os.path.dirname(parent))
        if parent and not os.path.isdir(parent) and not default:
            raise ConfigurationError(
                f"sqlite store {url!r}: the directory {parent} does not exist, and nothing was "
                "created. Check the path for a typo, or create the directory first "
                f"(mkdir -p {parent}); only the default location ./{DEFAULT_DIR}/ is created on demand"
            )
        try:
            if parent:
                os.makedirs(parent, exist_ok=True)  # exists, or the default directory (one level)
            self._migrate(self._conn())
        except OSError as exc:
            self.close()
            raise BackendError(f"sqlite store {path!r}: cannot create the file: {exc}") from exc
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteBackend:
        """Open ``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

        Options (query string or keywords): ``synchronous`` (NORMAL or FULL),
        ``busy_timeout`` (milliseconds). Anything else is a ``ConfigurationError``.
        """
        scheme, sep, rest = url.partition("://")
        if scheme.lower() != "sqlite" or not sep or not rest.startswith("/"):
            raise ConfigurationError(
                f"invalid SQLite URL {url!r}: use 'sqlite:///relative/path.db' or "
                "'sqlite:////absolute/path.db' (no host part)"
            )
        path, _, query = rest[1:].partition("?")
        if not path or path == ":memory:":
            raise ConfigurationError(
                f"invalid SQLite URL {url!r}: give a file path; for a store in memory use 'memory://'"
            )
        given: dict[str, Any] = {}
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name in given:
                raise ConfigurationError(f"option {name!r} is given twice in {url!r}")
            given[name] = value
        given.update(options)
        unknown = sorted(set(given) - set(_OPTIONS))
        if unknown:
            raise unknown_options("SQLite", url, unknown, _OPTIONS)
        sync = str(given.get("synchronous", "NORMAL")).upper()
        if sync not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={given['synchronous']!r} in {url!r}: use NORMAL (default) or FULL"
            )
        raw_timeout = given.get("busy_timeout", 5000)
        try:
            timeout = int(raw_timeout)
        except (TypeError, ValueError):
            timeout = -1
        if timeout < 0 or isinstance(raw_timeout, bool):
            raise ConfigurationError(
                f"busy_timeout={raw_timeout!r} in {url!r}: give milliseconds as an integer >= 0"
            )
        interval = watch_interval(given, url)
        return cls(os.path.abspath(path), url=url, synchronous=sync, busy_timeout=timeout, watch_interval=interval)

    # -- connections -----------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use (and again after fork)."""
        if self._closed:
            left = getattr(self._local, "conn", None) if self._pid == _pid else None
            if left is not None:  # close() left it to this thread, which used it (see close)
                self._local.conn = None
                left.close()
            raise StoreClosedError(f"the store {self.url!r} was closed; open a new one")
        if self._pid != _pid:
            self._after_fork()
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._conns[conn] = weakref.ref(threading.current_thread())
        return conn

    def _after_fork(self) -> None:
        # Locks and thread-locals were copied mid-flight from the parent;
        # start afresh and park the inherited connections (see _FORK_ORPHANS).
        _FORK_ORPHANS.extend(self._conns)
        if (inherited := getattr(self._local, "conn", None)) is not None:
            _FORK_ORPHANS.append(inherited)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._conns = weakref.WeakKeyDictionary()
        self._pid = os.getpid()

    def _connect(self) -> _Connection:
        with self._mapped("open"):
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout / 1000,
                isolation_level=None,  # autocommit: we issue BEGIN IMMEDIATE ourselves
                check_same_thread=False,  # only so close() may close it from another thread
                factory=_Connection,
            )
            try:
                self._retry_locked(lambda: self._apply_pragmas(conn))
            except BaseException:
                conn.close()
                raise
        return conn

    def _apply_pragmas(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout}")
        # WAL is persistent in the file; asking again is a cheap no-op, and the
        # first connection to a fresh file is the one that switches it.
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")

    def _retry_locked(self, action: Any) -> None:
        """Run ``action``, retrying "database is locked" until busy_timeout.

        SQLite does not invoke the busy handler for some lock waits (switching
        to WAL, WAL recovery while another process opens the file), so several
        processes opening a fresh file at once can see SQLITE_BUSY immediately;
        diskcache retries these the same way.
        """
        deadline = time.monotonic() + self.busy_timeout / 1000
        delay = 0.001
        while True:
            try:
                action()
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring our tables to SCHEMA_VERSION; idempotent and safe under concurrent opens."""
        with self._mapped("open"):
            with contextlib.suppress(sqlite3.OperationalError):  # no pk_meta yet: migrate
                found = conn.execute(_GET_VERSION).fetchone()
                if found is not None and found[0] == SCHEMA_VERSION:
                    return  # the common case: no write lock needed
            # The version is checked again under the write lock: of many
            # processes opening a fresh file, exactly one applies each step.
            with self._transaction(conn):
                conn.execute(_META)
                found = conn.execute(_GET_VERSION).fetchone()
                version = int(found[0]) if found is not None else 0
                if version > SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"sqlite store {self.path!r} has schema version {version}, newer than "
                        f"this persistkit's {SCHEMA_VERSION}; upgrade persistkit to open it"
                    )
                for statements in _MIGRATIONS[version:]:
                    for sql in statements:
                        conn.execute(sql)
                if version != SCHEMA_VERSION:
                    conn.execute(_SET_VERSION, (SCHEMA_VERSION,))

    @staticmethod
    @contextlib.contextmanager
    def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception (then re-raise)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException as exc:
            _rollback(conn, exc)
            raise
        conn.execute("COMMIT")

    @contextlib.contextmanager
    def _mapped(self, op: str, thread_id: str | None = None) -> Iterator[None]:
        """Turn sqlite3 errors into persistkit errors that say where and what to do."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc, op, thread_id) from exc

    def _error(self, exc: sqlite3.Error, op: str, thread_id: str | None) -> Exception:
        """The persistkit error for a sqlite3 error (the caller raises it ``from exc``)."""
        where = f"sqlite store {self.path!r}: {op}" + (
            f" on thread {thread_id!r}" if thread_id is not None else ""
        )
        if self._closed:
            return StoreClosedError(f"{where}: the store was closed")
        if _is_busy(exc):
            return BackendUnavailableError(
                f"{where}: the database stayed locked by another connection for longer than "
                f"busy_timeout={self.busy_timeout} ms ({exc}); retry, or raise busy_timeout"
            )
        return BackendError(f"{where} failed: {exc}")

    # -- writes ----------------------------------------------------------------

    def write(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int | None = None
    ) -> Head:
        # self._conn(), inlined for the common case (the per-step path)
        conn = None if self._closed or self._pid != _pid else getattr(self._local, "conn", None)
        if conn is None:
            conn = self._conn()
        tid, ns, cid = row.thread_id, row.namespace, row.checkpoint_id
        version = expected_version + 1
        params: tuple[Any, ...] = (tid, ns, cid, row.parent_id, row.run_id, row.payload, version)
        put_row = _PUT_ROW if fence is None else _PUT_FENCED  # write_fenced: the lease checked too
        if fence is not None:
            params += (fence,)
        # Hand-written try/except rather than _transaction(): this is the one
        # method whose microseconds matter.
        try:
            if not blobs:
                # One statement in autocommit mode: its implicit write transaction holds
                # the lock from before the compare-and-swap trigger reads the head.
                conn.execute(put_row, params)
            else:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(_PUT_BLOB, [(tid, k, v) for k, v in blobs.items()])
                    conn.execute(put_row, params)
                except BaseException as exc:
                    _rollback(conn, exc)
                    raise
                conn.execute("COMMIT")
        except sqlite3.IntegrityError as exc:
            if fence is not None and _FENCE in str(exc):
                raise self._lease_lost(tid, ns, fence) from None
            if _CONFLICT not in str(exc):
                raise self._error(exc, "write", tid) from exc
            with self._mapped("write", tid):
                current = conn.execute(_HEAD, (tid, ns)).fetchone()
            if current is not None and current[1] == expected_version and current[0] >= cid:
                raise BackendError(
                    f"sqlite store {self.path!r}: write on thread {tid!r}: checkpoint id {cid!r} "
                    f"does not sort after the thread's head {current[0]!r}, so it could not become "
                    "the head; make each new id sort after its parent's (persistkit's own ids do)"
                ) from exc
            raise ConflictError(
                thread_id=tid,
                namespace=ns,
                expected=expected_version,
                found=current[1] if current is not None else 0,
                found_checkpoint=current[0] if current is not None else None,
            ) from None
        except sqlite3.Error as exc:
            raise self._error(exc, "write", tid) from exc
        return new_head(cid, version)

    def put_blobs(self, thread_id: str, blobs: Mapping[str, bytes]) -> None:
        conn = self._conn()
        if not blobs:
            return
        with self._mapped("put_blobs", thread_id), self._transaction(conn):
            conn.executemany(_PUT_BLOB, [(thread_id, k, v) for k, v in blobs.items()])

    # -- reads -----------------------------------------------------------------
    # Single statements in autocommit mode: each reads one consistent snapshot.

    def head(self, thread_id: str, namespace: str) -> Head | None:
        conn = self._conn()
        with self._mapped("head", thread_id):
            found = conn.execute(_HEAD, (thread_id, namespace)).fetchone()
        return Head(found[0], found[1]) if found is not None else None

    def head_row(self, thread_id: str, namespace: str) -> tuple[Head, CheckpointRow] | None:
        conn = self._conn()
        with self._mapped("head", thread_id):
            found = conn.execute(_HEAD_ROW, (thread_id, namespace)).fetchone()
        if found is None:
            return None
        checkpoint_id, version, parent_id, run_id, payload = found
        return Head(checkpoint_id, version), CheckpointRow(thread_id, namespace, checkpoint_id, parent_id, run_id, payload)

    def get(self, thread_id: str, namespace: str, checkpoint_id: str) -> CheckpointRow | None:
        conn = self._conn()
        with self._mapped("get", thread_id):
            found = conn.execute(_GET_ROW, (thread_id, namespace, checkpoint_id)).fetchone()
        if found is None:
            return None
        return CheckpointRow(thread_id, namespace, checkpoint_id, found[0], found[1], found[2])

    def list(
        self,
        thread_id: str,
        namespace: str,
        *,
        run_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[CheckpointRow]:
        conn = self._conn()
        params: builtins.list[object] = [thread_id, namespace]
        if run_id is not None:
            params.append(run_id)
        if before is not None:
            params.append(before)
        params.append(_sql_limit(limit))
        sql = _LIST[run_id is not None, before is not None]
        with self._mapped("list", thread_id):
            found = conn.execute(sql, params).fetchall()
        return [CheckpointRow(thread_id, namespace, *r) for r in found]

    def get_blobs(self, thread_id: str, keys: Sequence[str]) -> dict[str, bytes]:
        conn = self._conn()
        if not keys:
            return {}
        with self._mapped("get_blobs", thread_id):
            found = conn.execute(_GET_BLOBS, (thread_id, json.dumps(list(keys)))).fetchall()
        return dict(found)

    def scan_blobs(self, thread_id: str, start: str, stop: str) -> dict[str, bytes]:
        conn = self._conn()
        with self._mapped("scan_blobs", thread_id):
            found = conn.execute(_SCAN_BLOBS, (thread_id, start, stop)).fetchall()
        return dict(found)

    def threads(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[str]:
        conn = self._conn()
        end = _prefix_end(prefix)
        lower = after if after is not None else ""
        with self._mapped("threads"):
            found = conn.execute(_THREADS, (prefix, lower, end or "", _sql_limit(limit))).fetchall()
        return [r[0] for r in found]

    def namespaces(self, thread_id: str) -> builtins.list[str]:
        conn = self._conn()
        with self._mapped("namespaces", thread_id):
            found = conn.execute(_NAMESPACES, (thread_id,)).fetchall()
        return sorted(r[0] for r in found)

    # -- maintenance -------------------------------------------------------------

    def rewrite(
        self, thread_id: str, rows: Sequence[CheckpointRow], blobs: Mapping[str, bytes]
    ) -> None:
        conn = self._conn()
        if not rows and not blobs:
            return
        with self._mapped("rewrite", thread_id), self._transaction(conn):
            if rows:
                conn.executemany(
                    _REWRITE_ROW,
                    [(r.payload, thread_id, r.namespace, r.checkpoint_id) for r in rows],
                )
            if blobs:
                conn.executemany(_REWRITE_BLOB, [(v, thread_id, k) for k, v in blobs.items()])

    # -- deletion and lifecycle ------------------------------------------------

    def delete_thread(self, thread_id: str) -> bool:
        conn = self._conn()
        removed = 0
        with self._mapped("delete_thread", thread_id), self._transaction(conn):
            for sql in _DELETE:
                removed += conn.execute(sql, (thread_id,)).rowcount
        return removed > 0

    def close(self) -> None:
        """Close this process's connections. Idempotent; later calls raise StoreClosedError.

        A connection another live thread uses (a child run in a thread, an executor's
        worker) is not closed from here: closing it under a statement that thread is
        running crashed the interpreter (sqlite3 frees what the statement still reads).
        That thread closes it at its next call into the store, which raises
        StoreClosedError, or it goes with the thread (or with the store, when freed)."""
        self._closed = True
        self._close_watches()
        if self._pid != _pid:
            return  # a forked child never touches the parent's connections
        with self._lock:
            conns = list(self._conns.items())
            self._conns = weakref.WeakKeyDictionary()
        me = threading.current_thread()
        for conn, owner in conns:
            thread = owner()
            if thread is None or thread is me or not thread.is_alive():
                conn.close()


    # -- leases ------------------------------------------------------------------

    def write_fenced(
        self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int
    ) -> Head:
        return self.write(row, blobs, expected_version, fence)

    def _lease_lost(self, thread_id: str, namespace: str, fence: int) -> LeaseLostError:
        current = self.lease_get(thread_id, namespace)
        return LeaseLostError(
            thread_id=thread_id, namespace=namespace, token=fence, found=current.token if current else 0
        )

    def lease_get(self, thread_id: str, namespace: str) -> LeaseRecord | None:
        conn = self._conn()
        with self._mapped("reading the lease", thread_id):
            found = conn.execute(_LEASE_GET, (thread_id, namespace)).fetchone()
        return LeaseRecord(found[0], found[1], found[2]) if found is not None else None

    def lease_swap(self, thread_id: str, namespace: str, expected: int, token: int, data: bytes) -> bool:
        conn = self._conn()
        with self._mapped("swapping the lease", thread_id):
            if expected == 0:
                cur = conn.execute(_LEASE_CREATE, (thread_id, namespace, token, bytes(data)))
            else:
                cur = conn.execute(_LEASE_SWAP, (token, bytes(data), thread_id, namespace, expected))
        return cur.rowcount == 1

    def lease_list(self, *, prefix: str = "") -> builtins.list[tuple[str, str, LeaseRecord]]:
        conn = self._conn()
        with self._mapped("listing leases"):
            found = conn.execute(_LEASE_LIST, (prefix,)).fetchall()
        return [(t, ns, LeaseRecord(tok, data, v)) for t, ns, tok, data, v in found if t.startswith(prefix)]


def _rollback(conn: sqlite3.Connection, exc: BaseException) -> None:
    """Roll back after ``exc``; a failing ROLLBACK is noted on ``exc``, which stays the error."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as rollback_exc:
            # SQLite rolls back an unfinished transaction on close anyway.
            exc.add_note(f"(the ROLLBACK also failed: {rollback_exc})")


def _sql_limit(limit: int | None) -> int:
    """SQLite reads a negative LIMIT as "no limit"."""
    return -1 if limit is None else max(limit, 0)
