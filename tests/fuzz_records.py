"""Fuzz target: stored bytes are untrusted input to every read path.

A small genuine store is built once (a state with typed values, a long list
channel with inline and blob segments, big results, a recorded failure, run
metadata, a fork and an edit). Each fuzz input picks one stored row or blob and
replaces its bytes with a mutation; then every read path runs over the edited
store: history, the state at every checkpoint, and a resume that replays the
thread's last run. The only outcomes allowed are a value or a
``PersistkitError`` subclass: any other exception is a bug.

Run by ``tests/test_fuzz.py`` (hypothesis, and atheris when it is installed):

    python tests/fuzz_records.py -runs=20000        # coverage-guided, with atheris
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import sys
import uuid
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import zstandard

import persistkit as pk
from persistkit.backends import CheckpointRow
from persistkit.backends.memory import MemoryBackend

TID = "fuzz-thread"


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Note:
    text: str
    at: datetime
    tags: frozenset[str] = frozenset()


pk.register(Level)
pk.register(Note)


@pk.checkpointed(name="fuzz.step")
def _step(i: int) -> Any:
    run = pk.current_run()
    assert run is not None
    run.state["log"].append({"i": i, "text": "message " * 30, "note": Note(f"n{i}", datetime(2024, 1, 1, tzinfo=UTC))})
    run.state["count"] = run.state.get("count", 0) + 1
    if i == 3:
        return {"big": "x" * 70_000, "when": timedelta(seconds=i)}  # past the inline limit: a blob
    return (i, decimal.Decimal("1.5"), uuid.UUID(int=i), Level.HIGH, b"\x00\xff", {1, 2})


@pk.checkpointed(name="fuzz.rewrite")
def _rewrite() -> None:
    run = pk.current_run()
    assert run is not None
    run.state["log"] = list(reversed(run.state["log"]))  # not an append: a new base segment, as a blob
    run.state["doc"] = {"body": "y" * 5000, "level": Level.LOW}  # a big channel value, as a blob


@pk.checkpointed(name="fuzz.fail")
def _fail() -> None:
    raise ValueError("boom with some text")


def build() -> tuple[dict[tuple[str, str], dict[str, CheckpointRow]], dict[str, dict[str, bytes]]]:
    """A genuine store's rows and blobs, as the memory backend holds them.

    Deterministic (a fake clock, fixed run ids), so that a crashing fuzz input
    replays against the same bytes in any later process.
    """
    import itertools
    import time
    from unittest import mock

    import persistkit._ids as ids

    clock = itertools.count(1_700_000_000_000)
    runs = (f"{i:032x}" for i in itertools.count(1))
    ids.reset()
    with (
        mock.patch.object(time, "time", lambda: next(clock) / 1000),
        mock.patch.object(ids, "_time_ns", lambda: next(clock) * 1_000_000),
        mock.patch.object(ids, "_getrandbits", lambda n: 0),
        mock.patch("persistkit.engine._cursor.new_run_id", lambda: next(runs)),
    ):
        return _build()


def _build() -> tuple[dict[tuple[str, str], dict[str, CheckpointRow]], dict[str, dict[str, bytes]]]:
    backend = MemoryBackend()
    store = pk.Store(backend)
    with pk.resume(TID, store=store, state={"log": [], "count": 0}, metadata={"user": "u1"}):
        for i in range(70):
            _step(i)
        _rewrite()
        _step(70)
    try:
        with pk.resume(TID, store=store, state={"log": [], "count": 0}):
            _step(100)
            _fail()
    except ValueError:
        pass
    head = store.history(TID, limit=1)[0]
    store.fork(TID, head.checkpoint_id, new_thread_id="fuzz-fork", update={"count": 7})
    store.update_state(TID, {"count": 9})
    data = backend._data
    rows = {k: dict(v) for k, v in data.rows.items()}
    blobs = {k: dict(v) for k, v in data.blobs.items()}
    return rows, blobs


_ROWS, _BLOBS = build()
_TARGETS: list[tuple[str, Any]] = [
    *(("row", (key, cid)) for key, rows in sorted(_ROWS.items()) for cid in sorted(rows)),
    *(("blob", (tid, k)) for tid, blobs in sorted(_BLOBS.items()) for k in sorted(blobs)),
]


def _original(kind: str, where: Any) -> bytes:
    if kind == "row":
        (key, cid) = where
        return _ROWS[key][cid].payload
    tid, k = where
    return _BLOBS[tid][k]


def _store_with(kind: str, where: Any, data: bytes) -> pk.Store:
    backend = MemoryBackend()
    d = backend._data
    d.rows = {k: dict(v) for k, v in _ROWS.items()}
    d.blobs = {k: dict(v) for k, v in _BLOBS.items()}
    for key, rows in d.rows.items():
        newest = max(rows)
        d.heads[key] = pk.backends.Head(newest, len(rows))
    if kind == "row":
        key, cid = where
        d.rows[key][cid] = dataclasses.replace(d.rows[key][cid], payload=data)
    else:
        tid, k = where
        d.blobs[tid][k] = data
    return pk.Store(backend)


def mutate(original: bytes, how: int, where: int, extra: bytes) -> bytes:
    """One of several mutations; the JSON ones go through the envelope so they reach the decoder."""
    inner: bytes | None = None
    if original[:1] == b"\x01":
        inner = original[1:]
    elif original[:1] == b"\x02":
        inner = zlib.decompress(original[1:])
    elif original[:1] == b"\x04":
        inner = zstandard.ZstdDecompressor().decompress(original[1:])
    op = how % 6
    if op == 0 or inner is None:  # raw bytes: envelope byte, compression stream
        buf = bytearray(original)
        pos = where % max(len(buf), 1)
        buf[pos:pos + 1 + len(extra) % 4] = extra
        return bytes(buf)
    buf = bytearray(inner)
    pos = where % max(len(buf), 1)
    if op == 1:
        buf[pos:pos + 1] = extra[:1] or b"}"
    elif op == 2:
        del buf[pos:pos + 1 + (len(extra) % 16)]
    elif op == 3:
        buf[pos:pos] = extra
    elif op == 4:
        # swap in a JSON-significant byte where it hurts most
        buf[pos:pos + 1] = bytes([b'{}[]",:0-9tfn\\'[where % 14]])
    else:
        buf = buf[:pos]
    sealed = bytes(buf)
    envelope = (how // 6) % 3  # re-sealed in each envelope the codec reads
    if envelope == 1:
        return b"\x02" + zlib.compress(sealed)
    if envelope == 2:
        return b"\x04" + zstandard.ZstdCompressor(level=1).compress(sealed)
    return b"\x01" + sealed


def exercise(store: pk.Store, focus: str | None) -> None:
    """Every read path over the (possibly corrupt) store. Raises only PersistkitError.

    The state is loaded at the edited checkpoint (``focus``), a few after it,
    every thread's head, and a sample of the rest (loading all of them is
    quadratic and finds nothing more).
    """
    for tid in store.threads():
        ids = [cp.checkpoint_id for cp in store.history(tid)]
        at = ids.index(focus) if focus in ids else len(ids)
        for cid in {*ids[max(at - 3, 0):at + 1], *ids[::15]}:
            store.get_state(tid, cid)
        store.get_state(tid)
    with pk.resume(TID, store=store, state={"log": [], "count": 0}) as run:
        _step(100)  # replays the last run's first step, or runs it
        _ = run.state


def check(selector: int, how: int, where: int, extra: bytes) -> None:
    kind, place = _TARGETS[selector % len(_TARGETS)]
    data = mutate(_original(kind, place), how, where, extra)
    store = _store_with(kind, place, data)
    try:
        exercise(store, place[1] if kind == "row" else None)
    except pk.PersistkitError:
        pass
    except ValueError as exc:
        if str(exc) != "boom with some text":  # the recorded failure, replayed: a correct value
            raise


def atheris_input(data: bytes) -> None:
    if len(data) < 6:
        return
    check(int.from_bytes(data[0:2], "big"), data[2], int.from_bytes(data[3:5], "big"), data[5:])


if __name__ == "__main__":
    import atheris

    atheris.instrument_all()  # coverage feedback from every loaded module (persistkit's included)
    atheris.Setup(sys.argv, atheris_input)
    atheris.Fuzz()
