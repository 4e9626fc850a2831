"""Redis-specific tests of the kv and watch capabilities (persistkit/backends/_redis_kv.py).

The contract is covered by the shipped suites (tests/test_kv_conformance.py -k redis); these
tests check what only Redis has: a watch whose connection the server kills, the publish
being part of the write script (a conflict publishes nothing), the scope's sorted sets
against a model after many deletes and re-creations, batched drops, the hash tag, and
the write-to-hint latency (printed, never asserted). Each test uses its own key prefix
and deletes its keys at the end; nothing here flushes the shared server.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
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
from persistkit.backends._protocol import KvEntry, KvHint, KvOp

pytest.importorskip("redis")
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot

from persistkit.backends import _redis_kv
from persistkit.backends.redis import RedisBackend
from persistkit.testing.watch_suite import seen


@pytest.fixture
def admin(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def prefix(admin: Any) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    p = f"pktest:rediskv-{uuid.uuid4().hex[:12]}:"
    yield p
    keys = list(admin.scan_iter(match=p + "*", count=1000))
    if keys:
        admin.delete(*keys)


@pytest.fixture
def backend(redis_url: str, prefix: str) -> Iterator[RedisBackend]:
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}")
    yield b
    b.close()


@pytest.fixture
def other(redis_url: str, prefix: str) -> Iterator[RedisBackend]:
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}")
    yield b
    b.close()


def _scope() -> str:
    return f"s_{uuid.uuid4().hex[:16]}"


def _watch_client_ids(admin: Any, scope: str) -> list[int]:
    name = f"persistkit:watch:{scope}"
    return [int(c["id"]) for c in admin.client_list() if c.get("name") == name]


def _scope_keys(admin: Any, prefix: str, scope: str) -> list[bytes]:
    return sorted(admin.scan_iter(match=f"{prefix}{{k.{scope}}}:*", count=1000))


# -- watch: a killed connection ------------------------------------------------------------


def test_killed_watch_reconnects_says_relist_and_keeps_delivering(
    backend: RedisBackend, other: RedisBackend, admin: Any
) -> None:
    scope = _scope()
    watch = backend.watch_open(scope)
    try:
        other.kv_write(scope, [KvOp("before", 0, b"1")], keep=1)
        assert seen(watch, backend, scope, "before", 1)
        [old] = _watch_client_ids(admin, scope)  # one dedicated, named connection per watch
        assert admin.execute_command("CLIENT", "KILL", "ID", old) == 1
        assert watch.hints(10.0) == [KvHint(None)]  # the drop is seen, the watch subscribed again
        [new] = _watch_client_ids(admin, scope)
        assert new != old
        other.kv_write(scope, [KvOp("after", 0, b"2")], keep=1)
        assert seen(watch, backend, scope, "after", 1)
        # The server is unreachable when the watch reconnects: that call fails (retryable),
        # the next one reconnects and says "list again" first.
        make = watch._make
        watch._make = lambda: redis.Redis(port=1, retry=redis.retry.Retry(NoBackoff(), 0))
        admin.execute_command("CLIENT", "KILL", "ID", new)
        with pytest.raises(BackendUnavailableError):
            watch.hints(10.0)
        watch._make = make
        other.kv_write(scope, [KvOp("after", 1, b"3")], keep=1)  # made while nobody listened
        assert watch.hints(10.0) == [KvHint(None)]
        assert backend.kv_get(scope, "after") == KvEntry("after", 2, b"3")  # what the re-read finds
        other.kv_write(scope, [KvOp("after", 2, b"4")], keep=1)
        assert seen(watch, backend, scope, "after", 3)
    finally:
        watch.close()
        backend.kv_drop(scope)
    assert _watch_client_ids(admin, scope) == []  # close released the connection


def test_killed_async_watch_reconnects(backend: RedisBackend, other: RedisBackend, admin: Any) -> None:
    scope = _scope()

    async def wait_for(watch: Any, key: str, version: int) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for h in await watch.ahints(0.5):
                if h.key == key and h.version >= version:
                    return True
        return False

    async def go() -> None:
        watch = await backend.awatch_open(scope)
        try:
            assert isinstance(watch, _redis_kv.AsyncRedisWatch)  # native, not a thread
            await other.akv_write(scope, [KvOp("a", 0, b"1")], keep=1)
            assert await wait_for(watch, "a", 1)
            [old] = _watch_client_ids(admin, scope)
            admin.execute_command("CLIENT", "KILL", "ID", old)
            assert await watch.ahints(10.0) == [KvHint(None)]
            assert _watch_client_ids(admin, scope) not in ([], [old])
            await other.akv_write(scope, [KvOp("a", 1, b"2")], keep=1)
            assert await wait_for(watch, "a", 2)
        finally:
            await watch.aclose()
        with pytest.raises(StoreClosedError):
            await watch.ahints(0.01)

    try:
        asyncio.run(go())
        assert _watch_client_ids(admin, scope) == []
    finally:
        backend.kv_drop(scope)


def test_watch_on_an_unreachable_server_is_a_persistkit_error() -> None:
    b = RedisBackend.from_url("redis://127.0.0.1:1/0?socket_connect_timeout=1")
    try:
        with pytest.raises(BackendError, match="cannot connect"):
            b.watch_open("s")
    finally:
        b.close()


def test_closed_store_refuses_watch_and_bad_scope_is_refused(backend: RedisBackend) -> None:
    with pytest.raises(ConfigurationError, match="must be 1 to 64 characters"):
        backend.kv_get("bad}scope", "k")
    backend.close()
    with pytest.raises(StoreClosedError):
        backend.watch_open("s")


# -- the publish is part of the write script -------------------------------------------------


def test_a_conflicting_write_publishes_nothing(backend: RedisBackend, admin: Any, prefix: str) -> None:
    scope = _scope()
    sub = admin.pubsub()
    sub.subscribe(_redis_kv.channel(backend._keys, scope))
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    try:
        backend.kv_write(scope, [KvOp("k", 0, b"1")], keep=2)
        assert sub.get_message(timeout=5)["data"] == b"1:k"
        with pytest.raises(ConflictError):
            backend.kv_write(scope, [KvOp("k", 0, b"x")], keep=2)
        with pytest.raises(ConflictError) as info:  # a batch whose last op conflicts: nothing at all
            backend.kv_write(scope, [KvOp("fresh", 0, b"x"), KvOp("k", 5, b"x")], keep=2)
        assert info.value.key == "k" and info.value.found == 1
        backend.kv_write(scope, [KvOp("mark:é", 0, b"m"), KvOp("k", 1, None)], keep=2)
        # Messages on one channel arrive in publish order: the next one is the marker's write.
        assert sub.get_message(timeout=5)["data"] == "1:mark:é\x002:k".encode()
        assert sub.get_message(timeout=0.2) is None
        assert backend.kv_get(scope, "fresh") is None
    finally:
        sub.close()
        backend.kv_drop(scope)


# -- the index: a model check over many deletes and re-creations --------------------------------


def test_index_matches_a_model_after_many_deletes_and_recreates(
    backend: RedisBackend, admin: Any, prefix: str
) -> None:
    scope = _scope()
    rng = random.Random(22)
    names = [f"k/{i:02d}" for i in range(25)] + ["k", "k/", "k/\uffff", "é"]
    model: dict[str, tuple[int, bytes | None]] = {}
    tag = f"{prefix}{{k.{scope}}}:".encode()
    for round_ in range(60):
        picked = rng.sample(names, rng.randint(1, 6))
        ops = []
        for name in picked:
            version, value = model.get(name, (0, None))
            new = None if value is not None and rng.random() < 0.5 else b"r%d" % round_
            ops.append(KvOp(name, version, new))
        backend.kv_write(scope, ops, keep=rng.randint(1, 3))
        for op in ops:
            model[op.key] = (op.expected + 1, op.value)
        live = sorted(k for k, (_, v) in model.items() if v is not None)
        assert [(e.key, e.version, e.value) for e in backend.kv_list(scope)] == [
            (k, model[k][0], model[k][1]) for k in live
        ]
        assert [m.decode() for m in admin.zrange(tag + b"live", 0, -1)] == live
        assert sorted(m.decode() for m in admin.zrange(tag + b"all", 0, -1)) == sorted(model)
    # Pages of two over a prefix skip tombstones and still fill up.
    pages, after = [], None
    while got := backend.kv_list(scope, prefix="k/", after=after, limit=2):
        assert len(got) == 2 or len(got) == len([k for k in live if k.startswith("k/")]) % 2
        pages += [e.key for e in got]
        after = got[-1].key
    assert pages == [k for k in live if k.startswith("k/")]
    for name, (version, _) in model.items():
        kept = backend.kv_history(scope, name)
        assert kept[0].version == version and [e.version for e in kept] == list(range(version, version - len(kept), -1))


def test_drop_runs_in_batches_and_leaves_no_key(
    backend: RedisBackend, admin: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = _scope()
    monkeypatch.setattr(_redis_kv, "DROP_BATCH", 7)
    backend.kv_write(scope, [KvOp(f"k{i}", 0, b"v") for i in range(40)], keep=2)
    backend.kv_write(scope, [KvOp(f"k{i}", 1, None) for i in range(0, 40, 2)], keep=2)
    keys = _scope_keys(admin, prefix, scope)
    assert len(keys) == 42 and len({key_slot(k) for k in keys}) == 1  # one slot per scope
    watch = backend.watch_open(scope)
    try:
        assert backend.kv_drop(scope) is True
        assert _scope_keys(admin, prefix, scope) == []
        assert backend.kv_drop(scope) is False
        assert KvHint(None) in watch.hints(5.0)  # a drop tells watchers to list again
    finally:
        watch.close()
    backend.kv_write(scope, [KvOp("k0", 0, b"again")], keep=1)
    assert backend.kv_list(scope) == [KvEntry("k0", 1, b"again")]
    backend.kv_drop(scope)


def test_values_of_several_megabytes(backend: RedisBackend) -> None:
    scope = _scope()
    big = random.Random(1).randbytes(6 * 1024 * 1024)
    try:
        backend.kv_write(scope, [KvOp("big", 0, big)], keep=2)
        backend.kv_write(scope, [KvOp("big", 1, big[::-1])], keep=2)
        assert backend.kv_get(scope, "big", version=1) == KvEntry("big", 1, big)
        assert backend.kv_list(scope) == [KvEntry("big", 2, big[::-1])]
    finally:
        backend.kv_drop(scope)


# -- latency (printed, not asserted) --------------------------------------------------------------


def test_write_to_hint_latency(backend: RedisBackend, other: RedisBackend, capsys: pytest.CaptureFixture[str]) -> None:
    scope = _scope()
    watch = backend.watch_open(scope)
    samples = []
    try:
        for v in range(100):
            start = time.perf_counter()
            other.kv_write(scope, [KvOp("t", v, b"x")], keep=1)
            got = False
            while not got and time.perf_counter() - start < 10:
                # (a "list again" hint also ends the wait: the reader would re-read now)
                got = any(h.key is None or (h.key == "t" and h.version == v + 1) for h in watch.hints(5.0))
            assert got, f"no hint of version {v + 1} within 10 s"
            samples.append((time.perf_counter() - start) * 1000)
    finally:
        watch.close()
        backend.kv_drop(scope)
    samples.sort()
    with capsys.disabled():
        print(
            f"\nredis kv write-to-hint latency over {len(samples)} writes: median "
            f"{statistics.median(samples):.3f} ms, p95 {samples[94]:.3f} ms, max {samples[-1]:.3f} ms"
        )
    assert len(samples) == 100


def test_user_supplied_clients_watch_on_their_own_connection(redis_url: str, prefix: str, admin: Any) -> None:
    """A user's client keeps its settings (redis-py retries on); the watch's own connection
    has them off, so a kill is seen as a drop (never silently re-made) and says "list again"."""
    import redis.asyncio

    scope = _scope()
    sync_client = redis.Redis.from_url(redis_url)
    async_client = redis.asyncio.Redis.from_url(redis_url)
    b = RedisBackend(sync_client, async_client, prefix=prefix, volatile=True)
    try:
        watch = b.watch_open(scope)
        b.kv_write(scope, [KvOp("u", 0, b"1")], keep=1)
        assert seen(watch, b, scope, "u", 1)
        [old] = _watch_client_ids(admin, scope)
        admin.execute_command("CLIENT", "KILL", "ID", old)
        assert watch.hints(10.0) == [KvHint(None)]
        watch.close()

        async def go() -> list[KvHint]:
            awatch = await b.awatch_open(scope)
            try:
                assert isinstance(awatch, _redis_kv.AsyncRedisWatch)
                await b.akv_write(scope, [KvOp("u", 1, b"2")], keep=1)
                return await awatch.ahints(10.0)
            finally:
                await awatch.aclose()
                await async_client.aclose()

        assert asyncio.run(go()) == [KvHint("u", 2)]
        only_sync = RedisBackend(sync_client, prefix=prefix, volatile=True)  # awatch_open: the blocking watch in a thread

        async def threaded() -> list[KvHint]:
            awatch = await only_sync.awatch_open(scope)
            try:
                assert isinstance(awatch, _redis_kv.RedisWatch)
                await only_sync.akv_write(scope, [KvOp("u", 2, None)], keep=1)
                return await awatch.ahints(10.0)
            finally:
                await awatch.aclose()

        assert asyncio.run(threaded()) == [KvHint("u", 3)]
    finally:
        b.kv_drop(scope)
        sync_client.close()


def test_the_urls_client_name_names_the_watch_connection(redis_url: str, prefix: str, admin: Any) -> None:
    """``?client_name=`` named every connection of the store but the watch's, which was always
    ``persistkit:watch:<scope>`` (issue #34; PostgreSQL's application_name reaches LISTEN)."""
    scope, name = _scope(), f"myapp-{uuid.uuid4().hex[:8]}"
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}&client_name={name}")

    def subscribed() -> list[str]:
        return [c["name"] for c in admin.client_list() if c.get("name") == name and c.get("cmd") == "subscribe"]

    try:
        watch = b.watch_open(scope)
        try:
            assert subscribed() == [name] and _watch_client_ids(admin, scope) == []
        finally:
            watch.close()

        async def go() -> list[str]:
            awatch = await b.awatch_open(scope)
            try:
                return subscribed()
            finally:
                await awatch.aclose()

        assert asyncio.run(go()) == [name]
    finally:
        b.close()
    plain = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}")
    try:
        watch = plain.watch_open(scope)  # no name given: the watch's own, by its scope
        assert len(_watch_client_ids(admin, scope)) == 1
        watch.close()
    finally:
        plain.close()
