"""S3-specific behaviour: URL options, key encoding, conditional-write CAS, orphans, request counts.

Everything runs against moto's server over real HTTP (the ``s3_endpoint``
fixture); the conformance suite covers the shared contract.
"""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from persistkit import (
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    LeaseLostError,
)
from persistkit.backends import CheckpointRow, Head, open_backend
from persistkit.backends import _s3_keys as s3mod
from persistkit.backends.s3 import S3Backend

BUCKET = "persistkit-test"


def _row(
    t: str, i: int, *, ns: str = "", run: str | None = None, payload: bytes = b"p"
) -> CheckpointRow:
    parent = f"{i - 1:06d}" if i > 1 else None
    return CheckpointRow(t, ns, f"{i:06d}", parent, run, payload)


@pytest.fixture
def url(s3_endpoint: str) -> str:
    return f"s3://{BUCKET}/s3tests/{uuid.uuid4().hex[:10]}?endpoint_url={s3_endpoint}"


@pytest.fixture
def client(s3_endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def backend(url: str) -> Iterator[S3Backend]:
    b = open_backend(url)
    assert isinstance(b, S3Backend)
    yield b
    b.close()


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


def _keys(client: Any, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


# -- URL and options ------------------------------------------------------------------


def test_url_options_and_errors(s3_endpoint: str, client: Any) -> None:
    b = open_backend(f"s3://{BUCKET}/a/b/?endpoint_url={s3_endpoint}&region=us-east-1")
    assert isinstance(b, S3Backend) and b._root == "a/b/" and b._bucket == BUCKET
    b.close()
    b = open_backend(f"s3://{BUCKET}", client=client)  # no prefix, the user's client
    assert b._root == ""
    b.close()
    with pytest.raises(ConfigurationError, match="accepted: endpoint_url, region"):
        open_backend(f"s3://{BUCKET}/p?endpoint={s3_endpoint}")
    with pytest.raises(ConfigurationError, match="nope"):
        open_backend(f"s3://{BUCKET}/p", nope=1)
    with pytest.raises(ConfigurationError):
        open_backend(f"s3://{BUCKET}/p?client=x")
    with pytest.raises(ConfigurationError):
        open_backend("s3:///just-a-path")


def test_keyword_options_override_the_query(s3_endpoint: str) -> None:
    b = open_backend(f"s3://{BUCKET}/kw?endpoint_url=http://127.0.0.1:1", endpoint_url=s3_endpoint)
    t = uuid.uuid4().hex
    assert b.write(_row(t, 1), {}, 0) == Head("000001", 1)
    b.close()


# -- key encoding ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "ids",
    [
        [
            "a",
            "a-",
            "a!",
            "a/",
            "a\x01",
            "a\U0001f9f5",
            "a\u00e9",
            "aa",
            "a ",
            "a~",
            "a_",
            "aZ",
            "b",
        ],
        ["", "\x01", "\x7f", "\u0080", "\u07ff", "\u0800", "\uffff", "\U00010000", "\U0010ffff"],
        ["x" * 240, "x" * 241, "x" * 239, "x" * 240 + "\x01", "x" * 300, "y"],
    ],
)
def test_thread_segments_sort_like_ids_and_keep_prefixes(ids: list[str]) -> None:
    segs = {t: s3mod._thread_seg(t) + "!" for t in ids}
    short = [t for t in ids if len(t.encode()) <= 240]
    assert sorted(short, key=segs.__getitem__) == sorted(short)
    for t in ids:
        assert all(c in s3mod._SORTED + "." for c in s3mod._thread_seg(t))
        for p in ids:
            if t.startswith(p):
                assert segs[t].startswith(s3mod._prefix_seg(p)), (p, t)
    for t in short:
        assert s3mod._unb64(s3mod._thread_seg(t)).decode() == t


def test_unicode_ids_are_key_safe_and_listed_in_order(backend: S3Backend, client: Any) -> None:
    p = f"uni-{uuid.uuid4().hex[:6]}"
    ids = [
        p + s for s in ["/../x", "a b", "%41", "🧵", "線", "\n", "?", "#frag", "x" * 400, "x" * 401]
    ]
    for t in ids:
        backend.write(_row(t, 1), {"k": t.encode()}, 0)
    keys = _keys(client, backend._root)
    # every key is printable ASCII: no raw '/', unicode or control bytes from the ids
    assert all(k.isascii() and k.isprintable() for k in keys)
    assert all(k[len(backend._root) :].count("/") == 1 for k in keys)
    assert backend.threads(prefix=p) == sorted(ids)
    assert backend.threads(prefix=p, after=p + "x" * 400, limit=1) == [p + "x" * 401]
    for t in ids:
        assert backend.get_blobs(t, ["k"]) == {"k": t.encode()}


# -- conditional writes ------------------------------------------------------------------


def test_moto_supports_conditional_puts(client: Any) -> None:
    """The store relies on If-None-Match: * and If-Match on PutObject (AWS: since 2024)."""
    key = f"cond/{uuid.uuid4().hex}"
    etag = client.put_object(Bucket=BUCKET, Key=key, Body=b"1", IfNoneMatch="*")["ETag"]
    with pytest.raises(Exception, match="PreconditionFailed"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b"2", IfNoneMatch="*")
    client.put_object(Bucket=BUCKET, Key=key, Body=b"2", IfMatch=etag)
    with pytest.raises(Exception, match="PreconditionFailed"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b"3", IfMatch=etag)
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"2"


def test_cas_race_exactly_one_wins_each_round(url: str) -> None:
    writers, rounds = 6, 8
    instances = [open_backend(url) for _ in range(writers)]  # separate caches, like processes
    t = f"race-{uuid.uuid4().hex}"
    try:
        for version in range(rounds):
            barrier = threading.Barrier(writers, timeout=60)

            def attempt(
                w: int, v: int = version, barrier: threading.Barrier = barrier
            ) -> Head | ConflictError:
                row = CheckpointRow(t, "", f"{v + 1:06d}-{w}", None, None, f"w{w}".encode())
                barrier.wait()
                try:
                    return instances[w].write(row, {}, v)
                except ConflictError as exc:
                    return exc

            with ThreadPoolExecutor(writers) as pool:
                results = list(pool.map(attempt, range(writers)))
            winners = [r for r in results if isinstance(r, Head)]
            assert len(winners) == 1, results
            for r in results:
                if isinstance(r, ConflictError):
                    assert r.expected == version and r.found == version + 1
        head = instances[0].head(t, "")
        assert head is not None and head.version == rounds
        assert len(instances[0].list(t, "")) == rounds
    finally:
        for b in instances:
            b.close()


def test_orphan_rows_from_a_lost_cas_are_invisible(
    backend: S3Backend, client: Any, url: str
) -> None:
    t = f"orphan-{uuid.uuid4().hex}"
    backend.write(_row(t, 1), {}, 0)
    # A second instance writes version 2 first; our cached ETag is now stale.
    other = open_backend(url)
    other.write(_row(t, 2, payload=b"winner"), {}, 1)
    rows_prefix = backend._rows_prefix(t, "")
    # Simulate the worst case: a loser's row object left behind (crash before cleanup),
    # and a crashed writer's row for a version that never committed.
    for token, prev, cid in [
        ("dead0000dead0000", "0", "000002"),
        ("feed0000feed0000", "x", "000009"),
    ]:
        key = f"{rows_prefix}{s3mod._seg(cid, 'c')}!*!{token}!{prev}"
        client.put_object(
            Bucket=BUCKET, Key=key, Body=s3mod._encode_row(_row(t, 2, payload=b"orphan"), [])
        )
    with pytest.raises(ConflictError) as info:
        backend.write(_row(t, 2, payload=b"loser"), {"lost": b"x"}, 1)
    assert (info.value.found, info.value.found_checkpoint) == (2, "000002")
    got = backend.get(t, "", "000002")
    assert got is not None and got.payload == b"winner"
    assert [r.payload for r in backend.list(t, "")] == [b"winner", b"p"]
    assert backend.get(t, "", "000009") is None
    # The loser's new blob stays, unreferenced: deleting it could race a writer
    # that found it present and committed a reference (atomic_blobs = False).
    assert backend.get_blobs(t, ["lost"]) == {"lost": b"x"}
    # the lost write cleaned up its own row; the two planted ones remain until delete_thread
    assert len(_keys(client, rows_prefix)) == 4
    assert backend.delete_thread(t) and _keys(client, rows_prefix) == []
    assert backend.get_blobs(t, ["lost"]) == {}
    other.close()


def test_cleanup_keeps_blobs_the_winner_references(url: str, client: Any) -> None:
    t = f"shared-{uuid.uuid4().hex}"
    a, b = open_backend(url), open_backend(url)
    assert isinstance(a, S3Backend)
    a.write(_row(t, 1), {}, 0)
    b.head(t, "")  # b caches version 1
    a.write(_row(t, 2), {"same": b"content"}, 1)
    # b loses with the same blob key; it did not create the blob, so nothing of it is deleted
    with pytest.raises(ConflictError):
        b.write(_row(t, 2), {"same": b"content"}, 1)
    assert a.get_blobs(t, ["same"]) == {"same": b"content"}
    a.close()
    b.close()


# -- requests per operation -----------------------------------------------------------------


def test_requests_per_write(s3_endpoint: str, client: Any) -> None:
    b = open_backend(f"s3://{BUCKET}/count/{uuid.uuid4().hex[:8]}", client=client)
    counter = _Counter(client)
    t = "counted"
    b.write(_row(t, 1), {}, 0)
    assert counter.take() == {"GetObject": 1, "PutObject": 2}  # head check, row, head
    b.write(_row(t, 2), {}, 1)
    assert counter.take() == {"PutObject": 2}  # steady state: row + conditional head
    b.write(_row(t, 3), {"b1": b"1", "b2": b"2"}, 2)
    assert counter.take() == {"PutObject": 4}  # + one per blob
    assert b.head(t, "") == Head("000003", 3)
    assert counter.take() == {"GetObject": 1}
    assert b.get(t, "", "000003") is not None
    assert counter.take() == {"GetObject": 2}
    assert len(b.list(t, "", limit=2)) == 2
    assert counter.take() == {"GetObject": 3, "ListObjectsV2": 1}
    with pytest.raises(ConflictError):
        b.write(_row(t, 9), {"b9": b"9"}, 1)  # stale: detected before anything is written
    assert counter.take() == {"GetObject": 1}
    b.close()


def test_requests_of_a_new_holder(s3_endpoint: str, client: Any) -> None:
    """Taking a thread's lease seals its head (a placeholder when it has none) and keeps
    what it wrote, so the holder's first write reads neither the head nor the lease."""
    b = open_backend(f"s3://{BUCKET}/count/{uuid.uuid4().hex[:8]}", client=client)
    counter = _Counter(client)
    assert b.lease_swap("new", "", 0, 1, b"")
    assert counter.take() == {"GetObject": 2, "PutObject": 2}  # lease, head; lease, placeholder
    b.write_fenced(_row("new", 1), {}, 0, 1)
    assert counter.take() == {"PutObject": 2}  # row, head
    assert b.lease_swap("new", "", 1, 2, b"")  # a new holder of a written thread
    assert counter.take() == {"GetObject": 2, "PutObject": 2}  # lease, head; lease, sealed head
    b.write_fenced(_row("new", 2), {}, 1, 2)
    assert counter.take() == {"PutObject": 2}
    b.close()


# -- errors ----------------------------------------------------------------------------------


def test_closed_port_is_backend_unavailable() -> None:
    import boto3
    from botocore.config import Config

    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        fast = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            config=Config(retries={"max_attempts": 1}, connect_timeout=1),
        )
        b = open_backend(f"s3://{BUCKET}/p", client=fast)
        with pytest.raises(BackendUnavailableError) as info:
            b.head("t", "")
        assert info.value.__cause__ is not None
        with pytest.raises(BackendUnavailableError):
            b.write(_row("t", 1), {"k": b"v"}, 0)


def test_missing_bucket_is_a_configuration_error(s3_endpoint: str) -> None:
    """A wrong bucket is a wrong URL (docs/backends.md), as a missing PostgreSQL database is:
    not an empty store, and nothing to retry."""
    b = open_backend(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p?endpoint_url={s3_endpoint}")
    with pytest.raises(ConfigurationError, match="NoSuchBucket"):
        b.head("t", "")  # a missing bucket is not an empty store
    with pytest.raises(ConfigurationError) as info:
        b.threads()
    assert not isinstance(info.value, BackendUnavailableError)
    assert "bucket does not exist" in str(info.value)
    b.close()


def test_list_pages_past_one_thousand_keys(s3_endpoint: str, client: Any) -> None:
    """ListObjectsV2 returns at most 1000 keys; the store follows continuation tokens."""
    b = open_backend(f"s3://{BUCKET}/many/{uuid.uuid4().hex[:8]}", client=client)
    t = "paged"
    b.put_blobs(t, {f"k{i:04d}": b"v" for i in range(1100)})
    counter = _Counter(client)
    keys = list(b._list(b._blob_prefix(t)))
    assert len(keys) == 1100 and counter.take() == {"ListObjectsV2": 2}
    assert len(b.scan_blobs(t, "k1050", "k1100")) == 50
    b.close()


# -- leases: a holder paused at its first write ------------------------------------------------


class _PausingClient:
    """A boto3 client that holds one chosen head write until released: the holder is
    paused between its fence checks (all made before it writes anything) and the head
    creation, the window a takeover must close. Coordinated by events, never by time."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.armed = False
        self.paused = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_object(self, **kwargs: Any) -> Any:
        if self.armed and "/h/" in kwargs["Key"]:
            self.armed = False
            self.paused.set()
            assert self.release.wait(timeout=120), "the test never released the paused holder"
        return self._client.put_object(**kwargs)


def _write_while_taken_over(holder: Any, pausing: _PausingClient, other: Any, t: str, version: int) -> BaseException:
    """The holder (token 1) writes; paused before its head write, ``other`` takes the lease
    over (token 2) and its swap returns; then the holder goes on. Returns what it raised."""
    raised: list[BaseException] = []

    def write() -> None:
        try:
            holder.write_fenced(_row(t, version + 1), {"k": b"v"}, version, 1)
        except BaseException as exc:
            raised.append(exc)

    pausing.armed = True
    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert pausing.paused.wait(timeout=120)
        assert other.lease_swap(t, "", 1, 2, b"")  # the takeover has returned
    finally:
        pausing.release.set()
        writer.join(timeout=120)
    assert not writer.is_alive() and len(raised) == 1, raised
    return raised[0]


@pytest.fixture
def pausing(client: Any) -> _PausingClient:
    return _PausingClient(client)


def test_a_takeover_fences_a_holder_paused_at_its_first_write(
    url: str, pausing: _PausingClient, backend: S3Backend
) -> None:
    holder = open_backend(url, client=pausing)
    t = f"paused-{uuid.uuid4().hex}"
    assert holder.lease_swap(t, "", 0, 1, b"")
    err = _write_while_taken_over(holder, pausing, backend, t, 0)
    assert isinstance(err, LeaseLostError) and (err.token, err.found) == (1, 2)
    assert backend.head(t, "") is None and backend.list(t, "") == []
    assert backend.threads(prefix=t) == []
    assert backend.write_fenced(_row(t, 1), {}, 0, 2) == Head("000001", 1)  # the new holder goes on
    assert [r.payload for r in backend.list(t, "")] == [b"p"]
    holder.close()


def test_a_takeover_fences_a_holder_paused_after_its_thread_was_deleted(
    url: str, pausing: _PausingClient, backend: S3Backend
) -> None:
    """No head at all (``delete_thread`` removed it under a live lease): the holder checks
    the lease object, then pauses before creating the head; the takeover seals a placeholder."""
    holder = open_backend(url, client=pausing)
    t = f"deleted-{uuid.uuid4().hex}"
    assert holder.lease_swap(t, "", 0, 1, b"")
    holder.write_fenced(_row(t, 1), {}, 0, 1)
    assert holder.delete_thread(t) is True
    err = _write_while_taken_over(holder, pausing, backend, t, 0)
    assert isinstance(err, LeaseLostError) and (err.token, err.found) == (1, 2)
    assert backend.head(t, "") is None and backend.threads(prefix=t) == []
    holder.close()


def test_placeholder_heads_are_told_apart_by_size(s3_endpoint: str, client: Any) -> None:
    """``threads`` and ``namespaces`` skip placeholders by the listed size: the largest
    placeholder must stay under the limit and the smallest real head above it."""
    assert len(s3mod._placeholder_body(2**63)) <= s3mod._PLACEHOLDER_MAX_BYTES
    b = open_backend(f"s3://{BUCKET}?endpoint_url={s3_endpoint}")  # no prefix: the shortest keys
    t = f"{uuid.uuid4().hex[:1]}"
    try:
        b.write(CheckpointRow(t, "", "1", None, None, b""), {}, 0)
        size = client.head_object(Bucket=BUCKET, Key=b._head_key(t, ""))["ContentLength"]
        assert size > s3mod._PLACEHOLDER_MAX_BYTES
    finally:
        b.delete_thread(t)
        b.close()


def test_placeholders_of_long_ids_and_namespaces_are_no_thread(backend: S3Backend) -> None:
    """Ids over 240 bytes and long namespaces have hashed keys, which listings resolve
    by reading heads: a placeholder must be skipped before that."""
    base = f"long-{uuid.uuid4().hex}-" + "x" * 300
    ns = "n" * 200
    assert backend.lease_swap(base + "a", ns, 0, 1, b"")
    assert backend.lease_swap(base + "b", "", 0, 1, b"")
    backend.write_fenced(_row(base + "b", 1), {}, 0, 1)
    assert backend.lease_swap(base + "b", ns, 0, 1, b"")
    assert backend.threads(prefix=base) == [base + "b"]
    assert backend.namespaces(base + "a") == [] and backend.namespaces(base + "b") == [""]
    assert backend.delete_thread(base + "a") is False
