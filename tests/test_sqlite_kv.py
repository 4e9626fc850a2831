"""SQLite-specific behaviour of the kv and watch capabilities (backends/_sqlite_kv.py).

The contract itself is checked for SQLite by tests/test_kv_conformance.py. Here: files
made before kv existed, the tables made on first kv use and no schema bump, the watch's
poll (another process; checkpoint commits give no hint) and its in-process push, lock
contention, and the watch_interval option. No sleeps as synchronization: waits are the
watch's own ``hints(timeout)``, which returns as soon as a hint is there.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from persistkit import BackendError, BackendUnavailableError, ConfigurationError, StoreClosedError
from persistkit._io import Call, call_sync
from persistkit._retry import set_testing
from persistkit.backends import CheckpointRow, open_backend
from persistkit.backends._protocol import KvEntry, KvHint, KvOp, KvWatch
from persistkit.backends.sqlite import _MIGRATIONS, SCHEMA_VERSION, SQLiteBackend

_KV_TABLES = {"pk_kv_versions", "pk_kv_heads"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def backend(db: Path) -> Iterator[SQLiteBackend]:
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    yield b
    b.close()


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as raw:
        return {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _collect(watch: KvWatch, want: set[tuple[str, int]], timeout: float = 10.0) -> set[tuple[str | None, int]]:
    """Hints until every (key, version) of ``want`` was seen or ``timeout`` seconds passed."""
    got: set[tuple[str | None, int]] = set()
    deadline = time.monotonic() + timeout
    while not want <= got and time.monotonic() < deadline:
        got |= {(h.key, h.version) for h in watch.hints(min(0.5, deadline - time.monotonic()))}
    return got


# -- files made before kv ---------------------------------------------------------


def _previous_release_file(db: Path) -> None:
    """A file as the release before kv left it: every migration, a checkpoint, a lease."""
    with sqlite3.connect(db, isolation_level=None) as raw:
        raw.execute("PRAGMA journal_mode = WAL")
        raw.execute("CREATE TABLE pk_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID")
        for statements in _MIGRATIONS:
            for sql in statements:
                raw.execute(sql)
        raw.execute("INSERT INTO pk_meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        raw.execute("INSERT INTO pk_checkpoints VALUES ('t', '', ?, NULL, 'r', x'01', 1)", (f"{1:024x}",))
        raw.execute("INSERT INTO pk_leases VALUES ('t', '', 3, x'00', 1)")
    raw.close()


def test_a_file_from_before_kv_is_used_for_kv_and_keeps_its_schema_version(db: Path) -> None:
    _previous_release_file(db)
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    try:
        # Reads on a file without the kv tables read nothing and create nothing.
        assert b.kv_get("s", "k") is None and b.kv_list("s") == [] and b.kv_history("s", "k") == []
        assert b.kv_drop("s") is False
        assert not _tables(db) & _KV_TABLES
        b.kv_write("s", [KvOp("k", 0, b"v1")], keep=2)  # the first write makes them
        assert _tables(db) >= _KV_TABLES
        b.kv_write("s", [KvOp("k", 1, b"v2")], keep=2)
        assert b.kv_history("s", "k") == [KvEntry("k", 2, b"v2"), KvEntry("k", 1, b"v1")]
        # The checkpoint data and the lease are as they were; the write path still works.
        head = b.head("t", "")
        assert head is not None and head.version == 1
        lease = b.lease_get("t", "")
        assert lease is not None and lease.token == 3
        b.write(CheckpointRow("t", "", f"{2:024x}", f"{1:024x}", "r", b"\x02"), {}, 1)
    finally:
        b.close()
    with sqlite3.connect(db) as raw:  # no schema bump: the previous release still opens the file
        assert raw.execute("SELECT value FROM pk_meta WHERE key = 'schema_version'").fetchone()[0] == SCHEMA_VERSION
    raw.close()
    again = SQLiteBackend.from_url(f"sqlite:///{db}")
    try:
        assert again.kv_get("s", "k") == KvEntry("k", 2, b"v2")
    finally:
        again.close()


def test_a_schema_1_file_upgrades_then_takes_kv_writes(db: Path) -> None:
    with sqlite3.connect(db, isolation_level=None) as raw:
        for sql in _MIGRATIONS[0]:
            raw.execute(sql)
        raw.execute("CREATE TABLE pk_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID")
        raw.execute("INSERT INTO pk_meta VALUES ('schema_version', 1)")
    raw.close()
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    try:
        b.kv_write("s", [KvOp("a", 0, b"1"), KvOp("b", 0, None)], keep=1)
        assert b.kv_list("s") == [KvEntry("a", 1, b"1")]
        assert b.kv_get("s", "b") == KvEntry("b", 1, None)
    finally:
        b.close()


def test_a_checkpoint_only_store_gets_no_kv_tables(backend: SQLiteBackend, db: Path) -> None:
    backend.write(CheckpointRow("t", "", f"{1:024x}", None, None, b"x"), {}, 0)
    assert backend.kv_list("anything") == []
    assert not _tables(db) & _KV_TABLES


def test_a_key_twice_in_one_batch_is_refused_and_nothing_is_written(backend: SQLiteBackend) -> None:
    with pytest.raises(ConfigurationError, match="appears twice"):
        backend.kv_write("s", [KvOp("k", 0, b"1"), KvOp("k", 1, b"2")], keep=1)
    assert backend.kv_get("s", "k") is None


# -- locks ----------------------------------------------------------------------------


def test_a_locked_database_is_unavailable_then_retried_like_checkpoint_writes(db: Path) -> None:
    b = SQLiteBackend.from_url(f"sqlite:///{db}?busy_timeout=50")
    b.kv_write("s", [KvOp("k", 0, b"v1")], keep=3)
    blocker = sqlite3.connect(db, isolation_level=None, timeout=0, check_same_thread=False)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(BackendUnavailableError, match="busy_timeout=50") as info:
            b.kv_write("s", [KvOp("k", 1, b"v2")], keep=3)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(BackendUnavailableError):
            b.kv_drop("s")
        # WAL: readers are not blocked by the writer, and the refused write left nothing.
        assert b.kv_get("s", "k") == KvEntry("k", 1, b"v1")
        assert [e.key for e in b.kv_list("s")] == ["k"]

        # The transient-failure loop that retries checkpoint writes (persistkit._io) retries
        # a kv write too: the first attempt meets the lock, which is then let go.
        attempts: list[int] = []
        real = b.kv_write

        def first_attempt_then_unlock(scope: str, ops: list[KvOp], *, keep: int) -> None:
            attempts.append(1)
            try:
                real(scope, ops, keep=keep)
            finally:
                if len(attempts) == 1:
                    blocker.execute("ROLLBACK")

        b.kv_write = first_attempt_then_unlock  # type: ignore[method-assign]
        set_testing(True)
        try:
            call_sync(b, Call("kv_write", ("s", [KvOp("k", 1, b"v2")]), {"keep": 3}))
        finally:
            set_testing(False)
        assert len(attempts) == 2
        assert b.kv_get("s", "k") == KvEntry("k", 2, b"v2")
    finally:
        blocker.close()
        b.close()


# -- watch ------------------------------------------------------------------------------


def test_another_process_write_is_hinted_by_key_and_version_and_checkpoints_are_not(db: Path) -> None:
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    watch = b.watch_open("s")
    code = (
        "import sys\n"
        "from persistkit.backends import CheckpointRow, open_backend\n"
        "from persistkit.backends._protocol import KvOp\n"
        "b = open_backend(sys.argv[1])\n"
        "b.write(CheckpointRow('t', '', '%024x' % 1, None, None, b'x'), {}, 0)\n"  # not a kv write
        "b.kv_write('elsewhere', [KvOp('k', 0, b'x')], keep=1)\n"  # another scope
        "b.kv_write('s', [KvOp('child', 0, b'1')], keep=1)\n"
        "b.kv_write('s', [KvOp('child', 1, b'2'), KvOp('other', 0, None)], keep=1)\n"
        "b.close()\n"
    )
    try:
        subprocess.run([sys.executable, "-c", code, f"sqlite:///{db}"], check=True, timeout=60)
        got = _collect(watch, {("child", 2), ("other", 1)})
        assert {("child", 2), ("other", 1)} <= got
        # Polled, not pushed: exact keys and versions, nothing of the other scope, no "list again".
        assert all(key in ("child", "other") for key, _ in got)
        assert watch.hints(0) == []
    finally:
        watch.close()
        b.close()


def test_this_process_writes_are_pushed_without_a_poll(db: Path, tmp_path: Path) -> None:
    """Writes of this process reach its watches through the in-process notifier, from the
    same instance and from another one opened by another path to the same file."""
    b = SQLiteBackend.from_url(f"sqlite:///{db}?watch_interval=60000")
    link = tmp_path / "link.db"
    b.kv_write("s", [KvOp("seed", 0, b"x")], keep=1)  # the file exists: link to it
    os.symlink(db, link)
    other = SQLiteBackend.from_url(f"sqlite:///{link}")
    watch = b.watch_open("s")
    real_poll = watch._poll  # type: ignore[attr-defined]
    watch._poll = list  # type: ignore[attr-defined]  # the file is never read: only pushes arrive
    try:
        b.kv_write("s", [KvOp("mine", 0, b"1")], keep=1)
        assert watch.hints(10) == [KvHint("mine", 1)]
        other.kv_write("s", [KvOp("theirs", 0, b"1"), KvOp("seed", 1, None)], keep=1)
        assert sorted(watch.hints(10), key=lambda h: h.key or "") == [KvHint("seed", 2), KvHint("theirs", 1)]
        other.kv_write("elsewhere", [KvOp("k", 0, b"1")], keep=1)
        assert watch.hints(0) == []
        # The poll sees the same writes in the file; what was pushed is not hinted twice.
        watch._poll = real_poll  # type: ignore[attr-defined]
        assert watch.hints(0) == []
    finally:
        watch.close()
        other.close()
        b.close()


def test_closing_the_store_closes_its_watches(backend: SQLiteBackend) -> None:
    watch = backend.watch_open("s")
    backend.close()
    with pytest.raises(StoreClosedError):
        watch.hints(0)


def test_a_failed_watch_connection_reopens_and_says_list_again(backend: SQLiteBackend) -> None:
    watch = backend.watch_open("s")
    try:
        watch._conn.close()  # type: ignore[attr-defined]  # as if the connection broke
        watch._take_pending = list  # type: ignore[attr-defined]  # no push: only the poll reports
        with pytest.raises(BackendError, match="watch on scope 's'") as info:
            watch.hints(0)
        assert type(info.value) is BackendError and isinstance(info.value.__cause__, sqlite3.Error)
        assert watch.hints(0) == [KvHint(None)]  # reopened: writes in between may have been missed
        backend.kv_write("s", [KvOp("k", 0, b"1")], keep=1)
        assert _collect(watch, {("k", 1)}) >= {("k", 1)}
    finally:
        watch.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_watch_and_a_store_inherited_by_a_forked_child(backend: SQLiteBackend) -> None:
    """The child's copy of a watch reopens its connection and says "list again"; the
    child writes through the inherited store; the parent's watch polls that write."""
    watch = backend.watch_open("s")
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if all went as documented
            ok = False
            try:
                ok = watch.hints(0) == [KvHint(None)]
                backend.kv_write("s", [KvOp("child", 0, b"1")], keep=1)
                ok = ok and watch.hints(5) == [KvHint("child", 1)]  # pushed in the child
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert ("child", 1) in _collect(watch, {("child", 1)})
    finally:
        watch.close()


@pytest.mark.parametrize("value", ["0", "-1", "x", "60001"])
def test_bad_watch_interval(db: Path, value: str) -> None:
    with pytest.raises(ConfigurationError, match="watch_interval"):
        open_backend(f"sqlite:///{db}?watch_interval={value}")


def test_watch_interval_option(db: Path) -> None:
    b = open_backend(f"sqlite:///{db}", watch_interval="2.5")
    try:
        assert isinstance(b, SQLiteBackend) and b.watch_interval == 2.5
    finally:
        b.close()
