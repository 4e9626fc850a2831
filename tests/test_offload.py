"""OffloadBackend: large blobs in S3 (moto over HTTP), pointers in the primary store."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_url, uid

import persistkit as pk
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


# -- offload of everything big, through the whole stack (issue 13, item 8) ----------------------
#
# Items appended to a list channel travel inside the step's checkpoint row (payload
# key ``sg``), not as blobs: the threshold applies to row payloads too. Every base
# store, offloading to a second store, alone and under encryption and integrity.

STACK_THRESHOLD = 16 * 1024
ENC = bytes(range(32))
ENC2 = bytes(range(1, 33))
MAC = bytes(range(7, 39))


class Tools(pk.State, name="tests.offload.Tools"):
    outputs: list[str] = []
    notes: str = ""


def _big(tag: str, size: int = 96 * 1024) -> str:
    """Incompressible text, with a tag so each value differs."""
    return tag + base64.b64encode(os.urandom(size * 3 // 4)).decode()


@pk.checkpointed(name="offload.tool")
def tool(output: str) -> str:
    """A tool step: its output is appended to the list inside the step, and returned."""
    run = pk.current_run()
    assert run is not None
    run.state.outputs.append(output)
    return output


@pk.checkpointed(name="offload.fetch")
def fetch(output: str) -> str:
    return output


def _layers(kind: str, tmp: Path) -> dict[str, Any]:
    if kind == "plain":
        return {}
    if kind == "encrypted":
        return {"encryption": {"k": ENC}}
    return {"encryption": {"k": ENC}, "integrity": {"m": MAC}, "witness": f"file:{tmp}/witness.log"}


def _raw_bytes(primary: Backend, t: str) -> list[bytes]:
    """Every row payload and blob the primary store holds for thread ``t``."""
    return [r.payload for r in primary.list(t, "")] + list(primary.scan_blobs(t, "", "\x7f").values())


@pytest.mark.parametrize("layers", ["plain", "encrypted", "encrypted+integrity"])
def test_big_list_items_results_and_values_are_offloaded(
    store_url: str,
    layers: str,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    blob_url = make_url("sqlite", request, tmp_path_factory)
    opts = {"blobs": blob_url, "blob_threshold": STACK_THRESHOLD, **_layers(layers, tmp_path)}
    t, r = uid("offload"), f"run-{uuid.uuid4().hex[:8]}"
    inside, after, result, note = _big("inside"), _big("after"), _big("result"), _big("note")
    with pk.connect(store_url, **opts) as store, pk.resume(t, store=store, state=Tools, run_id=r) as run:
        tool(inside)  # appended inside the step: the step's row carries it
        run.state.outputs.append(fetch(after))  # appended by the caller: the end row carries it
        run.state.notes = note  # a channel value: a blob
        fetch(result)  # a big step result: a blob
        tool("small")  # a small item stays inline

    # The primary holds pointers only: no payload or blob near the size of one item,
    # and none of the items' bytes (without encryption they would be readable).
    primary = open_backend(store_url)
    try:
        raw = _raw_bytes(primary, t)
    finally:
        primary.close()
    assert raw and max(len(b) for b in raw) < STACK_THRESHOLD, sorted(len(b) for b in raw)[-3:]
    assert sum(len(b) for b in raw) < 64 * 1024
    for value in (inside, after, result, note):
        assert not any(value[100:164].encode() in b for b in raw)
    secondary = open_backend(blob_url)
    try:
        # Four big values, "after" once: the item appended by the caller refers to its step's result.
        held = sum(len(b) for b in secondary.scan_blobs(t, "", "\x7f").values())
        assert 4 * 96 * 1024 * 0.9 < held < 5 * 96 * 1024, held
    finally:
        secondary.close()

    # A new Store object reads it all back: resume replays, get_state, history.
    with pk.connect(store_url, **opts) as store:
        with pk.resume(t, store=store, state=Tools, run_id=r) as again:
            assert tool(inside) == inside
            again.state.outputs.append(fetch(after))
            again.state.notes = note
            assert fetch(result) == result
            tool("small")
        assert not again.executed
        state = store.get_state(t, state=Tools)
        assert state.outputs == [inside, after, "small"] and state.notes == note
        history = store.history(t)
        assert [c.kind for c in history] == ["end", "step", "step", "step", "step"]
        assert store.get_state(t, history[-1].checkpoint_id, state=Tools).outputs == [inside]
        if layers == "encrypted+integrity":
            assert store.verify(t).ok
    if layers != "plain":  # key rotation re-seals offloaded rows and blobs through rewrite()
        rotated = {**opts, "encryption": {"k": ENC, "k2": ENC2}}
        with pk.connect(store_url, **rotated) as store:
            assert store.rotate_keys(t).rows_resealed == 5
        with pk.connect(store_url, **{**opts, "encryption": {"k2": ENC2}}) as store:
            assert store.get_state(t, state=Tools).outputs == [inside, after, "small"]


def test_list_items_offloaded_async(tmp_path: Path, blob_url: str) -> None:
    """The async path (awrite, alist, aget) on a store with native async twins."""
    url = f"sqlite:///{tmp_path}/async.db"
    t = uid("aoff")
    item = _big("async")

    @pk.checkpointed(name="offload.atool")
    async def atool(output: str) -> None:
        run = pk.current_run()
        assert run is not None
        run.state.outputs.append(output)

    async def main() -> list[str]:
        store = pk.connect(url, blobs=blob_url, blob_threshold=STACK_THRESHOLD)
        async with pk.resume(t, store=store, state=Tools):
            await atool(item)
        fresh = pk.connect(url, blobs=blob_url, blob_threshold=STACK_THRESHOLD)
        state = await fresh.aget_state(t, state=Tools)
        await store.aclose()
        await fresh.aclose()
        return list(state.outputs)

    assert asyncio.run(main()) == [item]
    primary = open_backend(url)
    try:
        assert max(len(b) for b in _raw_bytes(primary, t)) < 1024
    finally:
        primary.close()


def test_offloaded_row_missing_is_an_integrity_error(
    parts: tuple[OffloadBackend, Backend, Backend],
) -> None:
    store, primary, blobs = parts
    t = f"t-{uuid.uuid4().hex}"
    row = CheckpointRow(t, "", "000001", None, "r", BIG)
    store.write(row, {}, 0)
    stored = primary.get(t, "", "000001")
    assert stored is not None and stored.payload.startswith(b"\x00PKREF") and len(stored.payload) < 200
    assert store.get(t, "", "000001") == row and store.list(t, "") == [row]
    blobs.delete_thread(t)
    with pytest.raises(IntegrityError, match=r"checkpoint 000001.*missing"):
        store.list(t, "")
    with pytest.raises(IntegrityError, match=r"checkpoint 000001.*missing"):
        store.get(t, "", "000001")


def test_an_offloaded_row_read_without_blobs_names_the_option(tmp_path: Path) -> None:
    """A store holding offloaded rows, opened without ``blobs=``: a clear error, not 'unknown envelope 0x00'."""
    url = f"sqlite:///{tmp_path}/main.db"
    store = pk.connect(url, blobs=f"sqlite:///{tmp_path}/blobs.db", blob_threshold=1024)
    with store, pk.resume("t", store=store) as run:
        run.state["items"] = [fetch(_big("big", 5000))]
        fetch("small")
    with pk.connect(url) as plain, pytest.raises(pk.SerializationError, match=r"blobs="):
        plain.get_state("t")
