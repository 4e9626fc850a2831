"""Spans: the small segments of a long list gathered into blobs (``state._channels``).

A list appended to at every step is stored as one segment per checkpoint row; a
thread of 50,000 steps would be 50,000 rows to decode on every load. Every
``SPAN_SEGMENTS`` inline segments the next checkpoint writes a span instead: one
blob holding their items and its own. These tests lower the threshold and check
what must hold whatever the chain looks like: every checkpoint of the thread loads
its own list (time travel reads through rows and spans alike), a new store object
(a new process) continues gathering where the last run stopped, secrets stay
handles and text that only looks like a handle comes back as it was, large
segments are not gathered, an older chain of many rows is continued, and a prune
of a spanned thread keeps every kept checkpoint loading and verifying.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.state import _channels, _tracker
from persistkit.state._records import Record

ENC = bytes(range(32))
MAC = bytes(range(7, 39))
SECRET = "sk-proj-Sp4nQ81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"
LOOKALIKE = "user text: $CRED{env:NOT_A_HANDLE} stays as typed"
CONFIGS = ["plain", "secrets", "sealed", "offload"]


class Log(pk.State, name="tests.spans.Log"):
    log: list[Any] = []


def item(i: int, config: str) -> Any:
    text = f"item {i} " + "x" * 40
    if config == "secrets" and i % 5 == 1:
        text += f" key {SECRET}"
    if i % 7 == 3:
        text += " " + LOOKALIKE
    return text if i % 2 == 0 else {"role": "assistant", "content": text, "i": i}


@pk.checkpointed(name="spans.reply")
def reply(i: int, config: str) -> Any:
    return item(i, config)


def open_store(url: str, config: str, tmp: Path) -> pk.Store:
    if config == "secrets":
        pk.secrets.register("spans_test_key", SECRET)
    if config == "sealed":
        return pk.connect(
            url, encryption={"a": ENC}, integrity={"m": MAC}, witness=f"file:{tmp}/witness.log"
        )
    if config == "offload":
        return pk.connect(url, blobs=f"memory://spans-blobs-{tmp.name}", blob_threshold=64)
    return pk.connect(url)


def run_steps(store: pk.Store, tid: str, config: str, indices: range) -> None:
    with pk.resume(tid, store=store, state=Log) as run:
        for i in indices:
            run.state.log.append(reply(i, config))  # the step's result: stored as a reference to it


def resolved(value: Any) -> Any:
    return pk.secrets.resolve(list(value)) if isinstance(value, list) else value


def chain(store: pk.Store, tid: str) -> list[str]:
    """The segment keys of the head's list, oldest first."""
    head = store.backend.head(tid, "")
    assert head is not None
    row = store.backend.get(tid, "", head.checkpoint_id)
    assert row is not None
    rec = Record.decode(store.codec, row)
    loader = _channels.Loader(store.codec, tid)
    store.run_sync(loader.fetch([rec.refs]))
    return loader.segment_keys("log", rec.refs["log"])


def check_every_checkpoint(store: pk.Store, tid: str, config: str) -> None:
    """Each checkpoint's list is the items appended up to it, in order, exactly."""
    seen = 0
    for cp in store.history(tid, limit=1000):
        got = resolved(store.get_state(tid, cp.checkpoint_id)["log"])
        assert got == [item(i, config) for i in range(len(got))], f"checkpoint {cp.checkpoint_id}"
        seen += 1
    assert seen > 10


@pytest.fixture
def spans_every_three(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tracker, "SPAN_SEGMENTS", 3)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_spanned_list_loads_at_every_checkpoint_and_keeps_gathering_in_a_new_store(
    store_url: str, config: str, tmp_path: Path, spans_every_three: None
) -> None:
    tid = uid("sp")
    store = open_store(store_url, config, tmp_path)
    run_steps(store, tid, config, range(0, 14))
    keys = chain(store, tid)
    assert any(k.startswith("s:") for k in keys), keys
    # the newest span covers all but the last few segments: the rest of the chain is spans
    tail = len(keys) - 1 - max(i for i, k in enumerate(keys) if k.startswith("s:"))
    assert tail <= 3, keys
    # a new store object (as a new process): its first run continues the gathering from
    # the stored tail (a mix of segments read back and segments it writes)
    again = store if store_url.startswith("memory") else open_store(store_url, config, tmp_path)
    run_steps(again, tid, config, range(14, 31))
    keys = chain(again, tid)
    rows = [k for k in keys if not k.startswith("s:")]
    assert len(rows) <= 3, f"{len(rows)} row segments in the head's chain: {keys}"
    assert len(keys) <= 31 // 4 + 4, keys
    check_every_checkpoint(again, tid, config)
    if config == "secrets":
        raw = b"".join(r.payload for r in again.backend.list(tid, ""))
        raw += b"".join(again.backend.scan_blobs(tid, "", "~").values())
        assert SECRET.encode() not in raw
    if config == "sealed":
        assert again.verify(tid).ok


def test_large_segments_are_not_gathered(
    local_store: pk.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tracker, "SPAN_SEGMENTS", 3)
    monkeypatch.setattr(_tracker, "SPAN_BYTES", 10_000)
    tid = uid("sp")
    with pk.resume(tid, store=local_store) as run:
        for i in range(12):
            run.state.setdefault("log", []).append(f"{i} " + "y" * 6_000)
    keys = chain(local_store, tid)
    assert not any(k.startswith("s:") for k in keys)
    assert local_store.get_state(tid)["log"] == [f"{i} " + "y" * 6_000 for i in range(12)]


def test_a_long_chain_of_rows_is_continued_with_spans(
    local_store: pk.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain written without spans (before them, or with a higher threshold) gathers only its
    newest segments: a span never reaches back over more than SPAN_SEGMENTS rows."""
    tid = uid("sp")
    run_steps(local_store, tid, "plain", range(0, 40))
    assert not any(k.startswith("s:") for k in chain(local_store, tid))
    monkeypatch.setattr(_tracker, "SPAN_SEGMENTS", 5)
    run_steps(local_store, tid, "plain", range(40, 52))
    keys = chain(local_store, tid)
    spans = [k for k in keys if k.startswith("s:")]
    assert spans and len(keys) < 52, keys
    blobs = local_store.backend.get_blobs(tid, spans)
    for key in spans:
        seg = local_store.codec.unpack_tree(blobs[key])
        assert len(seg["i"]) <= 6 * 2, (key, len(seg["i"]))  # <= 6 segments (5 gathered + its own)
    check_every_checkpoint(local_store, tid, "plain")


def test_a_pruned_spanned_thread_loads_and_verifies(
    store_url: str, tmp_path: Path, spans_every_three: None
) -> None:
    tid = uid("sp")
    store = open_store(store_url, "sealed", tmp_path)
    run_steps(store, tid, "sealed", range(0, 20))
    run_steps(store, tid, "sealed", range(20, 30))
    report = store.prune(pk.Retention(keep_last=3), thread_id=tid, progress=False)
    assert report.checkpoints > 0 and report.bytes_after < report.bytes_before
    assert store.verify(tid).ok
    kept = store.history(tid)
    assert len(kept) == 3
    for cp in kept:
        got = resolved(store.get_state(tid, cp.checkpoint_id)["log"])
        assert len(got) >= 28 and got == [item(i, "sealed") for i in range(len(got))]
    run_steps(store, tid, "sealed", range(30, 36))
    assert resolved(store.get_state(tid)["log"]) == [item(i, "sealed") for i in range(36)]
    assert store.verify(tid).ok
