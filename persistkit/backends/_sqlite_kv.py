"""The SQLite store's kv and watch capabilities: a mixin of :class:`~persistkit.backends.sqlite.SQLiteBackend`.

Tables
------
``pk_kv_versions (seq INTEGER PRIMARY KEY AUTOINCREMENT, scope, key, version, value)``
    Every kept version of every key, ``value`` NULL for a tombstone, unique on
    ``(scope, key, version)``. ``seq`` is the order of the writes: AUTOINCREMENT never
    hands out a number twice (not after a trim, not after ``kv_drop``), so a watch
    that remembers the last ``seq`` it read misses no write.
``pk_kv_heads (scope, key, version, seq, live)``, primary key ``(scope, key)``
    The latest version of each key and the ``seq`` of its row; ``live`` is 0 for a
    tombstone, so a listing skips deleted keys without reading their rows.

Both are plain TEXT columns in SQLite's default BINARY collation: keys compare as
their UTF-8 bytes, which is code-point order. A head table beside the versions
table, rather than the versions table alone, because of ``kv_list`` (what a board's
claims and listings read): measured on 500 keys x 10 kept versions, 5,000 writes
(SQLite 3.40, WAL, NORMAL), listing the 500 keys took 0.25 ms against 2.0-4.2 ms
(200 B values) and 1.2 ms against 10-12.6 ms (4 KB values), for 8-15% more per write
(43 -> 51 us, 65 -> 76 us: one more small WITHOUT ROWID page a commit). The value
is stored once, in the versions table.

Created on first kv use, not by a schema migration
--------------------------------------------------
The tables are made with ``CREATE TABLE IF NOT EXISTS`` by the first kv write or
watch on a file (a kv read on a file without them reads nothing and creates
nothing). The schema version (``sqlite.SCHEMA_VERSION``) stays where it is, because:
a store that never uses kv (most) gets no new tables and no write when it opens;
a file stays openable by the previous persistkit release, so processes of two
releases can share one file during an upgrade (a bumped version makes the older
one refuse the file with ``SchemaVersionError``); and the kv tables stand alone (no
trigger or row of the checkpoint tables refers to them), so there is nothing in an
older file to migrate. If they ever change shape, that change is a numbered
migration in ``sqlite.py`` that first creates them if they are missing.

The checkpoint ``write`` path is untouched: other tables, no trigger, nothing read.

Watch
-----
A watch owns a connection of its own and polls ``PRAGMA data_version`` on it every
``watch_interval`` milliseconds (a store option, default 5): the number moves when
any OTHER connection commits — another process, or another connection of this one
— and reading it touches no table. When it moved, one statement reads the keys of
the scope written since the last ``seq`` the watch read (a rowid range, so it costs
the writes since, not the table), and the hints carry key and version; a commit that
wrote no kv row of the scope (a checkpoint, another scope) gives no hint. Writes
made through this process's stores are also pushed at once by an in-process notifier
keyed by the database file's real path, so they do not wait for the next poll (the
poll would see them too; the watch drops the repeat). ``KvHint(None)`` ("list
again") comes after the watch's connection failed and was reopened, after a fork,
and when the file's write sequence went back (the file was replaced).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    StoreClosedError,
)
from ._protocol import Backend, KvEntry, KvHint, KvOp, KvWatch

__all__ = ["DEFAULT_WATCH_INTERVAL_MS", "SQLiteKv", "is_busy", "prefix_end", "watch_interval"]

#: How often a watch polls ``PRAGMA data_version`` by default (milliseconds).
DEFAULT_WATCH_INTERVAL_MS = 5.0

_CREATE = (
    """CREATE TABLE IF NOT EXISTS pk_kv_versions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        version INTEGER NOT NULL,
        value BLOB,
        UNIQUE (scope, key, version)
    )""",
    """CREATE TABLE IF NOT EXISTS pk_kv_heads (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        version INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        live INTEGER NOT NULL,
        PRIMARY KEY (scope, key)
    ) WITHOUT ROWID""",
)
_HAS_TABLES = """SELECT count(*) FROM sqlite_master
    WHERE type = 'table' AND name IN ('pk_kv_versions', 'pk_kv_heads')"""

_HEAD_VERSION = "SELECT version FROM pk_kv_heads WHERE scope = ? AND key = ?"
_PUT_VERSION = "INSERT INTO pk_kv_versions (scope, key, version, value) VALUES (?, ?, ?, ?)"
_PUT_HEAD = """INSERT INTO pk_kv_heads (scope, key, version, seq, live) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (scope, key) DO UPDATE
    SET version = excluded.version, seq = excluded.seq, live = excluded.live"""
_TRIM = "DELETE FROM pk_kv_versions WHERE scope = ? AND key = ? AND version <= ?"
_GET_LATEST = """SELECT v.version, v.value FROM pk_kv_heads h JOIN pk_kv_versions v ON v.seq = h.seq
    WHERE h.scope = ? AND h.key = ?"""
_GET_VERSION = "SELECT version, value FROM pk_kv_versions WHERE scope = ? AND key = ? AND version = ?"
_HISTORY = """SELECT version, value FROM pk_kv_versions
    WHERE scope = ? AND key = ? AND version < ? ORDER BY version DESC LIMIT ?"""
# (lower bound strict: after= decides it, bounded above: a prefix) -> SQL. One bound
# each way, so the primary key's range serves the scan; four constant statements.
_LIST: dict[tuple[bool, bool], str] = {
    (strict, upper): """SELECT h.key, h.version, v.value FROM pk_kv_heads h
        JOIN pk_kv_versions v ON v.seq = h.seq WHERE h.scope = ?1 AND h.key """
    + (">" if strict else ">=")
    + " ?2"
    + (" AND h.key < ?3" if upper else "")
    + " AND h.live ORDER BY h.key LIMIT ?4"
    for strict in (False, True)
    for upper in (False, True)
}
_DROP = (
    "DELETE FROM pk_kv_heads WHERE scope = ?",
    "DELETE FROM pk_kv_versions WHERE scope = ?",
)
_TOP_SEQ = "SELECT seq FROM sqlite_sequence WHERE name = 'pk_kv_versions'"
# The writes since the last poll by a range of the rowid (seq): what it costs is the
# writes since, of every scope. "+scope" keeps the planner off the (scope, key,
# version) index, whose scan would cost the whole scope on every poll.
_CHANGED = """SELECT key, max(version) FROM pk_kv_versions
    WHERE seq > ?1 AND seq <= ?2 AND +scope = ?3 GROUP BY key"""
_NO_BEFORE = 2**63 - 1

# database file (real path) -> scope -> the watches open on it in this process
_WATCHES: dict[str, dict[str, weakref.WeakSet[_SQLiteWatch]]] = {}
_WATCHES_LOCK = threading.Lock()


def _forked() -> None:
    # Another thread of the parent may have held the lock at the fork: the child starts
    # with a fresh one. (A child's copy of a watch reopens its connection: _SQLiteWatch._poll.)
    global _WATCHES_LOCK
    _WATCHES_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forked)
# Watch connections inherited by a forked child: never used nor closed there (see
# sqlite._FORK_ORPHANS); kept referenced so the garbage collector does not close them.
_FORK_ORPHANS: list[sqlite3.Connection] = []


class SQLiteKv(Backend):
    """The kv primitives and ``watch_open`` of the SQLite store (see the module docstring)."""

    _kv_ready = False  # True once this instance saw the kv tables in the file

    if TYPE_CHECKING:  # provided by SQLiteBackend
        path: str
        busy_timeout: int
        watch_interval: float

        def _conn(self) -> sqlite3.Connection: ...

        def _mapped(self, op: str, thread_id: str | None = None) -> contextlib.AbstractContextManager[None]: ...

        @staticmethod
        def _transaction(conn: sqlite3.Connection) -> contextlib.AbstractContextManager[None]: ...

    def _kv_conn(self, create: bool) -> sqlite3.Connection | None:
        """This thread's connection once the kv tables exist; creates them when
        ``create``, else None when they do not exist (nothing was ever written)."""
        conn = self._conn()
        if self._kv_ready:
            return conn
        with self._mapped("creating the kv tables"):
            if conn.execute(_HAS_TABLES).fetchone()[0] < len(_CREATE):
                if not create:
                    return None
                with self._transaction(conn):
                    for sql in _CREATE:
                        conn.execute(sql)
        self._kv_ready = True
        return conn

    def kv_get(self, scope: str, key: str, version: int | None = None) -> KvEntry | None:
        conn = self._kv_conn(create=False)
        if conn is None:
            return None
        with self._mapped(f"kv_get on scope {scope!r}"):
            if version is None:
                found = conn.execute(_GET_LATEST, (scope, key)).fetchone()
            else:
                found = conn.execute(_GET_VERSION, (scope, key, version)).fetchone()
        return KvEntry(key, found[0], found[1]) if found is not None else None

    def kv_history(
        self, scope: str, key: str, *, before: int | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        conn = self._kv_conn(create=False)
        if conn is None:
            return []
        params = (scope, key, _NO_BEFORE if before is None else before, -1 if limit is None else max(limit, 0))
        with self._mapped(f"kv_history on scope {scope!r}"):
            found = conn.execute(_HISTORY, params).fetchall()
        return [KvEntry(key, v, value) for v, value in found]

    def kv_list(
        self, scope: str, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> builtins.list[KvEntry]:
        conn = self._kv_conn(create=False)
        if conn is None:
            return []
        strict = after is not None and after >= prefix
        lower = after if after is not None and strict else prefix
        end = prefix_end(prefix)
        params = (scope, lower, end, -1 if limit is None else max(limit, 0))
        with self._mapped(f"kv_list on scope {scope!r}"):
            found = conn.execute(_LIST[strict, end is not None], params).fetchall()
        return [KvEntry(k, v, value) for k, v, value in found]

    def kv_write(self, scope: str, ops: Sequence[KvOp], *, keep: int) -> None:
        if len({op.key for op in ops}) != len(ops):
            raise ConfigurationError(
                f"kv_write on scope {scope!r}: a key appears twice in one batch; give each key once"
            )
        if not ops:
            self._conn()  # a closed store refuses even an empty batch
            return
        conn = self._kv_conn(create=True)
        assert conn is not None
        keep = max(keep, 1)
        rows = [(op.key, op.expected + 1, None if op.value is None else bytes(op.value)) for op in ops]
        # BEGIN IMMEDIATE: the write lock before the versions are read, so two writers
        # queue on busy_timeout and the check and the writes are one snapshot.
        with self._mapped(f"kv_write on scope {scope!r}"), self._transaction(conn):
            for op in ops:
                found = conn.execute(_HEAD_VERSION, (scope, op.key)).fetchone()
                latest = found[0] if found is not None else 0
                if latest != op.expected:
                    raise ConflictError(key=op.key, namespace=scope, expected=op.expected, found=latest)
            for key, version, value in rows:
                seq = conn.execute(_PUT_VERSION, (scope, key, version, value)).lastrowid
                conn.execute(_PUT_HEAD, (scope, key, version, seq, value is not None))
                if version > keep:
                    conn.execute(_TRIM, (scope, key, version - keep))
        if _WATCHES:  # a watch is open in this process: push the hints now, not at its next poll
            _notify(self._kv_file(), scope, [KvHint(key, version) for key, version, _ in rows])

    def kv_drop(self, scope: str) -> bool:
        conn = self._kv_conn(create=False)
        if conn is None:
            return False
        with self._mapped(f"kv_drop on scope {scope!r}"), self._transaction(conn):
            removed = conn.execute(_DROP[0], (scope,)).rowcount
            conn.execute(_DROP[1], (scope,))
        return removed > 0

    def watch_open(self, scope: str) -> KvWatch:
        self._kv_conn(create=True)  # the sequence the watch starts from exists from here on
        watch = _SQLiteWatch(self, scope)
        with _WATCHES_LOCK:
            _WATCHES.setdefault(watch.file, {}).setdefault(scope, weakref.WeakSet()).add(watch)
            self._kv_watches().add(watch)
        return watch

    def _kv_file(self) -> str:
        """The database file's real path: what watches of this process are keyed by (a
        symlinked or relative path to the same file finds the same watches)."""
        file: str | None = self.__dict__.get("_kv_realpath")
        if file is None:
            file = self.__dict__["_kv_realpath"] = os.path.realpath(self.path)
        return file

    def _kv_watches(self) -> weakref.WeakSet[_SQLiteWatch]:
        watches: weakref.WeakSet[_SQLiteWatch] | None = self.__dict__.get("_watches")
        if watches is None:
            watches = self.__dict__["_watches"] = weakref.WeakSet()
        return watches

    def _close_watches(self) -> None:
        """Close the watches this instance opened (the store is closing)."""
        with _WATCHES_LOCK:
            watches = list(self._kv_watches())
        for w in watches:
            w.close()


class _SQLiteWatch(KvWatch):
    """Hints of one scope: pushed by this process's writers, polled from the file for the rest."""

    def __init__(self, backend: SQLiteKv, scope: str) -> None:
        self._backend = backend
        self._scope = scope
        self.file = backend._kv_file()
        self._interval = backend.watch_interval / 1000
        self._ready = threading.Condition()  # guards _pending, _delivered, _closed
        self._pending: dict[str, int] = {}  # pushed by this process's writers, not yet returned
        self._delivered: dict[str, int] = {}  # returned from a push: the poll drops the repeat
        self._closed = False
        self._poll_lock = threading.Lock()  # one poll at a time on the connection
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._data_version = 0
        self._seq = 0
        self._connect()

    def _connect(self) -> None:
        """Open the watch's own connection; the writes it reports start from now."""
        where = f"a watch on scope {self._scope!r} of sqlite store {self._backend.path!r}"
        try:
            conn = sqlite3.connect(
                self._backend.path,
                timeout=self._backend.busy_timeout / 1000,
                isolation_level=None,
                check_same_thread=False,  # hints() runs on whichever thread asks (ahints: a worker)
            )
            try:
                self._data_version = conn.execute("PRAGMA data_version").fetchone()[0]
                top = conn.execute(_TOP_SEQ).fetchone()
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as exc:
            raise _watch_error(exc, where) from exc
        self._seq = top[0] if top is not None else 0
        self._conn = conn
        self._pid = os.getpid()

    def notify(self, hints: builtins.list[KvHint]) -> None:
        """A write of this process committed (called by kv_write after COMMIT)."""
        with self._ready:
            for h in hints:
                if h.key is not None and h.version > self._pending.get(h.key, 0):
                    self._pending[h.key] = h.version
            self._ready.notify_all()

    def hints(self, timeout: float) -> builtins.list[KvHint]:
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._ready:
            if self._closed:
                raise StoreClosedError(
                    f"this watch on scope {self._scope!r} of {self._backend.url!r} was closed; open a new one"
                )
        while True:
            found = self._take_pending() or self._poll()
            if found:
                return found
            left = deadline - time.monotonic()
            with self._ready:
                if self._closed or left <= 0:
                    return []
                if not self._pending:
                    self._ready.wait(min(self._interval, left))

    def _take_pending(self) -> builtins.list[KvHint]:
        with self._ready:
            if not self._pending:
                return []
            if len(self._delivered) > 4096:  # bounded: the worst case is one repeated hint
                self._delivered.clear()
            for k, v in self._pending.items():
                self._delivered[k] = max(v, self._delivered.get(k, 0))
            found = [KvHint(k, v) for k, v in self._pending.items()]
            self._pending.clear()
            return found

    def _poll(self) -> builtins.list[KvHint]:
        """The writes of the scope committed since the last poll, if the file moved."""
        with self._poll_lock:
            if self._closed:
                return []
            if self._conn is None or self._pid != os.getpid():
                if self._conn is not None:  # inherited across fork: the parent's (see _FORK_ORPHANS)
                    _FORK_ORPHANS.append(self._conn)
                self._conn = None
                self._connect()
                return [KvHint(None)]  # writes between the old connection and this one were not seen
            conn = self._conn
            try:
                moved = conn.execute("PRAGMA data_version").fetchone()[0]
                if moved == self._data_version:
                    return []
                top_row = conn.execute(_TOP_SEQ).fetchone()
                top = top_row[0] if top_row is not None else 0
                if top < self._seq:  # the sequence went back: the file was replaced
                    self._data_version, self._seq = moved, top
                    return [KvHint(None)]
                changed = conn.execute(_CHANGED, (self._seq, top, self._scope)).fetchall()
            except sqlite3.Error as exc:
                if is_busy(exc):
                    return []  # a reader waits on WAL recovery only; the next poll reads it
                self._conn = None  # reopened by the next call, which hints "list again"
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                raise _watch_error(exc, f"a watch on scope {self._scope!r} of sqlite store {self._backend.path!r}") from exc
            self._data_version, self._seq = moved, top
        with self._ready:
            return [KvHint(k, v) for k, v in changed if v > self._delivered.get(k, 0)]

    def close(self) -> None:
        with self._ready:
            if self._closed:
                return
            self._closed = True
            self._ready.notify_all()
        with _WATCHES_LOCK:  # and forget emptied entries: kv_write skips the push when none is left
            scopes = _WATCHES.get(self.file, {})
            watches = scopes.get(self._scope)
            if watches is not None:
                watches.discard(self)
                if not watches:
                    del scopes[self._scope]
            if not scopes:
                _WATCHES.pop(self.file, None)
        with self._poll_lock:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                conn.close()


def _notify(file: str, scope: str, hints: builtins.list[KvHint]) -> None:
    """Push ``hints`` to this process's watches of ``scope`` on ``file`` (a real path)."""
    with _WATCHES_LOCK:
        watches = list(_WATCHES.get(file, {}).get(scope, ()))
    for w in watches:
        w.notify(hints)


def _watch_error(exc: sqlite3.Error, where: str) -> BackendError:
    if is_busy(exc):
        return BackendUnavailableError(f"{where}: the database stayed locked ({exc}); retry")
    return BackendError(f"{where} failed: {exc}")


def watch_interval(given: Mapping[str, Any], url: str) -> float:
    """The ``watch_interval`` option (milliseconds between polls of a watch), checked."""
    raw = given.get("watch_interval", DEFAULT_WATCH_INTERVAL_MS)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(raw, bool) or not 0 < value <= 60_000:
        raise ConfigurationError(
            f"watch_interval={raw!r} in {url!r}: give milliseconds between a watch's polls, "
            f"above 0 and at most 60000 (default {DEFAULT_WATCH_INTERVAL_MS:g})"
        )
    return value


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is lock contention ("database is locked"), which a retry may get past."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return True
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``
    (code-point order, which is SQLite's BINARY order of UTF-8), or None if unbounded."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code <= 0x10FFFF:
            if 0xD800 <= code <= 0xDFFF:  # surrogates cannot be encoded; skip over them
                code = 0xE000
            return "".join(chars) + chr(code)
    return None
