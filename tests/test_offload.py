"""OffloadBackend: large blobs in S3 (moto over HTTP), pointers in the primary store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from persistkit import ConfigurationError, ConflictError, IntegrityError
from persistkit.backends import Backend, CheckpointRow, Head, open_backend
from persistkit.wrappers._offload import OffloadBackend

THRESHOLD = 1024
BIG = bytes(range(256)) * 40  # 10 KiB > THRESHOLD
SMALL = b"small value"


def _row(t: str, i: int) -> CheckpointRow:
    return CheckpointRow(t, "", f"{i:06d}", f"{i - 1:06d}" if i > 1 else None, None, b"p")


@pytest.fixture
def blob_url(s3_endpoint: str) -> str:
    return f"s3://persistkit-test/offload/{uuid.uuid4().hex[:10]}?endpoint_url={s3_endpoint}"


@pytest.fixture(params=["memory", "sqlite"])
def primary_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://offload-{uuid.uuid4().hex[:8]}"
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture
def parts(primary_url: str, blob_url: str) -> Iterator[tuple[OffloadBackend, Backend, Backend]]:
    """(the offloading store, a direct view of its primary, a direct view of its blob store)."""
    store = OffloadBackend(open_backend(primary_url), open_backend(blob_url), threshold=THRESHOLD)
    primary, blobs = open_backend(primary_url), open_backend(blob_url)
    yield store, primary, blobs
    for b in (store, primary, blobs):
        b.close()


def test_large_blobs_leave_a_pointer_small_ones_stay(
    parts: tuple[OffloadBackend, Backend, Backend],
) -> None:
    store, primary, blobs = parts
    t = f"t-{uuid.uuid4().hex}"
    assert store.write(_row(t, 1), {"big": BIG, "small": SMALL}, 0) == Head("000001", 1)
    raw = primary.get_blobs(t, ["big", "small"])
    assert raw["small"] == SMALL
    assert raw["big"].startswith(b"\x00PKREF") and len(raw["big"]) < 200
    assert blobs.get_blobs(t, ["big", "small"]) == {"big": BIG}
    assert store.get_blobs(t, ["big", "small", "missing"]) == {"big": BIG, "small": SMALL}
    assert store.scan_blobs(t, "", "~") == {"big": BIG, "small": SMALL}
    assert store.head(t, "") == Head("000001", 1) and store.list(t, "") == [_row(t, 1)]
    assert store.threads(prefix=t) == [t]


def test_threshold_edge_and_marker_lookalikes(
    parts: tuple[OffloadBackend, Backend, Backend],
) -> None:
    store, primary, _ = parts
    t = f"t-{uuid.uuid4().hex}"
    at_limit = b"x" * THRESHOLD
    lookalike = b"\x00PKREF1:3:abc:evil"  # small, but must never be read back as a pointer
    store.put_blobs(t, {"edge": at_limit, "look": lookalike})
    raw = primary.get_blobs(t, ["edge", "look"])
    assert raw["edge"] == at_limit and raw["look"] != lookalike
    assert store.get_blobs(t, ["edge", "look"]) == {"edge": at_limit, "look": lookalike}


def test_existing_keys_keep_their_bytes(parts: tuple[OffloadBackend, Backend, Backend]) -> None:
    store, _, _ = parts
    t = f"t-{uuid.uuid4().hex}"
    store.put_blobs(t, {"k": BIG})
    store.put_blobs(t, {"k": BIG[::-1]})
    assert store.get_blobs(t, ["k"]) == {"k": BIG}


def test_missing_offloaded_object_is_an_integrity_error(
    parts: tuple[OffloadBackend, Backend, Backend],
) -> None:
    store, _, blobs = parts
    t = f"lost-{uuid.uuid4().hex}"
    store.write(_row(t, 1), {"big": BIG}, 0)
    blobs.delete_thread(t)  # the blob store lost the object
    with pytest.raises(IntegrityError, match=rf"{t}.*'big'"):
        store.get_blobs(t, ["big"])
    with pytest.raises(IntegrityError):
        store.scan_blobs(t, "", "~")


def test_altered_offloaded_object_is_an_integrity_error(
    parts: tuple[OffloadBackend, Backend, Backend],
) -> None:
    store, _, blobs = parts
    t = f"bad-{uuid.uuid4().hex}"
    store.write(_row(t, 1), {"big": BIG}, 0)
    blobs.delete_thread(t)
    blobs.put_blobs(t, {"big": BIG[:-1] + b"!"})
    with pytest.raises(IntegrityError, match="does not match"):
        store.get_blobs(t, ["big"])


def test_conflict_leaves_nothing_visible(parts: tuple[OffloadBackend, Backend, Backend]) -> None:
    store, _, _ = parts
    t = f"c-{uuid.uuid4().hex}"
    store.write(_row(t, 1), {}, 0)
    with pytest.raises(ConflictError):
        store.write(_row(t, 2), {"big": BIG}, 0)
    assert store.get_blobs(t, ["big"]) == {}


def test_delete_thread_cleans_both(parts: tuple[OffloadBackend, Backend, Backend]) -> None:
    store, primary, blobs = parts
    t = f"d-{uuid.uuid4().hex}"
    store.write(_row(t, 1), {"big": BIG, "small": SMALL}, 0)
    assert store.delete_thread(t) is True
    assert primary.get_blobs(t, ["big", "small"]) == {} and primary.head(t, "") is None
    assert blobs.get_blobs(t, ["big"]) == {}
    assert store.delete_thread(t) is False


def test_async_twins(parts: tuple[OffloadBackend, Backend, Backend]) -> None:
    store, primary, blobs = parts
    t = f"a-{uuid.uuid4().hex}"
    assert store.native_async is primary.native_async

    async def scenario() -> None:
        assert await store.awrite(_row(t, 1), {"big": BIG, "small": SMALL}, 0) == Head("000001", 1)
        await store.aput_blobs(t, {"big2": BIG[::-1]})
        assert await store.aget_blobs(t, ["big", "big2", "small"]) == {
            "big": BIG, "big2": BIG[::-1], "small": SMALL,
        }  # fmt: skip
        assert await store.ascan_blobs(t, "big", "c") == {"big": BIG, "big2": BIG[::-1]}
        assert await store.ahead(t, "") == Head("000001", 1)
        assert await store.aget(t, "", "000001") == _row(t, 1)
        assert await store.alist(t, "") == [_row(t, 1)]
        assert await store.athreads(prefix=t) == [t]
        assert await store.adelete_thread(t) is True
        assert await blobs.aget_blobs(t, ["big", "big2"]) == {}

    asyncio.run(scenario())


def test_construction_errors(blob_url: str) -> None:
    with pytest.raises(ConfigurationError):
        OffloadBackend(open_backend("memory://"), open_backend(blob_url), threshold=-1)
    with pytest.raises(ConfigurationError, match="blobs="):
        OffloadBackend.from_url("memory://")
