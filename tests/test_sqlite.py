"""SQLite-specific behaviour: URLs, pragmas, migrations, fork, processes, locks.

The protocol itself is checked for SQLite by tests/test_backend_conformance.py.
Cross-process tests start plain ``python`` subprocesses and release them at
once through their stdin (a start barrier), never with sleeps.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import persistkit as pk
from persistkit import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    SchemaVersionError,
)
from persistkit.backends import CheckpointRow, Head, open_backend
from persistkit.backends.sqlite import SCHEMA_VERSION, SQLiteBackend, _prefix_end


def _row(thread_id: str, i: int, parent: str | None = None) -> CheckpointRow:
    return CheckpointRow(thread_id, "", f"{i:08d}", parent, None, b"p%d" % i)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def backend(db: Path) -> Iterator[SQLiteBackend]:
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    yield b
    b.close()


def _pragma(b: SQLiteBackend, name: str) -> object:
    return b._conn().execute(f"PRAGMA {name}").fetchone()[0]


# -- URLs and options ----------------------------------------------------------


def test_relative_url_resolves_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "sub").mkdir(parents=True)
    b = SQLiteBackend.from_url("sqlite:///data/sub/agent.db")
    try:
        assert b.path == str(tmp_path / "data" / "sub" / "agent.db")
        assert (tmp_path / "data" / "sub" / "agent.db").exists()
        assert b.url == "sqlite:///data/sub/agent.db"
    finally:
        b.close()


def test_absolute_url(tmp_path: Path) -> None:
    path = tmp_path / "abs.db"
    b = open_backend(f"sqlite:///{path}")  # tmp_path is absolute: four slashes in all
    try:
        assert isinstance(b, SQLiteBackend) and b.path == str(path)
        assert path.exists()
    finally:
        b.close()


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_missing_directory_is_an_error_not_a_fresh_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """issue 18: a typo in a directory of the path created it and an empty store (the agent started over)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    pk.connect("sqlite:///data/agent.db").close()  # the real store
    typo = "sqlite:///dta/agent.db" if where == "relative" else f"sqlite:///{tmp_path}/dta/agent.db"
    with pytest.raises(pk.ConfigurationError) as err:
        pk.connect(typo)
    text = str(err.value)
    assert f"the directory {tmp_path / 'dta'} does not exist" in text and "nothing was created" in text, text
    assert "mkdir -p" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # nothing created


def test_only_the_default_directory_is_created_on_demand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERSISTKIT_URL", raising=False)
    store = pk.connect()  # sqlite:///.persistkit/persistkit.db, made on first use
    try:
        assert store.backend.path == str(tmp_path / ".persistkit" / "persistkit.db")
        assert (tmp_path / ".persistkit" / "persistkit.db").exists()
    finally:
        store.close()
    other = pk.connect("sqlite:///.persistkit/other.db")  # the default directory, another file
    other.close()
    with pytest.raises(pk.ConfigurationError, match="does not exist"):
        pk.connect("sqlite:///.persistkit/sub/agent.db")  # below it: not the default location


def test_options_from_query_and_keywords(db: Path) -> None:
    b = SQLiteBackend.from_url(f"sqlite:///{db}?synchronous=full&busy_timeout=123")
    assert (b.synchronous, b.busy_timeout) == ("FULL", 123)
    b.close()
    b = SQLiteBackend.from_url(f"sqlite:///{db}", synchronous="normal", busy_timeout=7)
    assert (b.synchronous, b.busy_timeout) == ("NORMAL", 7)
    b.close()
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    assert (b.synchronous, b.busy_timeout) == ("NORMAL", 5000)
    b.close()


@pytest.mark.parametrize(
    ("suffix", "kwargs", "needle"),
    [
        ("?journal=off", {}, "accepted: busy_timeout, synchronous"),
        ("", {"cache": 1}, "accepted: busy_timeout, synchronous"),
        ("?synchronous=OFF", {}, r"NORMAL \(default\) or FULL"),
        ("?busy_timeout=soon", {}, "milliseconds"),
        ("?busy_timeout=-1", {}, "milliseconds"),
        ("?busy_timeout=1&busy_timeout=2", {}, "given twice"),
    ],
)
def test_bad_options(db: Path, suffix: str, kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        SQLiteBackend.from_url(f"sqlite:///{db}{suffix}", **kwargs)


@pytest.mark.parametrize(
    "url", ["sqlite://host/x.db", "sqlite://", "sqlite:///", "sqlite:///:memory:"]
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteBackend.from_url(url)


# -- pragmas and schema ----------------------------------------------------------


def test_wal_and_synchronous_normal_by_default(backend: SQLiteBackend, db: Path) -> None:
    assert _pragma(backend, "journal_mode") == "wal"
    assert _pragma(backend, "synchronous") == 1  # NORMAL
    assert _pragma(backend, "busy_timeout") == 5000
    with sqlite3.connect(db) as raw:  # WAL is a property of the file, too
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_synchronous_full_applied_on_every_thread(db: Path) -> None:
    b = SQLiteBackend.from_url(f"sqlite:///{db}?synchronous=FULL")
    try:
        assert _pragma(b, "synchronous") == 2  # FULL
        seen: list[object] = []
        t = threading.Thread(target=lambda: seen.append(_pragma(b, "synchronous")))
        t.start()
        t.join()
        assert seen == [2]
    finally:
        b.close()


def test_migrations_are_idempotent(db: Path) -> None:
    for _ in range(3):
        b = SQLiteBackend.from_url(f"sqlite:///{db}")
        b.write(_row(f"t{_}", 1), {}, 0)
        b.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT key, value FROM pk_meta").fetchall() == [
            ("schema_version", SCHEMA_VERSION)
        ]
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"pk_meta", "pk_checkpoints", "pk_blobs", "pk_runs", "pk_leases"}
        assert raw.execute("SELECT count(*) FROM pk_checkpoints").fetchone()[0] == 3
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    try:
        assert b.threads() == ["t0", "t1", "t2"]
    finally:
        b.close()


def test_schema_1_file_upgrades_and_keeps_run_listing(db: Path) -> None:
    """A file written by schema 1 (a per-row run index, no pk_runs) opens, migrates and lists by run."""
    from persistkit.backends.sqlite import _MIGRATIONS

    with sqlite3.connect(db) as raw:
        for sql in _MIGRATIONS[0]:
            raw.execute(sql)
        raw.execute("CREATE TABLE pk_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID")
        raw.execute("INSERT INTO pk_meta VALUES ('schema_version', 1)")
        for i, run in enumerate(["r1", "r1", "r2", "r1"]):
            raw.execute(
                "INSERT INTO pk_checkpoints VALUES ('t', '', ?, ?, ?, x'01')",
                (f"{i:024x}", f"{i - 1:024x}" if i else None, run),
            )
        raw.execute("INSERT INTO pk_heads VALUES ('t', '', ?, 4)", (f"{3:024x}",))
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    try:
        assert [r.checkpoint_id[-1] for r in b.list("t", "", run_id="r1")] == ["3", "1", "0"]
        assert [r.checkpoint_id[-1] for r in b.list("t", "", run_id="r2")] == ["2"]
        assert b.list("t", "", run_id="nope") == []
        assert [r.checkpoint_id[-1] for r in b.list("t", "", run_id="r1", before=f"{3:024x}", limit=1)] == ["1"]
        b.write(CheckpointRow("t", "", f"{4:024x}", f"{3:024x}", "r3", b"\x01"), {}, 4)
        assert [r.checkpoint_id[-1] for r in b.list("t", "", run_id="r3")] == ["4"]
        # Schema 4's trigger took over the compare-and-swap from the old head row.
        assert b.head("t", "") == Head(f"{4:024x}", 5)
        with pytest.raises(ConflictError) as info:
            b.write(CheckpointRow("t", "", f"{5:024x}", f"{3:024x}", "r3", b"\x01"), {"x": b"y"}, 4)
        assert (info.value.expected, info.value.found) == (4, 5)
        assert b.get("t", "", f"{5:024x}") is None and b.get_blobs("t", ["x"]) == {}
    finally:
        b.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT value FROM pk_meta").fetchone()[0] == SCHEMA_VERSION
        indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "pk_checkpoints_run" not in indexes


def test_schema_3_file_upgrades_to_heads_from_rows(db: Path) -> None:
    """Schema 3 kept heads in pk_heads; 4 derives them from the newest versioned row."""
    from persistkit.backends.sqlite import _MIGRATIONS

    with sqlite3.connect(db, isolation_level=None) as raw:
        raw.execute("CREATE TABLE pk_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID")
        for statements in _MIGRATIONS[:3]:
            for sql in statements:
                raw.execute(sql)
        raw.execute("INSERT INTO pk_meta VALUES ('schema_version', 3)")
        ins = "INSERT INTO pk_checkpoints VALUES (?, '', ?, ?, 'r', x'01', ?)"
        for i in range(1, 4):  # "a": three rows written by schema 3 (they carry versions)
            raw.execute(ins, ("a", f"{i:024x}", f"{i - 1:024x}" if i > 1 else None, i))
        # "b": a schema-1 row under the head (no version), and a newer row the head
        # does not point at (an edited file): the head stays where pk_heads says.
        raw.execute("INSERT INTO pk_checkpoints VALUES ('b', '', ?, NULL, NULL, x'01', NULL)", (f"{1:024x}",))
        raw.execute("INSERT INTO pk_checkpoints VALUES ('b', '', ?, ?, NULL, x'01', NULL)", (f"{2:024x}", f"{1:024x}"))
        raw.execute("INSERT INTO pk_heads VALUES ('b', '', ?, 7)", (f"{1:024x}",))
        raw.execute("INSERT INTO pk_checkpoints VALUES ('b', '', ?, ?, NULL, x'01', NULL)", (f"{3:024x}", f"{1:024x}"))
        raw.execute("UPDATE pk_checkpoints SET version = 8 WHERE thread_id = 'b' AND checkpoint_id = ?", (f"{3:024x}",))
    b = SQLiteBackend.from_url(f"sqlite:///{db}")
    try:
        assert b.head("a", "") == Head(f"{3:024x}", 3)
        assert b.head("b", "") == Head(f"{1:024x}", 7)
        assert b.threads() == ["a", "b"]
        with pytest.raises(ConflictError) as info:
            b.write(CheckpointRow("a", "", f"{4:024x}", f"{3:024x}", "r", b"\x01"), {}, 2)
        assert (info.value.expected, info.value.found, info.value.found_checkpoint) == (2, 3, f"{3:024x}")
        assert b.write(CheckpointRow("a", "", f"{4:024x}", f"{3:024x}", "r", b"\x01"), {}, 3) == Head(f"{4:024x}", 4)
        assert b.head("a", "") == Head(f"{4:024x}", 4)
    finally:
        b.close()
    with sqlite3.connect(db) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "pk_heads" not in tables


def test_a_row_that_would_not_become_the_head_is_refused(backend: SQLiteBackend) -> None:
    backend.write(_row("t", 2), {}, 0)
    with pytest.raises(BackendError, match="does not sort after the thread's head"):
        backend.write(_row("t", 1), {"k": b"v"}, 1)
    assert backend.head("t", "") == Head(_row("t", 2).checkpoint_id, 1)
    assert backend.get("t", "", _row("t", 1).checkpoint_id) is None and backend.get_blobs("t", ["k"]) == {}


def test_threads_listing_seeks_one_row_per_thread(backend: SQLiteBackend) -> None:
    names = ["a", "a/1", "a/2", "ab", "b", "é", "\U0001f600"]
    for t in names:
        for i in range(1, 4):
            backend.write(_row(t, i), {}, i - 1)
    assert backend.threads() == sorted(names)
    assert backend.threads(prefix="a") == ["a", "a/1", "a/2", "ab"]
    assert backend.threads(prefix="a/") == ["a/1", "a/2"]
    assert backend.threads(prefix="a", after="a/1", limit=2) == ["a/2", "ab"]
    assert backend.threads(limit=0) == []
    assert backend.threads(after="\U0001f600") == []
    assert backend.threads(prefix="zz") == []
    backend.delete_thread("a/1")
    assert backend.threads(prefix="a") == ["a", "a/2", "ab"]


def test_newer_schema_refuses_to_open(db: Path) -> None:
    SQLiteBackend.from_url(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE pk_meta SET value = 99 WHERE key = 'schema_version'")
    with pytest.raises(SchemaVersionError, match="upgrade persistkit"):
        SQLiteBackend.from_url(f"sqlite:///{db}")


def test_prefix_end_skips_surrogates_and_carries() -> None:
    assert _prefix_end("") is None
    assert _prefix_end("ab") == "ac"
    assert _prefix_end("a\ud7ff") == "a\ue000"
    assert _prefix_end("a\U0010ffff") == "b"
    assert _prefix_end("\U0010ffff") is None


# -- error mapping ---------------------------------------------------------------


def test_write_lock_held_too_long_is_unavailable(db: Path) -> None:
    b = SQLiteBackend.from_url(f"sqlite:///{db}?busy_timeout=50")
    blocker = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(BackendUnavailableError, match="busy_timeout=50") as info:
            b.write(_row("t", 1), {"k": b"v"}, 0)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        with pytest.raises(BackendUnavailableError):
            b.put_blobs("t", {"k": b"v"})
        with pytest.raises(BackendUnavailableError):
            b.delete_thread("t")
        assert b.head("t", "") is None  # WAL: readers are not blocked by the writer
        blocker.execute("ROLLBACK")
        assert b.write(_row("t", 1), {"k": b"v"}, 0) == Head(f"{1:08d}", 1)
    finally:
        blocker.close()
        b.close()


def test_other_sqlite_errors_are_backend_errors_and_roll_back(backend: SQLiteBackend) -> None:
    backend.write(_row("t", 1), {}, 0)
    with pytest.raises(BackendError) as info:  # same checkpoint id twice: it cannot follow itself
        backend.write(_row("t", 1), {"orphan": b"x"}, 1)
    assert type(info.value) is BackendError
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert backend.head("t", "") == Head(f"{1:08d}", 1)  # the head move was rolled back
    assert backend.get_blobs("t", ["orphan"]) == {}
    assert backend.write(_row("t", 2), {}, 1) == Head(f"{2:08d}", 2)


# -- processes -------------------------------------------------------------------

_CHILD_PRELUDE = """
import sys
from persistkit import ConflictError
from persistkit.backends import CheckpointRow, open_backend
url, name = sys.argv[1], sys.argv[2]
print("ready", flush=True)
sys.stdin.readline()  # the start barrier: the parent releases every child at once
"""


def _run_children(script: str, args: list[list[str]]) -> None:
    """Start one child per argument list, release them together, require exit 0."""
    code = textwrap.dedent(_CHILD_PRELUDE) + textwrap.dedent(script)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *a],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a in args
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_processes_opening_a_fresh_file_at_once(db: Path) -> None:
    url = f"sqlite:///{db}"
    _run_children(
        """
        b = open_backend(url)
        b.write(CheckpointRow(name, "", "c1", None, None, b"x"), {"k": b"v"}, 0)
        b.close()
        """,
        [[url, f"proc-{i}"] for i in range(4)],
    )
    b = SQLiteBackend.from_url(url)
    try:
        assert b.threads(prefix="proc-") == [f"proc-{i}" for i in range(4)]
    finally:
        b.close()


def test_two_processes_racing_cas_lose_no_update(db: Path) -> None:
    url, per_writer = f"sqlite:///{db}", 40
    SQLiteBackend.from_url(url).close()  # schema in place; the race is about CAS
    _run_children(
        f"""
        b = open_backend(url)
        landed = 0
        while landed < {per_writer}:
            h = b.head("shared", "")
            v, parent = (h.version, h.checkpoint_id) if h else (0, None)
            row = CheckpointRow("shared", "", f"{{v + 1:08d}}-{{name}}", parent, name, b"p")
            try:
                b.write(row, {{}}, v)
                landed += 1
            except ConflictError:
                pass
        b.close()
        """,
        [[url, "a"], [url, "b"]],
    )
    b = SQLiteBackend.from_url(url)
    try:
        rows = b.list("shared", "")
        head = b.head("shared", "")
        assert head is not None and head.version == len(rows) == 2 * per_writer
        assert [int(r.checkpoint_id[:8]) for r in rows] == list(range(2 * per_writer, 0, -1))
        assert all(n.parent_id == o.checkpoint_id for n, o in itertools.pairwise(rows))
        assert sum(r.run_id == "a" for r in rows) == per_writer
    finally:
        b.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_writes_through_inherited_backend(backend: SQLiteBackend, db: Path) -> None:
    backend.write(_row("parent", 1), {}, 0)  # the parent's connection is open at fork
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            backend.write(_row("child", 1), {"k": b"from child"}, 0)
            backend.write(_row("parent", 2, f"{1:08d}"), {}, 1)
            backend.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.head("child", "") == Head(f"{1:08d}", 1)
    assert backend.get_blobs("child", ["k"]) == {"k": b"from child"}
    assert backend.write(_row("parent", 3, f"{2:08d}"), {}, 2) == Head(f"{3:08d}", 3)
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


_CLOSE_RACE = textwrap.dedent('''
    import sys, threading, time
    import persistkit as pk
    path, seconds = sys.argv[1], float(sys.argv[2])
    deadline, rounds, stopped = time.monotonic() + seconds, 0, 0
    while time.monotonic() < deadline:
        store = pk.connect(f"sqlite:///{path}/s{rounds}.db")
        stop, running = threading.Event(), threading.Barrier(4)
        def turns(i):
            global stopped
            running.wait()
            try:
                while not stop.is_set():
                    with pk.resume(f"t{i}", store=store) as run:
                        run.state["n"] = run.state.get("n", 0) + 1
            except pk.StoreClosedError:
                stopped += 1
        threads = [threading.Thread(target=turns, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        running.wait()
        time.sleep(0.01)
        store.close()  # while the three threads are mid-statement
        stop.set()
        for t in threads:
            t.join()
        rounds += 1
    print(rounds, stopped)
''')


def test_closing_the_store_while_other_threads_write_does_not_crash(tmp_path: Path) -> None:
    """``close()`` closed every thread's connection, under statements those threads were
    running: the interpreter crashed (a segmentation fault, in CI: a child run in a thread
    outlived its test's store). Now each thread closes its own at its next call, which
    raises StoreClosedError; the process survives a few hundred such closes."""
    proc = subprocess.run(
        [sys.executable, "-c", _CLOSE_RACE, str(tmp_path), "3"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    rounds, stopped = map(int, proc.stdout.split())
    assert rounds > 10 and stopped > 0, proc.stdout  # threads were running and were told
