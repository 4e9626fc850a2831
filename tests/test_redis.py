"""Redis-specific tests: URL options, key layout, TTL, user clients, faults, many writers.

The protocol itself is covered by the conformance suite (tests/test_backend_conformance.py);
these tests check what only Redis has. Each test uses its own key prefix and
deletes its keys at the end; nothing here flushes the shared server.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import multiprocessing
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from persistkit import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    StoreClosedError,
)
from persistkit.backends import CheckpointRow, Head, open_backend

pytest.importorskip("redis")
import redis
import redis.asyncio
import redis.connection
from redis.crc import key_slot

from persistkit.backends import _redis_ops
from persistkit.backends.redis import RedisBackend


def _row(
    t: str, i: int, *, ns: str = "", parent: str | None = None, run: str | None = None
) -> CheckpointRow:
    return CheckpointRow(t, ns, f"{i:08d}", parent, run, f"payload {i}".encode())


@pytest.fixture
def admin(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def prefix(admin: Any) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    p = f"pktest:redis-{uuid.uuid4().hex[:12]}:"
    yield p
    keys = list(admin.scan_iter(match=p + "*", count=1000))
    if keys:
        admin.delete(*keys)


@pytest.fixture
def backend(redis_url: str, prefix: str) -> Iterator[RedisBackend]:
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}")
    yield b
    b.close()


def _keys(admin: Any, prefix: str) -> list[bytes]:
    return sorted(admin.scan_iter(match=prefix + "*", count=1000))


def _snapshot(admin: Any, prefix: str) -> dict[bytes, object]:
    """Every key under ``prefix`` with its full contents."""
    out: dict[bytes, object] = {}
    for key in _keys(admin, prefix):
        kind = admin.type(key)
        if kind == b"hash":
            out[key] = admin.hgetall(key)
        elif kind == b"zset":
            out[key] = admin.zrange(key, 0, -1)
        elif kind == b"set":
            out[key] = admin.smembers(key)
        else:
            out[key] = admin.dump(key)
    return out


# -- URL and options -------------------------------------------------------------------


def test_url_options_are_ours_and_the_rest_goes_to_redis_py(redis_url: str) -> None:
    b = open_backend(f"{redis_url}?volatile=true&prefix=app:&ttl=30&socket_timeout=7")
    assert isinstance(b, RedisBackend)
    assert (b.prefix, b.ttl) == ("app:", "30")
    kwargs = b._client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 7.0 and kwargs["decode_responses"] is False
    assert "prefix" not in kwargs and "ttl" not in kwargs
    b.close()
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix=url:&ttl=30", prefix="kw:", ttl=5)
    assert (b.prefix, b.ttl) == ("kw:", 5)
    b.close()


def test_defaults_and_tls_scheme() -> None:
    b = RedisBackend.from_url("redis://127.0.0.1:6379/0")
    assert (b.prefix, b.ttl) == ("persistkit:", None)
    b.close()
    b = RedisBackend.from_url("rediss://127.0.0.1:6380/2")  # no connection is made
    assert issubclass(b._client.connection_pool.connection_class, redis.connection.SSLConnection)
    assert b._client.connection_pool.connection_kwargs["db"] == 2
    b.close()


def test_password_is_masked_in_url_and_errors() -> None:
    b = RedisBackend.from_url("redis://:s3cret@127.0.0.1:1/0?prefix=x:")
    assert "s3cret" not in b.url and "$CRED{url_password}" in b.url  # as errors show it
    with pytest.raises(BackendUnavailableError, match="cannot connect") as info:  # refused: an outage
        b.head("t", "")
    assert "s3cret" not in str(info.value) and b.url in str(info.value)
    b.close()


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("redis://h/0", {"prefx": "a"}, r"unknown option.*prefx.*accepted: prefix, ttl"),
        ("redis://h/0", {"ttl": 0}, "ttl"),
        ("redis://h/0?ttl=soon", {}, "ttl"),
        ("redis://h/0", {"ttl": float("inf")}, "ttl"),
        ("redis://h/0", {"prefix": "a{b}:"}, "prefix"),
        ("redis://h/0", {"prefix": 3}, "prefix"),
        ("redis://h:notaport/0", {}, "invalid redis URL"),
        ("memory://x", {}, "not a redis URL"),
    ],
)
def test_bad_options_are_configuration_errors(
    url: str, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        RedisBackend.from_url(url, **options)


# -- key layout --------------------------------------------------------------------------


@pytest.mark.parametrize("thread_id", ["plain", "a{b}c", "{", "}{", "a:b::{x}:", "线程 🧵 {ü}"])
def test_every_key_of_a_thread_shares_one_hash_tag(
    backend: RedisBackend, admin: Any, prefix: str, thread_id: str
) -> None:
    backend.write(_row(thread_id, 1, run="r"), {"k": b"v"}, 0)
    backend.write(_row(thread_id, 1, ns="ns:{2}", run="r:{3}"), {}, 0)
    backend.put_blobs(thread_id, {"k2": b"v"})
    keys = [k for k in _keys(admin, prefix) if k not in (prefix.encode() + b"threads", prefix.encode() + b"store")]
    tag = base64.urlsafe_b64encode(thread_id.encode()).rstrip(b"=")
    assert len(keys) == 3 + 4 * 2  # b, k, x + h, r, i, u per namespace
    for key in keys:
        rest = key[len(prefix) :]
        assert rest.startswith(b"{" + tag + b"}:"), key
        # The first {...} of the key is the thread's tag: Redis Cluster hashes only it.
        assert rest.index(b"}") == len(tag) + 1
    assert len({key_slot(k) for k in keys}) == 1
    assert admin.zrange(prefix + "threads", 0, -1) == [thread_id.encode()]


def test_failed_cas_leaves_no_trace(backend: RedisBackend, admin: Any, prefix: str) -> None:
    t = "atomic"
    backend.write(_row(t, 1, run="r1"), {"old": b"1"}, 0)
    before = _snapshot(admin, prefix)
    for expected in (0, 2, 5):
        with pytest.raises(ConflictError) as info:
            backend.write(
                _row(t, 2, parent=_row(t, 1).checkpoint_id, run="r2"), {"new": b"2"}, expected
            )
        assert (info.value.found, info.value.found_checkpoint) == (1, "00000001")
    assert _snapshot(admin, prefix) == before


def test_noscript_falls_back_to_eval(backend: RedisBackend) -> None:
    # A script no server has seen (unique source) takes the NOSCRIPT -> EVAL path,
    # without flushing the shared server's script cache.
    sha = _redis_ops.script_sha(f"-- {uuid.uuid4().hex}\nreturn ARGV[1]".encode())

    def op() -> _redis_ops.Op[bytes]:
        replies = yield _redis_ops.Batch((("EVALSHA", sha, 0, b"hello"),), read_only=False)
        return bytes(replies[0])

    assert backend._run(op()) == b"hello"
    assert backend._run(op()) == b"hello"  # cached now: plain EVALSHA
    assert asyncio.run(backend._arun(op())) == b"hello"


def test_orphan_index_entries_are_not_listed(
    backend: RedisBackend, admin: Any, prefix: str
) -> None:
    backend.write(_row("p/live", 1), {}, 0)
    admin.zadd(
        prefix + "threads", {"p/orphan": 0, "p/orphan2": 0}
    )  # e.g. a write that raced a delete
    assert backend.threads(prefix="p/") == ["p/live"]
    assert backend.threads(prefix="p/", limit=1) == ["p/live"]
    assert backend.delete_thread("p/orphan") is False
    assert admin.zscore(prefix + "threads", "p/orphan") is None


def test_server_errors_map_to_backend_error(backend: RedisBackend, admin: Any, prefix: str) -> None:
    backend.write(_row("t", 1), {}, 0)
    head_key = next(k for k in _keys(admin, prefix) if b"}:h:" in k)
    admin.delete(head_key)
    admin.set(head_key, b"not a hash")
    with pytest.raises(BackendError) as info:
        backend.head("t", "")
    assert not isinstance(info.value, BackendUnavailableError)
    assert isinstance(info.value.__cause__, redis.exceptions.ResponseError)


def test_a_server_never_reached_is_an_outage_that_names_the_url_to_check() -> None:
    # Refused on the first connect is the same outage as on the hundredth (a worker that
    # starts while Redis restarts must retry its turn), and the message says what to check.
    b = RedisBackend.from_url("redis://127.0.0.1:1/0?socket_connect_timeout=1")
    with pytest.raises(BackendUnavailableError, match=r"cannot connect.*host and port") as info:
        b.write(_row("t", 1), {}, 0)
    assert info.value.retryable
    with pytest.raises(BackendUnavailableError, match="cannot connect"):
        asyncio.run(b.ahead("t", ""))
    b.close()


# -- TTL ---------------------------------------------------------------------------------


def test_ttl_is_set_and_refreshed_on_every_write(redis_url: str, admin: Any, prefix: str) -> None:
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}&ttl=100")
    b.write(_row("t", 1, run="r"), {"k": b"v"}, 0)
    keys = [k for k in _keys(admin, prefix) if k not in (prefix.encode() + b"threads", prefix.encode() + b"store")]
    assert len(keys) == 7
    assert all(90_000 < admin.pttl(k) <= 100_000 for k in keys)
    assert 90_000 < admin.pttl(prefix + "threads") <= 100_000  # the index too, from the newest write
    for k in keys:
        admin.pexpire(k, 5_000)
    b.write(_row("t", 2, parent="00000001", run="r"), {}, 1)
    assert all(90_000 < admin.pttl(k) <= 100_000 for k in keys)
    for k in keys:
        admin.pexpire(k, 5_000)
    b.put_blobs("t", {"k2": b"v"})
    assert all(90_000 < admin.pttl(k) <= 100_000 for k in keys)
    b.close()


def test_no_ttl_by_default(backend: RedisBackend, admin: Any, prefix: str) -> None:
    backend.write(_row("t", 1), {"k": b"v"}, 0)
    assert {admin.pttl(k) for k in _keys(admin, prefix)} == {-1}


# -- user-supplied clients ------------------------------------------------------------


def test_user_supplied_sync_and_async_clients(redis_url: str, prefix: str) -> None:
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        b = RedisBackend(client=sync, async_client=aclient, prefix=prefix, volatile=True)
        assert b.url == "redis://127.0.0.1:6379/0"
        assert await b.awrite(_row("t", 1), {"k": b"v"}, 0) == Head("00000001", 1)
        assert b.head("t", "") == Head("00000001", 1)
        await b.aclose()
        with pytest.raises(StoreClosedError):
            await b.ahead("t", "")
        assert await aclient.ping()  # the user's clients stay open
        await aclient.aclose()

    asyncio.run(scenario())
    assert sync.ping()
    sync.close()


def test_only_one_kind_of_client(redis_url: str, prefix: str) -> None:
    sync = redis.Redis.from_url(redis_url)
    b = RedisBackend(client=sync, prefix=prefix, volatile=True)
    b.write(_row("t", 1), {}, 0)
    assert asyncio.run(b.ahead("t", "")) == Head("00000001", 1)  # async via a worker thread

    async def async_only() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        a = RedisBackend(async_client=aclient, prefix=prefix, volatile=True)
        assert await a.ahead("t", "") == Head("00000001", 1)
        with pytest.raises(ConfigurationError, match="only an async_client"):
            a.head("t", "")
        await aclient.aclose()

    asyncio.run(async_only())
    with pytest.raises(ConfigurationError):
        RedisBackend()
    with pytest.raises(ConfigurationError, match="decode_responses"):
        RedisBackend(client=redis.Redis.from_url(redis_url, decode_responses=True))
    sync.close()


# -- faults ------------------------------------------------------------------------------


def _kill_clients(admin: Any, name: str) -> int:
    """CLIENT KILL ID for each connection named ``name`` (only ours, never other tests')."""
    ids = [c["id"] for c in admin.client_list() if c.get("name") == name]
    for cid in ids:
        admin.execute_command("CLIENT", "KILL", "ID", cid)
    return len(ids)


def _write_resolving(b: RedisBackend, row: CheckpointRow, expected: int) -> bool:
    """Write once; on BackendUnavailableError resolve the ambiguous commit by reading
    the head, as the layer above does. Returns whether the first attempt failed."""
    try:
        b.write(row, {f"blob-{row.checkpoint_id}": row.payload}, expected)
        return False
    except BackendUnavailableError:
        head = b.head(row.thread_id, row.namespace)  # reads retry once, so this works
        if head is None or head.version == expected:
            b.write(row, {f"blob-{row.checkpoint_id}": row.payload}, expected)
        else:
            assert head == Head(row.checkpoint_id, expected + 1)
        return True


def test_client_kill_between_writes_loses_nothing(redis_url: str, admin: Any, prefix: str) -> None:
    name = f"pk-fault-{uuid.uuid4().hex[:8]}"
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}&client_name={name}")
    t, n, parent = "fault", 20, None
    for i in range(1, n + 1):
        row = _row(t, i, parent=parent)
        _write_resolving(b, row, i - 1)
        parent = row.checkpoint_id
        assert _kill_clients(admin, name) >= 1
        if i % 2:  # a read right after the kill: retried once, so it must just work
            assert b.head(t, "") == Head(row.checkpoint_id, i)
    rows = b.list(t, "")
    assert [r.checkpoint_id for r in rows] == [f"{i:08d}" for i in range(n, 0, -1)]
    assert len(b.scan_blobs(t, "", "~")) == n
    b.close()


def test_client_kill_async(redis_url: str, admin: Any, prefix: str) -> None:
    name = f"pk-afault-{uuid.uuid4().hex[:8]}"
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}&client_name={name}")

    async def scenario() -> None:
        for i in range(1, 11):
            row = _row("t", i)
            try:
                await b.awrite(row, {}, i - 1)
            except BackendUnavailableError:
                head = await b.ahead("t", "")
                if head is None or head.version == i - 1:
                    await b.awrite(row, {}, i - 1)
            assert _kill_clients(admin, name) >= 1
        assert await b.ahead("t", "") == Head("00000010", 10)
        assert len(await b.alist("t", "")) == 10
        await b.aclose()

    asyncio.run(scenario())


def _racing_writer(url: str, t: str, w: int, n: int) -> int:
    b = RedisBackend.from_url(url)
    landed = conflicts = 0
    while landed < n:
        head = b.head(t, "")
        v, parent = (head.version, head.checkpoint_id) if head else (0, None)
        row = CheckpointRow(t, "", f"{v + 1:08d}-w{w}", parent, f"w{w}", b"p" * 300)
        try:
            b.write(row, {f"w{w}-{landed}": b"b" * 1024}, v)
            landed += 1
        except ConflictError:
            conflicts += 1
    b.close()
    return conflicts


@pytest.mark.slow
def test_many_writers_across_processes(redis_url: str, prefix: str) -> None:
    url, t, procs, per = f"{redis_url}?volatile=true&prefix={prefix}", "shared", 4, 25
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        pool.starmap(_racing_writer, [(url, t, w, per) for w in range(procs)])
    b = RedisBackend.from_url(url)
    head = b.head(t, "")
    assert head is not None and head.version == procs * per
    rows = b.list(t, "")
    assert [int(r.checkpoint_id[:8]) for r in rows] == list(range(procs * per, 0, -1))
    for newer, older in itertools.pairwise(rows):
        assert newer.parent_id == older.checkpoint_id
    for w in range(procs):
        assert len(b.list(t, "", run_id=f"w{w}")) == per
        keys = [f"w{w}-{i}" for i in range(per)]
        assert set(b.get_blobs(t, keys)) == set(keys)
    b.close()
