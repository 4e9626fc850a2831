"""PostgreSQL kv and watch beyond the shipped suites: a killed LISTEN connection, no hint
for a rolled-back write, the payload's "re-list" fallback, and row-level security with a
real per-agent database role."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

psycopg = pytest.importorskip("psycopg")

from persistkit import (  # noqa: E402
    AccessDeniedError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    StoreClosedError,
)
from persistkit.backends._postgres_kv import AsyncPgWatch, PgWatch  # noqa: E402
from persistkit.backends._postgres_kv_sql import glob_of, hint_of, like_pattern  # noqa: E402
from persistkit.backends._protocol import KvEntry, KvHint, KvOp, KvWatch  # noqa: E402
from persistkit.backends.postgres import (  # noqa: E402
    PostgresBackend,
    grant_board_access,
    revoke_board_access,
)


def _tag() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"pkkv_{_tag()}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def admin(postgres_url: str) -> Iterator[Any]:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def url(postgres_url: str, schema: str) -> str:
    return f"{postgres_url}?schema={schema}"


@pytest.fixture
def store(url: str) -> Iterator[PostgresBackend]:
    b = PostgresBackend.from_url(url)
    yield b
    b.close()


def _kill_listener(admin: Any, watch: KvWatch) -> int:
    assert isinstance(watch, PgWatch | AsyncPgWatch)
    killed = admin.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = %s",
        (f'LISTEN "{watch.channel}"',),
    ).fetchone()[0]
    return int(killed)


def _until(watch: KvWatch, key: str) -> list[KvHint]:
    """Every hint up to and including the one of ``key`` (at most 20 waits of 0.5 s)."""
    seen: list[KvHint] = []
    for _ in range(20):
        seen += watch.hints(0.5)
        if any(h.key == key for h in seen):
            return seen
    raise AssertionError(f"no hint of {key!r}; got {seen}")


# -- watch --------------------------------------------------------------------------


def test_killed_listen_connection_reconnects_and_misses_nothing(store: PostgresBackend, admin: Any) -> None:
    scope = f"s_{_tag()}"
    watch = store.watch_open(scope)
    try:
        store.kv_write(scope, [KvOp("before", 0, b"1")], keep=1)
        assert KvHint("before", 1) in _until(watch, "before")
        assert _kill_listener(admin, watch) == 1
        store.kv_write(scope, [KvOp("while-down", 0, b"1")], keep=1)  # its hint is lost with the session
        # The next call notices, reconnects, LISTENs again and says "re-list".
        assert watch.hints(10) == [KvHint(None)]
        assert [e.key for e in store.kv_list(scope)] == ["before", "while-down"]  # the re-list finds it
        store.kv_write(scope, [KvOp("after", 0, b"1"), KvOp("before", 1, b"2")], keep=1)
        later = _until(watch, "after")
        assert KvHint("after", 1) in later and KvHint("before", 2) in later
    finally:
        watch.close()


def test_killed_listen_connection_async(store: PostgresBackend, admin: Any) -> None:
    scope = f"s_{_tag()}"

    async def go() -> None:
        watch = await store.awatch_open(scope)
        assert isinstance(watch, AsyncPgWatch)  # native: its own AsyncConnection
        try:
            with pytest.raises(ConfigurationError, match="ahints"):
                watch.hints(0)
            await store.akv_write(scope, [KvOp("a", 0, b"1")], keep=1)
            got: list[KvHint] = []
            for _ in range(20):
                got += await watch.ahints(0.5)
                if KvHint("a", 1) in got:
                    break
            assert KvHint("a", 1) in got
            assert _kill_listener(admin, watch) == 1
            assert await watch.ahints(10) == [KvHint(None)]
            await store.akv_write(scope, [KvOp("b", 0, b"1")], keep=1)
            got = []
            for _ in range(20):
                got += await watch.ahints(0.5)
                if KvHint("b", 1) in got:
                    break
            assert KvHint("b", 1) in got
        finally:
            await watch.aclose()
            await watch.aclose()  # idempotent

    asyncio.run(go())


def test_rolled_back_write_sends_no_hint(store: PostgresBackend) -> None:
    scope = f"s_{_tag()}"
    watch = store.watch_open(scope)
    try:
        store.kv_write(scope, [KvOp("taken", 0, b"1")], keep=1)
        _until(watch, "taken")
        # "fresh" would be created, but "taken" conflicts: the transaction rolls back,
        # and its queued notification of "fresh" goes with it.
        with pytest.raises(ConflictError) as info:
            store.kv_write(scope, [KvOp("fresh", 0, b"1"), KvOp("taken", 0, b"2")], keep=1)
        assert (info.value.key, info.value.found) == ("taken", 1)
        assert store.kv_get(scope, "fresh") is None
        store.kv_write(scope, [KvOp("marker", 0, b"1")], keep=1)
        # Notifications arrive in commit order: had "fresh" been sent, it came before "marker".
        assert all(h.key != "fresh" for h in _until(watch, "marker"))
    finally:
        watch.close()


def test_a_key_too_long_for_a_payload_is_hinted_as_relist(store: PostgresBackend) -> None:
    scope = f"s_{_tag()}"
    long_key = "\U0001f99c" * 1800  # 7200 bytes of UTF-8: over the payload's budget for a key
    watch = store.watch_open(scope)
    try:
        store.kv_write(scope, [KvOp(long_key, 0, b"1"), KvOp("short", 0, b"1")], keep=1)
        seen = _until(watch, "short")
        assert KvHint(None) in seen and all(h.key != long_key for h in seen)
        assert store.kv_get(scope, long_key) == KvEntry(long_key, 1, b"1")
    finally:
        watch.close()


def test_payloads_and_patterns() -> None:
    assert hint_of("s1 7 a b/c", "s1") == KvHint("a b/c", 7)
    assert hint_of("s1", "s1") == KvHint(None)
    assert hint_of("s2 7 a", "s1") is None
    assert like_pattern("research/*") == "research/%"
    assert like_pattern("a_b%c\\*") == "a\\_b\\%c\\\\%"
    for glob in ("research/*", "a_b%c\\*", "x"):
        assert glob_of(like_pattern(glob)) == glob


def test_killed_store_connection_kv_write_is_unavailable_then_resolves(
    url: str, admin: Any
) -> None:
    """A kv write on a killed connection fails as unavailable (never retried: its outcome
    is unknown) or succeeds; reading the key resolves it, and the batch is whole either way."""
    app = f"pkkvfault_{_tag()}"
    b = PostgresBackend.from_url(f"{url}&application_name={app}")
    scope = f"s_{_tag()}"
    try:
        unavailable = 0
        for n in range(12):
            if n % 3 == 0:
                b.kv_get(scope, "a")  # the store holds a connection to kill
                assert admin.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (app,),
                ).fetchone()[0] >= 1
            ops = [KvOp("a", n, b"%d" % (n + 1)), KvOp("b", n, b"%d" % (n + 1))]
            try:
                b.kv_write(scope, ops, keep=2)
            except BackendUnavailableError:
                unavailable += 1
                a, c = b.kv_get(scope, "a"), b.kv_get(scope, "b")  # reads retry by themselves
                assert (a.version if a else 0) == (c.version if c else 0) == n
                b.kv_write(scope, ops, keep=2)
        assert [(e.key, e.version) for e in b.kv_list(scope)] == [("a", 12), ("b", 12)]
        assert unavailable >= 1  # the fault path ran
        b.kv_drop(scope)
    finally:
        b.close()


def test_closed_store_and_watch(url: str) -> None:
    b = PostgresBackend.from_url(url)
    watch = b.watch_open("s")
    watch.close()
    with pytest.raises(StoreClosedError):
        watch.hints(0)
    b.close()
    with pytest.raises(StoreClosedError):
        b.kv_get("s", "k")
    with pytest.raises(StoreClosedError):
        b.watch_open("s")


# -- row-level security with a real role --------------------------------------------


@pytest.fixture
def role(admin: Any) -> Iterator[str]:
    name = f"pk_agent_{_tag()}"
    admin.execute(f'CREATE ROLE "{name}" LOGIN')
    yield name
    admin.execute(f'DROP OWNED BY "{name}"')  # its privileges on the schema's tables
    admin.execute(f'DROP ROLE "{name}"')


def _as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


def test_row_level_security_enforces_grants_for_an_agent_role(
    store: PostgresBackend, url: str, role: str
) -> None:
    board = f"b_{_tag()}"
    store.kv_write(
        board,
        [KvOp("research/a", 0, b"r"), KvOp("secret/x", 0, b"s"), KvOp("output/agent/r", 0, b"o")],
        keep=5,
    )
    grant_board_access(url, role, board=board, read=["research/*"], write=["output/agent/*"])
    agent = PostgresBackend.from_url(_as_role(url, role))
    try:
        # Reads outside the grants see nothing.
        assert agent.kv_get(board, "secret/x") is None
        assert agent.kv_history(board, "secret/x") == []
        assert [e.key for e in agent.kv_list(board)] == ["output/agent/r", "research/a"]
        assert agent.kv_get(board, "research/a") == KvEntry("research/a", 1, b"r")
        # Writes outside are refused by the database, naming the key; nothing of the batch lands.
        with pytest.raises(AccessDeniedError) as info:
            agent.kv_write(board, [KvOp("secret/new", 0, b"x")], keep=5)
        assert (info.value.key, info.value.operation) == ("secret/new", "write")
        with pytest.raises(AccessDeniedError) as info:
            agent.kv_write(board, [KvOp("research/a", 1, b"x")], keep=5)  # readable, not writable
        assert info.value.key == "research/a"
        with pytest.raises(AccessDeniedError) as info:
            agent.kv_write(board, [KvOp("output/agent/ok", 0, b"x"), KvOp("zzz", 0, b"x")], keep=5)
        assert info.value.key == "zzz" and "'output/agent/*'" in str(info.value)  # its grants, as globs
        assert store.kv_get(board, "output/agent/ok") is None
        # A key it cannot see is version 0 to it: changing it is a conflict, not a leak.
        with pytest.raises(ConflictError):
            agent.kv_write(board, [KvOp("secret/x", 1, b"x")], keep=5)
        # Writes inside work, and the owner sees them.
        agent.kv_write(board, [KvOp("output/agent/r", 1, b"o2"), KvOp("output/agent/new", 0, b"n")], keep=5)
        assert store.kv_get(board, "output/agent/r") == KvEntry("output/agent/r", 2, b"o2")
        assert store.kv_get(board, "secret/x") == KvEntry("secret/x", 1, b"s")  # untouched
        # Dropping the board as the agent removes only what it may write.
        agent.kv_drop(board)
        assert [e.key for e in store.kv_list(board)] == ["research/a", "secret/x"]
        # Another board: no grant, nothing visible.
        other = f"b_{_tag()}"
        store.kv_write(other, [KvOp("research/a", 0, b"r")], keep=1)
        assert agent.kv_get(other, "research/a") is None
        store.kv_drop(other)
    finally:
        agent.close()
    revoke_board_access(url, role, board=board)
    agent = PostgresBackend.from_url(_as_role(url, role), migrate=False)
    try:
        with pytest.raises(AccessDeniedError):  # no privilege on the tables any more
            agent.kv_get(board, "research/a")
    finally:
        agent.close()
    store.kv_drop(board)


def test_a_board_delete_or_claim_outside_the_role_grants_is_refused_not_silent(url: str, role: str) -> None:
    """issue 34: put outside the grants raised AccessDeniedError, but delete returned False
    and claim None (rows outside the grants are invisible to the role): both raise now, and
    a key or item that is simply not there (inside the grants) still gives False / None."""
    import persistkit as pk

    board_name = f"b_{_tag()}"
    with pk.connect(url) as owner:
        owner_board = owner.board(board_name)
        owner_board.put("secret/x", "s")
        owner_board.put("tasks/open/1", "t")
    grant_board_access(url, role, board=board_name, read=["research/*"], write=["output/*", "mine/*"])
    with pk.connect(_as_role(url, role)) as agent:
        board = agent.board(board_name)
        with pytest.raises(AccessDeniedError) as info:
            board.delete("secret/x")
        assert (info.value.key, info.value.operation) == ("secret/x", "delete")
        assert "'output/*'" in str(info.value) and "grant_board_access" in str(info.value)
        with pytest.raises(AccessDeniedError) as info:
            board.claim("tasks/", "worker-1")
        assert (info.value.key, info.value.operation) == ("tasks/*", "claim")
        assert board.delete("output/never-written") is False  # inside its grants: simply absent
        assert board.claim("mine/", "worker-1") is None
        assert board.claim("m", "worker-1") is None  # a prefix some granted keys start with

        async def async_side() -> None:
            with pytest.raises(AccessDeniedError):
                await board.adelete("secret/x")
            with pytest.raises(AccessDeniedError):
                await board.aclaim("tasks/", "worker-1")

        asyncio.run(async_side())
    with pk.connect(url) as owner:
        assert owner.board(board_name).value("secret/x") == "s"  # untouched
        owner.board(board_name).clear()


@pytest.mark.parametrize(
    ("glob", "key", "prefix", "covered"),
    [("output/*", "output/a", False, True), ("output/*", "secret", False, False), ("output/*", "out", True, True),
     ("output/*", "output/x/y", True, True), ("a*z", "abc", True, True), ("a*z", "b", True, False),
     ("one/key", "one/", True, True), ("one/key", "one/key2", True, False), ("50%_off/*", "50%_off/x", False, True)],
)
def test_covers_is_the_grant_glob_match(glob: str, key: str, prefix: bool, covered: bool) -> None:
    from persistkit.backends._postgres_kv_sql import covers

    assert covers(like_pattern(glob), key, prefix=prefix) is covered


def test_grant_refuses_bad_input(url: str) -> None:
    with pytest.raises(ConfigurationError, match="board"):
        grant_board_access(url, "someone", board="no spaces", read=["a/*"])
    with pytest.raises(ConfigurationError, match="pattern"):
        grant_board_access(url, "someone", board="b", read=[""])
    with pytest.raises(ConfigurationError, match="existing role"):
        grant_board_access(url, f"missing_{_tag()}", board="b", read=["a/*"])
