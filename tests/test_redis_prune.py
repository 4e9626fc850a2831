"""Redis prune (retention) beyond the shipped suite: the row index and run index sorted
sets left consistent (the run member is rebuilt in Lua from the packed row), ids
compared in byte order, batches of PRUNE_BATCH, and blob sizes read from the blob index."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("redis")
import redis

from persistkit.backends import CheckpointRow
from persistkit.backends import _redis_ops as ops
from persistkit.backends.redis import RedisBackend

# run ids of every length modulo 3 (base64 padding), and beyond ASCII
RUNS = ["r", "ru", "run", "runs", "ré", "工作-🙂", "x" * 100]


@pytest.fixture
def admin(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def backend(redis_url: str, admin: Any) -> Iterator[RedisBackend]:
    prefix = f"pktest:prune-{uuid.uuid4().hex[:12]}:"
    b = RedisBackend.from_url(f"{redis_url}?volatile=true&prefix={prefix}")
    yield b
    b.close()
    keys = list(admin.scan_iter(match=prefix + "*", count=1000))
    if keys:
        admin.delete(*keys)


def _b64(s: str) -> bytes:
    return base64.urlsafe_b64encode(s.encode()).rstrip(b"=")


def _index(admin: Any, b: RedisBackend, t: str, kind: bytes) -> list[bytes]:
    return list(admin.zrange(b._keys.ns(t, "", kind), 0, -1))


def test_row_and_run_indexes_stay_consistent(backend: RedisBackend, admin: Any) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    ids = [f"{n:06d}" for n in range(1, 2 * len(RUNS) + 2)]
    for n, cid in enumerate(ids):
        run = RUNS[n % len(RUNS)] if n < len(ids) - 1 else None  # the head has no run
        backend.write(CheckpointRow(t, "", cid, ids[n - 1] if n else None, run, b"x"), {}, n)
    gone, kept = ids[: len(RUNS) + 2], ids[len(RUNS) + 2 :]
    assert backend.prune_rows(t, "", gone) == len(gone)
    assert [m.decode() for m in _index(admin, backend, t, b"i")] == kept
    runs = {cid: RUNS[ids.index(cid) % len(RUNS)] for cid in kept[:-1]}
    assert sorted(_index(admin, backend, t, b"u")) == sorted(_b64(r) + b":" + c.encode() for c, r in runs.items())
    assert sorted(k.decode() for k in admin.hkeys(backend._keys.ns(t, "", b"r"))) == kept
    for run in RUNS:
        assert [r.checkpoint_id for r in backend.list(t, "", run_id=run)] == sorted(
            (c for c, r in runs.items() if r == run), reverse=True
        )


def test_ids_compare_in_byte_order_not_the_servers_locale(backend: RedisBackend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    # byte order: "B" < "a" < "b" (a locale's collation would put "a" first)
    for n, cid in enumerate(["B1", "a1", "b1"]):
        backend.write(CheckpointRow(t, "", cid, None, "run", b"x"), {}, n)
    assert backend.prune_rows(t, "", ["B1", "a1"]) == 2
    assert [r.checkpoint_id for r in backend.list(t, "")] == ["b1"]
    u = f"t-{uuid.uuid4().hex[:8]}"
    for n, cid in enumerate(["a1", "B2"]):  # the head "B2" sorts below "a1"
        backend.write(CheckpointRow(u, "", cid, None, "run", b"x"), {}, n)
    assert backend.prune_rows(u, "", ["a1"]) == 0
    assert [r.checkpoint_id for r in backend.list(u, "")] == ["a1", "B2"]


def test_a_large_prune_runs_in_batches(backend: RedisBackend, admin: Any) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    n = 2 * ops.PRUNE_BATCH + 3
    ids = [f"{i:06d}" for i in range(1, n + 1)]
    pipe = admin.pipeline(transaction=False)
    for cid in ids:  # the rows as the write script stores them, in one round trip
        row = CheckpointRow(t, "", cid, None, "run", b"x")
        pipe.hset(backend._keys.ns(t, "", b"r"), cid, ops._pack(row))
        pipe.zadd(backend._keys.ns(t, "", b"i"), {cid: 0})
        pipe.zadd(backend._keys.ns(t, "", b"u"), {_b64("run") + b":" + cid.encode(): 0})
    pipe.hset(backend._keys.ns(t, "", b"h"), mapping={"v": n, "c": ids[-1]})
    pipe.execute()
    op = ops.op_prune_rows(backend._keys, t, "", ids)
    sent: list[list[str]] = []
    try:
        batch = next(op)
        while True:
            (cmd,) = batch.commands  # one script a round trip, at most PRUNE_BATCH ids
            sent.append([c.decode() for c in cmd[7:]])
            assert len(sent[-1]) <= ops.PRUNE_BATCH
            batch = op.send(backend._execute(backend._client, batch))
    except StopIteration as done:
        deleted = done.value
    assert deleted == n - 1
    assert [b for batch in sent for b in batch] == ids[::-1]  # newest first
    assert len(sent) == 3
    assert [r.checkpoint_id for r in backend.list(t, "", run_id="run")] == [ids[-1]]
    assert admin.zcard(backend._keys.ns(t, "", b"i")) == 1


def test_blob_sizes_page_through_the_blob_index(backend: RedisBackend, admin: Any) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    backend.write(CheckpointRow(t, "", "c1", None, None, b"x"), {}, 0)
    blobs = {f"v:{i:05d}": b"y" * (i % 7) for i in range(ops.PRUNE_BATCH + 20)}
    backend.put_blobs(t, blobs)
    # an index entry without its bytes (not written by the store) is no blob
    admin.zadd(backend._keys.thread(t) + b"k", {b"v:ghost": 0})
    assert backend.blob_sizes(t) == {k: len(v) for k, v in blobs.items()}
    assert backend.delete_blobs(t, [*list(blobs)[:-1], "v:ghost", "v:missing"]) == len(blobs) - 1
    assert backend.blob_sizes(t) == {f"v:{ops.PRUNE_BATCH + 19:05d}": (ops.PRUNE_BATCH + 19) % 7}
    assert admin.zrange(backend._keys.thread(t) + b"k", 0, -1) == [f"v:{ops.PRUNE_BATCH + 19:05d}".encode()]
    assert backend.scan_blobs(t, "v:", "v;") == {f"v:{ops.PRUNE_BATCH + 19:05d}": blobs[f"v:{ops.PRUNE_BATCH + 19:05d}"]}


def test_async_twins_on_redis_asyncio(backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"

    def no_sync_driver(op: Any) -> Any:
        raise AssertionError("an async prune method ran the sync driver")

    monkeypatch.setattr(backend, "_run", no_sync_driver)  # redis.asyncio, not a worker thread

    async def main() -> Any:
        for n in range(3):
            await backend.awrite(CheckpointRow(t, "", f"c{n}", None, "ré", b"x"), {"v:a": b"ab"} if n == 0 else {}, n)
        return (
            await backend.aprune_rows(t, "", ["c0", "c1", "c2"]),
            await backend.ablob_sizes(t),
            await backend.adelete_blobs(t, ["v:a"]),
            [r.checkpoint_id for r in await backend.alist(t, "", run_id="ré")],
        )

    assert asyncio.run(main()) == (2, {"v:a": 2}, 1, ["c2"])
