"""The S3 store's kv batch protocol (persistkit/backends/_s3_kv.py): crashed and stalled
batches stay invisible and are aborted, racing batches have one winner and are never
half-visible, request counts, options and long keys. The shared contract is the kv and
watch conformance suites (tests/test_kv_conformance.py -k s3); everything here runs
against moto's server over real HTTP."""

from __future__ import annotations

import collections
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from persistkit import ConfigurationError, ConflictError
from persistkit.backends import open_backend
from persistkit.backends._protocol import KvEntry, KvHint, KvOp
from persistkit.backends.s3 import S3Backend

BUCKET = "persistkit-test"


@pytest.fixture
def client(s3_endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def url(s3_endpoint: str) -> str:
    return f"s3://{BUCKET}/s3kv/{uuid.uuid4().hex[:10]}?endpoint_url={s3_endpoint}"


@pytest.fixture
def scope() -> str:
    return f"kv_{uuid.uuid4().hex[:12]}"


def _open(url: str, **options: Any) -> S3Backend:
    b = open_backend(url, **options)
    assert isinstance(b, S3Backend)
    return b


class _Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the store catches it."""


class _CrashingClient:
    """A boto3 client that dies at the ``at``-th kv PutObject (record, members, flip in order)."""

    def __init__(self, client: Any, at: int) -> None:
        self._client = client
        self._at = at
        self.puts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_object(self, **kwargs: Any) -> Any:
        if "/kv" in kwargs["Key"]:
            self.puts += 1
            if self.puts == self._at:
                raise _Crash()
        return self._client.put_object(**kwargs)


def _records(client: Any, url: str, scope: str) -> list[str]:
    root = url.split(BUCKET + "/", 1)[1].split("?", 1)[0]
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{root}/kvt/{scope}/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    return [json.loads(client.get_object(Bucket=BUCKET, Key=k)["Body"].read())["s"] for k in keys]


# -- a crashed batch -----------------------------------------------------------------------


@pytest.mark.parametrize("crash_at", [3, 4, 5], ids=["after-one-member", "after-two-members", "at-the-commit"])
def test_a_crashed_batch_is_invisible_and_aborted_after_the_timeout(
    url: str, client: Any, scope: str, crash_at: int
) -> None:
    """Record (put 1), members a, b, c (puts 2-4), commit flip (put 5): a crash at any of
    them leaves nothing visible; the next writer of a key aborts the batch and writes."""
    setup = _open(url)
    setup.kv_write(scope, [KvOp("a", 0, b"a1"), KvOp("b", 0, b"b1")], keep=5)
    crashing = _CrashingClient(client, crash_at)
    doomed = _open(url, client=crashing)
    with pytest.raises(_Crash):
        doomed.kv_write(scope, [KvOp("a", 1, b"A"), KvOp("b", 1, b"B"), KvOp("c", 0, b"C")], keep=5)
    assert crashing.puts == crash_at
    assert sorted(_records(client, url, scope)) == ["committed", "pending"]
    reader = _open(url)  # default timeout: the pending batch is young to it
    assert reader.kv_get(scope, "a") == KvEntry("a", 1, b"a1")
    assert reader.kv_get(scope, "b") == KvEntry("b", 1, b"b1")
    assert reader.kv_get(scope, "c") is None
    assert reader.kv_get(scope, "a", version=2) is None
    assert [e.version for e in reader.kv_history(scope, "a")] == [1]
    assert reader.kv_list(scope) == [KvEntry("a", 1, b"a1"), KvEntry("b", 1, b"b1")]
    with pytest.raises(ConflictError) as info:  # the crashed batch's version is not the latest
        reader.kv_write(scope, [KvOp("a", 2, b"no")], keep=5)
    assert info.value.found == 1
    # The next writer, with a short timeout, waits for the batch to age, aborts it and writes.
    nxt = _open(url, kv_pending_timeout=0.2)
    nxt.kv_write(scope, [KvOp("a", 1, b"a2"), KvOp("c", 0, b"c1")], keep=5)
    assert sorted(_records(client, url, scope)) == ["aborted", "committed", "committed"]
    for b in (reader, nxt):
        assert b.kv_get(scope, "a") == KvEntry("a", 2, b"a2")
        assert b.kv_get(scope, "c") == KvEntry("c", 1, b"c1")
        assert b.kv_get(scope, "b") == KvEntry("b", 1, b"b1")  # its aborted slot stays invisible
    nxt.kv_write(scope, [KvOp("b", 1, b"b2")], keep=5)  # and is replaced by the next write
    assert reader.kv_history(scope, "b") == [KvEntry("b", 2, b"b2"), KvEntry("b", 1, b"b1")]
    for b in (setup, doomed, reader, nxt):
        b.kv_drop(scope)
        b.close()


def test_a_reader_aborts_an_old_pending_batch(url: str, client: Any, scope: str) -> None:
    doomed = _open(url, client=_CrashingClient(client, 3))
    with pytest.raises(_Crash):
        doomed.kv_write(scope, [KvOp("x", 0, b"X"), KvOp("y", 0, b"Y")], keep=1)
    assert _records(client, url, scope) == ["pending"]
    reader = _open(url, kv_pending_timeout=0.05)
    while _records(client, url, scope) == ["pending"]:  # reads never wait: they abort once it aged
        assert reader.kv_get(scope, "x") is None
    assert _records(client, url, scope) == ["aborted"]
    assert reader.kv_list(scope) == []
    reader.kv_drop(scope)
    doomed.close()
    reader.close()


class _PausingClient:
    """Holds the commit flip (a PutObject with If-Match on a batch record) until released."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.paused = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_object(self, **kwargs: Any) -> Any:
        if "/kvt/" in kwargs["Key"] and "IfMatch" in kwargs and not self.paused.is_set():
            self.paused.set()
            assert self.release.wait(timeout=120), "the test never released the paused writer"
        return self._client.put_object(**kwargs)


def test_a_stalled_batch_aborted_by_another_writer_fails_its_commit(url: str, client: Any, scope: str) -> None:
    pausing = _PausingClient(client)
    slow = _open(url, client=pausing)
    other = _open(url, kv_pending_timeout=0.05)
    raised: list[BaseException] = []

    def write() -> None:
        try:
            slow.kv_write(scope, [KvOp("p", 0, b"slow"), KvOp("q", 0, b"slow")], keep=2)
        except BaseException as exc:
            raised.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert pausing.paused.wait(timeout=120)
        other.kv_write(scope, [KvOp("q", 0, b"fast")], keep=2)  # aborts the stalled batch, then writes
    finally:
        pausing.release.set()
        writer.join(timeout=120)
    assert not writer.is_alive() and len(raised) == 1 and isinstance(raised[0], ConflictError), raised
    assert other.kv_get(scope, "p") is None
    assert slow.kv_get(scope, "q") == KvEntry("q", 1, b"fast")
    assert _records(client, url, scope) == ["aborted"]
    other.kv_drop(scope)
    slow.close()
    other.close()


# -- racing batches ------------------------------------------------------------------------


def test_racing_batches_one_winner_and_never_half_visible(url: str, scope: str) -> None:
    """Two instances race a batch over x, y, z each round while a third reads: one wins each
    round, and the reader sees only winners' values, never a batch in part."""
    a, b, reader = _open(url), _open(url), _open(url)
    keys = ["x", "y", "z"]
    a.kv_write(scope, [KvOp(k, 0, b"start") for k in keys], keep=3)
    rounds = 8
    winners: list[bytes] = [b"start"]
    stop = threading.Event()
    seen: list[tuple[int, bytes | None, int, bytes | None]] = []
    problems: list[str] = []

    def read() -> None:
        try:
            read_until_stopped()
        except BaseException as exc:  # a failed read fails the test, not only this thread
            problems.append(f"the reader raised {exc!r}")

    def read_until_stopped() -> None:
        while not stop.is_set():
            x = reader.kv_get(scope, "x")
            z = reader.kv_get(scope, "z")
            if x is None or z is None:
                problems.append(f"a key vanished: {x}, {z}")
                continue
            if z.version < x.version:  # x then z: a batch committed whole moves z no later than x
                problems.append(f"z at {z.version} after x at {x.version}")
            if z.version == x.version and z.value != x.value:
                problems.append(f"x and z at {x.version} hold {x.value!r} and {z.value!r}")
            seen.append((x.version, x.value, z.version, z.value))
            for e in reader.kv_list(scope):
                seen.append((e.version, e.value, e.version, e.value))

    watcher = threading.Thread(target=read)
    watcher.start()
    try:
        for r in range(rounds):
            barrier = threading.Barrier(2)
            outcomes: dict[bytes, str] = {}

            def race(
                store: S3Backend, tag: bytes, version: int, barrier: threading.Barrier, outcomes: dict[bytes, str]
            ) -> None:
                barrier.wait()
                try:
                    store.kv_write(scope, [KvOp(k, version, tag) for k in keys], keep=3)
                    outcomes[tag] = "won"
                except ConflictError:
                    outcomes[tag] = "lost"

            tags = [b"A%d" % r, b"B%d" % r]
            threads = [
                threading.Thread(target=race, args=(s, t, r + 1, barrier, outcomes))
                for s, t in zip((a, b), tags, strict=True)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(outcomes.values()) == ["lost", "won"], outcomes
            winners += [t for t, o in outcomes.items() if o == "won"]
    finally:
        stop.set()
        watcher.join()
    assert not problems, problems[:5]
    assert seen and all(xv in winners and zv in winners for _, xv, _, zv in seen)
    final = [reader.kv_get(scope, k) for k in keys]
    assert {(e.version, e.value) for e in final if e is not None} == {(rounds + 1, winners[-1])}
    for s in (a, b, reader):
        s.kv_drop(scope)
        s.close()


# -- requests -------------------------------------------------------------------------------


class _Counter:
    """Counts HTTP requests a boto3 client sends, by operation name."""

    def __init__(self, client: Any) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        client.meta.events.register("before-send.s3.*", self._count)

    def _count(self, request: Any, event_name: str, **_: Any) -> None:
        self.calls[event_name.rsplit(".", 1)[-1]] += 1

    def take(self) -> dict[str, int]:
        out = dict(self.calls)
        self.calls.clear()
        return out


def test_requests_per_kv_operation(s3_endpoint: str, scope: str) -> None:
    import boto3

    root = f"s3://{BUCKET}/count/{uuid.uuid4().hex[:8]}"
    mine, theirs = boto3.client("s3", endpoint_url=s3_endpoint), boto3.client("s3", endpoint_url=s3_endpoint)
    b, o = _open(root, client=mine), _open(root, client=theirs)
    counter, other_counter = _Counter(mine), _Counter(theirs)
    b.kv_write(scope, [KvOp("k", 0, b"1")], keep=2)
    assert counter.take() == {"ListObjectsV2": 1, "PutObject": 1}  # the key's versions, the conditional create
    b.kv_write(scope, [KvOp("k", 1, b"2")], keep=2)
    assert counter.take() == {"ListObjectsV2": 1, "PutObject": 1}  # its own last version: status known
    b.kv_write(scope, [KvOp("k", 2, b"3")], keep=2)
    assert counter.take() == {"ListObjectsV2": 1, "PutObject": 1, "DeleteObjects": 1}  # + the trim
    assert b.kv_get(scope, "k") == KvEntry("k", 3, b"3")
    assert counter.take() == {"ListObjectsV2": 1, "GetObject": 1}
    assert o.kv_get(scope, "k") == KvEntry("k", 3, b"3")
    assert other_counter.take() == {"ListObjectsV2": 1, "GetObject": 1}  # header and value in one GET
    assert o.kv_get(scope, "k", version=2) == KvEntry("k", 2, b"2")
    assert other_counter.take() == {"GetObject": 1}
    o.kv_write(scope, [KvOp("k", 3, b"4")], keep=2)
    assert other_counter.take() == {"ListObjectsV2": 1, "PutObject": 1, "DeleteObjects": 1}
    with pytest.raises(ConflictError):
        b.kv_write(scope, [KvOp("k", 3, b"stale")], keep=2)
    assert counter.take() == {"ListObjectsV2": 1, "GetObject": 1}  # the other's version: its header, once
    b.kv_write(scope, [KvOp("m", 0, b"1"), KvOp("n", 0, b"1")], keep=2)
    assert counter.take() == {"ListObjectsV2": 2, "PutObject": 4}  # record, two versions, commit flip
    assert o.kv_get(scope, "m") == KvEntry("m", 1, b"1")
    assert other_counter.take() == {"ListObjectsV2": 1, "GetObject": 2}  # the version, then its batch's record
    assert o.kv_get(scope, "n") == KvEntry("n", 1, b"1")
    assert other_counter.take() == {"ListObjectsV2": 1, "GetObject": 1}  # a committed record is cached
    assert [e.key for e in o.kv_list(scope)] == ["k", "m", "n"]
    assert other_counter.take() == {"ListObjectsV2": 1, "GetObject": 3}  # one per value
    b.kv_drop(scope)
    b.close()
    o.close()


# -- options, long keys, watch ------------------------------------------------------------------


def test_timing_options(s3_endpoint: str) -> None:
    root = f"s3://{BUCKET}/opts?endpoint_url={s3_endpoint}"
    b = _open(root + "&watch_interval=0.25&kv_pending_timeout=3")
    assert (b._watch_interval, b._pending_timeout) == (0.25, 3.0)
    b.close()
    for bad in ("watch_interval=0", "watch_interval=soon", "kv_pending_timeout=-1", "kv_pending_timeout=nan"):
        with pytest.raises(ConfigurationError, match=bad.split("=")[0]):
            open_backend(f"{root}&{bad}")
    with pytest.raises(ConfigurationError, match="watch_interval"):
        open_backend(f"{root}&watch_intervall=1")  # a typo is named, with the close match


@pytest.fixture
def store(url: str) -> Iterator[S3Backend]:
    b = _open(url, watch_interval=0.05)
    yield b
    b.close()


def test_long_keys_sharing_a_hashed_prefix_list_in_order(store: S3Backend, scope: str) -> None:
    stem = "é" * 130  # 260 UTF-8 bytes: past the 240 bytes a key segment holds
    keys = [stem + "b", stem + "a", stem + "a" * 5, stem[:120], stem + "c", "z"]
    store.kv_write(scope, [KvOp(k, 0, k.encode()) for k in keys], keep=1)
    store.kv_write(scope, [KvOp(stem + "c", 1, None)], keep=1)
    live = sorted(set(keys) - {stem + "c"})
    assert [e.key for e in store.kv_list(scope)] == live
    assert [e.key for e in store.kv_list(scope, after=stem + "a", limit=2)] == [stem + "a" * 5, stem + "b"]
    assert [e.key for e in store.kv_list(scope, prefix=stem)] == [k for k in live if k.startswith(stem)]
    assert store.kv_get(scope, stem + "a") == KvEntry(stem + "a", 1, (stem + "a").encode())
    store.kv_drop(scope)


def test_watch_hints_keys_and_a_batch_at_its_commit(store: S3Backend, url: str, scope: str) -> None:
    other = _open(url)
    watch = store.watch_open(scope)
    try:
        assert watch.hints(0.1) == []
        other.kv_write(scope, [KvOp("one", 0, b"1")], keep=1)
        got: list[KvHint] = []
        while not got:
            got = watch.hints(1.0)
        assert got == [KvHint("one", 1)]
        other.kv_write(scope, [KvOp("one", 1, b"2"), KvOp("two", 0, b"1")], keep=1)
        hints: set[KvHint] = set()
        while not {KvHint("one", 2), KvHint("two", 1)} <= hints and KvHint(None) not in hints:
            hints |= set(watch.hints(1.0))
        quiet = store.watch_open(scope)  # opened after the batch settled: sees only what follows
        try:
            other.kv_write(scope, [KvOp("ü" * 200, 0, b"x")], keep=1)
            got = []
            while not got:
                got = quiet.hints(1.0)
            assert got == [KvHint(None)]  # a hashed key cannot be named from a listing: list again
        finally:
            quiet.close()
    finally:
        watch.close()
        other.kv_drop(scope)
        other.close()


def test_a_list_with_a_limit_reads_only_what_it_needs(s3_endpoint: str, url: str, scope: str) -> None:
    import boto3

    writer = _open(url)
    writer.kv_write(scope, [KvOp(f"k{i:03d}", 0, b"v") for i in range(40)], keep=1)
    theirs = boto3.client("s3", endpoint_url=s3_endpoint)
    reader = _open(url.split("?", 1)[0], client=theirs)
    counter = _Counter(theirs)
    assert [e.key for e in reader.kv_list(scope, limit=2)] == ["k000", "k001"]
    calls = counter.take()
    assert calls["ListObjectsV2"] == 1 and calls["GetObject"] < 25, calls  # a chunk of keys, not all 40
    assert len(reader.kv_list(scope)) == 40
    writer.kv_drop(scope)
    writer.close()
    reader.close()
