"""S3 prune (retention) beyond the shipped suite: the chain of rows after a prune that
was interrupted, rows pruned above a kept one (empty markers that keep the chain
linked), a reader that listed before a prune, very long checkpoint ids, blob listings.

Against moto's server over real HTTP (the ``s3_endpoint`` fixture)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from persistkit import BackendUnavailableError
from persistkit.backends import CheckpointRow
from persistkit.backends.s3 import S3Backend

BUCKET = "persistkit-test"


@pytest.fixture
def url(s3_endpoint: str) -> str:
    return f"s3://{BUCKET}/s3prune/{uuid.uuid4().hex[:10]}?endpoint_url={s3_endpoint}"


@pytest.fixture
def client(s3_endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def backend(url: str) -> Iterator[S3Backend]:
    b = S3Backend.from_url(url)
    yield b
    b.close()


class _Interrupting:
    """A boto3 client that dies (a lost connection) after ``budget`` deleted objects or
    empty-object puts: a prune interrupted part way, as by a crashed process."""

    def __init__(self, client: Any, budget: int) -> None:
        self._client = client
        self.budget = budget

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _spend(self) -> None:
        from botocore.exceptions import EndpointConnectionError

        if self.budget <= 0:
            raise EndpointConnectionError(endpoint_url="http://interrupted")
        self.budget -= 1

    def delete_objects(self, *, Bucket: str, Delete: dict[str, Any]) -> Any:
        for obj in Delete["Objects"]:
            self._spend()
            self._client.delete_object(Bucket=Bucket, Key=obj["Key"])
        return {}

    def put_object(self, **kwargs: Any) -> Any:
        if kwargs.get("Body") == b"":
            self._spend()
        return self._client.put_object(**kwargs)


def _cid(n: int) -> str:
    return f"{n:06d}"


def _chain(b: S3Backend, t: str, n: int, *, run: str | None = "run", ids: list[str] | None = None) -> list[str]:
    ids = ids or [_cid(i) for i in range(1, n + 1)]
    for i, cid in enumerate(ids):
        b.write(CheckpointRow(t, "", cid, ids[i - 1] if i else None, run, f"payload {cid}".encode()), {}, i)
    return ids


def _listed(b: S3Backend, t: str, **kw: Any) -> list[str]:
    return [r.checkpoint_id for r in b.list(t, "", **kw)]


def _row_objects(client: Any, b: S3Backend, t: str) -> dict[str, int]:
    """The thread's row objects: key (below the rows prefix) -> size."""
    prefix = b._rows_prefix(t, "")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"][len(prefix) :]: o["Size"] for page in pages for o in page.get("Contents", [])}


def test_an_interrupted_prune_leaves_the_older_part_off_the_chain(url: str, client: Any, backend: S3Backend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    ids = _chain(backend, t, 8)
    dying = S3Backend.from_url(url, client=_Interrupting(client, budget=3))
    try:
        with pytest.raises(BackendUnavailableError):
            dying.prune_rows(t, "", ids[:6])
    finally:
        dying.close()
    # newest first: 6 went alone first, which ended the chain above 1-5; then 5 and 4.
    # The three oldest are still stored but off the chain: no reader sees them
    assert _listed(backend, t) == [ids[7], ids[6]]
    assert len(_row_objects(client, backend, t)) == 5
    assert backend.get(t, "", ids[0]) is None
    assert _listed(backend, t, run_id="run") == [ids[7], ids[6]]
    head = backend.head(t, "")
    assert head is not None and head.version == 8
    # the next prune of the namespace deletes what is left below the oldest kept row
    assert backend.prune_rows(t, "", ids[:6]) == 0  # (none of it was still a row to readers)
    assert len(_row_objects(client, backend, t)) == 2
    backend.write(CheckpointRow(t, "", _cid(9), ids[7], "run", b"p"), {}, 8)  # the chain goes on
    assert _listed(backend, t) == [_cid(9), ids[7], ids[6]]


def test_newest_first_across_markers_and_the_bottom(url: str, client: Any, backend: S3Backend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    ids = _chain(backend, t, 6)
    # one request each time: 4 is marked first; then (4 is a marker now) 2 goes alone,
    # which takes 1 off the chain before the request that would delete it
    for visible in ([5, 4, 2, 1, 0], [5, 4, 2]):
        dying = S3Backend.from_url(url, client=_Interrupting(client, budget=1))
        try:
            with pytest.raises(BackendUnavailableError):
                dying.prune_rows(t, "", [ids[0], ids[1], ids[3]])
        finally:
            dying.close()
        assert _listed(backend, t) == [ids[i] for i in visible]
    assert backend.prune_rows(t, "", [ids[0], ids[1], ids[3]]) == 0
    assert _listed(backend, t) == [ids[5], ids[4], ids[2]]
    assert sorted(_row_objects(client, backend, t).values())[0] == 0  # the marker of 4
    assert len(_row_objects(client, backend, t)) == 4


def test_rows_pruned_above_a_kept_one_become_markers(client: Any, backend: S3Backend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    ids = _chain(backend, t, 6)
    # 2 and 4 sit above kept rows (1, 3): deleting them would cut 1 and 3 off the chain
    assert backend.prune_rows(t, "", [ids[1], ids[3]]) == 2
    assert _listed(backend, t) == [ids[5], ids[4], ids[2], ids[0]]
    assert _listed(backend, t, run_id="run", before=ids[4]) == [ids[2], ids[0]]
    assert backend.get(t, "", ids[1]) is None
    got = backend.get(t, "", ids[0])
    assert got is not None and got.payload == b"payload 000001"
    sizes = sorted(_row_objects(client, backend, t).values())
    assert sizes[:2] == [0, 0] and all(s > 0 for s in sizes[2:]) and len(sizes) == 6
    assert backend.prune_rows(t, "", [ids[1]]) == 0  # a marker is no row
    # the bottom now reaches the marker of 2: it goes with row 1; the marker of 4 stays
    assert backend.prune_rows(t, "", [ids[0]]) == 1
    assert _listed(backend, t) == [ids[5], ids[4], ids[2]]
    assert sorted(_row_objects(client, backend, t).values())[0] == 0
    assert len(_row_objects(client, backend, t)) == 4
    assert backend.prune_rows(t, "", [ids[2], ids[4]]) == 2
    assert _listed(backend, t) == [ids[5]] and len(_row_objects(client, backend, t)) == 1
    # key rotation (rewrite) skips what is gone and still finds the rest
    backend.rewrite(t, [CheckpointRow(t, "", ids[5], None, "run", b"new")], {})
    got = backend.get(t, "", ids[5])
    assert got is not None and got.payload == b"new"


def test_an_interrupted_marking_leaves_a_readable_chain(url: str, client: Any, backend: S3Backend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    ids = _chain(backend, t, 6)
    dying = S3Backend.from_url(url, client=_Interrupting(client, budget=1))
    try:
        with pytest.raises(BackendUnavailableError):
            dying.prune_rows(t, "", [ids[1], ids[3]])
    finally:
        dying.close()
    assert _listed(backend, t) == [ids[5], ids[4], ids[2], ids[1], ids[0]]  # 4 first: newest first
    assert backend.prune_rows(t, "", [ids[1], ids[3]]) == 1
    assert _listed(backend, t) == [ids[5], ids[4], ids[2], ids[0]]


def test_a_reader_that_listed_before_a_prune_skips_what_went(url: str, backend: S3Backend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    ids = _chain(backend, t, 5)
    pruner = S3Backend.from_url(url)
    listed = backend._chain_refs

    def list_then_prune(thread_id: str, namespace: str) -> Any:
        found = listed(thread_id, namespace)
        pruner.prune_rows(t, "", [ids[0], ids[2]])  # between the reader's listing and its reads
        return found

    backend._chain_refs = list_then_prune  # type: ignore[method-assign]
    try:
        assert _listed(backend, t) == [ids[4], ids[3], ids[1]]
    finally:
        del backend._chain_refs
        pruner.close()
    assert _listed(backend, t) == [ids[4], ids[3], ids[1]]


def test_very_long_checkpoint_ids(backend: S3Backend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    ids = _chain(backend, t, 0, ids=[f"{n:06d}-" + "x" * 200 for n in range(1, 6)])
    assert backend.prune_rows(t, "", [ids[0], ids[2]]) == 2
    assert _listed(backend, t) == [ids[4], ids[3], ids[1]]
    assert backend.prune_rows(t, "", ids) == 2
    assert _listed(backend, t) == [ids[4]]


def test_blobs_of_one_thread_only(backend: S3Backend) -> None:
    t = f"t-{uuid.uuid4().hex[:8]}"
    longer = t + "x"  # a thread id that extends t's: its keys must not be t's
    for thread in (t, longer):
        backend.write(CheckpointRow(thread, "", "c1", None, None, b"x"), {}, 0)
        backend.put_blobs(thread, {"v:a": b"12345", "v:b": b"", "v:c": b"1"})
    assert backend.blob_sizes(t) == {"v:a": 5, "v:b": 0, "v:c": 1}
    assert backend.delete_blobs(t, ["v:a", "v:b", "v:zz"]) == 2
    assert backend.blob_sizes(t) == {"v:c": 1}
    assert backend.blob_sizes(longer) == {"v:a": 5, "v:b": 0, "v:c": 1}
