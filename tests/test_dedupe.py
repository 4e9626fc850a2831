"""A step's result that the caller appends to a state list is stored once (``_dedupe``).

The loop ``msg = step(); run.state.messages.append(msg)`` used to store each
message twice: as the step's result and as the list item committed with the
next checkpoint. The item is now a reference to the result. These tests cross
that with every store, with secrets redaction, encryption + integrity and blob
offload, and check every way of reading it back: the next run, a replay of
the same run_id, get_state at every checkpoint, history, fork, a crash and a
resume in a new process, and threads written before the format existed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.backends import CheckpointRow

ENC = bytes(range(32))
MAC = bytes(range(7, 39))
OPENAI = "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"
CONFIGS = ["plain", "secrets", "sealed", "offload"]


class Chat(pk.State, name="tests.dedupe.Chat"):
    messages: list[Any] = []


def message(i: int, tag: str, config: str, big: bool = False) -> Any:
    """A ~1 KB message: a str for even i, a chat dict for odd i; ``tag`` makes it findable in storage.

    ``big``: over the 64 KB a result is stored inline up to (a blob, ``rb``), 66 KB to 316 KB
    as i grows, of base64 text (compresses to 3/4, no further)."""
    words = " ".join(f"Word{j} of Reply {i}" for j in range(60))[:1000]
    text = f"<{tag}-{i}> {words}"
    if big:
        text += base64.b64encode(random.Random(f"{tag}-{i}").randbytes(49_500 + 37_500 * i)).decode()
    if config == "secrets":
        text += f" key {OPENAI}"
    return text if i % 2 == 0 else {"role": "assistant", "content": text}


@pk.checkpointed(name="dedupe.reply")
def reply(i: int, tag: str, config: str, big: bool = False) -> Any:
    return message(i, tag, config, big)


def open_store(url: str, config: str, tmp: Path) -> pk.Store:
    if config == "sealed":
        return pk.connect(url, encryption={"a": ENC}, integrity={"m": MAC}, witness=f"file:{tmp}/witness.log")
    if config == "offload":
        return pk.connect(url, blobs=f"memory://dedupe-blobs-{tmp.name}", blob_threshold=64)
    return pk.connect(url)


def stored_json(store: pk.Store, tid: str) -> bytes:
    """Every row of the thread as JSON (through the wrappers: decrypted, tags checked)."""
    rows = store.backend.list(tid, "")
    return b"\n".join(store.codec.open(r.payload) for r in rows)


def stored_bytes(store: pk.Store, tid: str) -> int:
    """Bytes of every row and blob of the thread, as the store gives them back (offloaded ones read back)."""
    rows = store.backend.list(tid, "")
    return sum(len(r.payload) for r in rows) + sum(map(len, store.backend.scan_blobs(tid, "", "~").values()))


def item_bytes(msgs: list[Any]) -> int:
    return sum(len(json.dumps(m).encode()) for m in msgs)


def same(a: Any, b: Any) -> bool:
    """``a`` (read back: get_state shows handles, never needing a value) resolved equals ``b``."""
    a = pk.secrets.resolve(list(a)) if isinstance(a, list) else a
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("big", [False, True], ids=["inline", "over64k"])
@pytest.mark.parametrize("config", CONFIGS)
def test_appended_result_is_stored_once_and_reads_back_everywhere(
    store_url: str, config: str, big: bool, tmp_path: Path
) -> None:
    tid, tag = uid("dd"), uuid.uuid4().hex[:8]
    store = open_store(store_url, config, tmp_path)
    n = 6
    with pk.resume(tid, store=store, state=Chat) as run:
        for i in range(n):
            run.state.messages.append(reply(i, tag, config, big))
    first_run = run.run_id
    msgs = [message(i, tag, config, big) for i in range(n)]
    raw = stored_json(store, tid)
    if big:  # each result is a (compressed) blob; the items refer to it: ~0.75 of the items, 1.5 when stored twice
        ratio = stored_bytes(store, tid) / item_bytes(msgs)
        assert ratio < 0.9, f"stored {ratio:.2f}x the items' bytes"
        if config == "offload":
            outside = pk.connect(f"memory://dedupe-blobs-{tmp_path.name}").backend.scan_blobs(tid, "", "~")
            assert sum(len(b) > 40_000 for b in outside.values()) == n
    else:
        for i in range(n):
            count = raw.count(f"<{tag}-{i}>".encode())
            assert count == 1, f"message {i} stored {count} times"
    if config == "secrets":
        assert OPENAI.encode() not in raw
    assert b'"ri"' in raw

    # a new store object (a new connection; for memory:// the same process-wide data)
    if not store_url.startswith("memory://"):
        store.close()
        store = open_store(store_url, config, tmp_path)

    # the next run continues from the head, and its own appended result is stored once too
    with pk.resume(tid, store=store, state=Chat) as run:
        assert same(run.state.messages, msgs)
        run.state.messages.append(reply(n, tag, config, big))
    msgs.append(message(n, tag, config, big))
    assert same(store.get_state(tid, state=Chat).messages, msgs)
    if not big:
        assert stored_json(store, tid).count(f"<{tag}-{n}>".encode()) == 1
    elif config != "secrets":  # with secrets a new run writes its list anew (a separate, known cost)
        assert stored_bytes(store, tid) / item_bytes(msgs) < 0.9

    # replaying the first run_id returns the recorded results and restores each step's state
    with pk.resume(tid, store=store, state=Chat, run_id=first_run) as run:
        for i in range(n):
            assert same(reply(i, tag, config, big), msgs[i])
            assert same(run.state.messages, msgs[:i])
            run.state.messages.append(msgs[i])

    # get_state at every checkpoint: a prefix of the messages, growing along the history
    history = store.history(tid)
    lengths = []
    for cp in reversed(history):
        state = store.get_state(tid, cp.checkpoint_id, state=Chat)
        assert same(state.messages, msgs[: len(state.messages)]), cp
        lengths.append(len(state.messages))
    assert lengths == sorted(lengths) and lengths[-1] == n + 1
    assert [cp.kind for cp in history].count("step") == n + 1

    # a fork from the middle of the first run
    mid = next(cp for cp in history if cp.kind == "step" and cp.position == "3")
    forked = store.fork(tid, mid.checkpoint_id, new_thread_id=uid("ddfork"), state=Chat)
    assert same(store.get_state(forked.thread_id, state=Chat).messages, msgs[:3])
    if config == "sealed":
        assert store.verify(tid).ok
    store.close()


def test_edge_cases_are_stored_as_they_are(local_store: pk.Store) -> None:
    """Only exact copies become references: a result changed after the step returned, or
    equal in Python but not in JSON (``True == 1``), is stored as appended."""
    pad = "p" * 200

    @pk.checkpointed(name="dedupe.edge")
    def edge(i: int) -> Any:
        return {"v": 1, "pad": pad, "i": i}

    tid = uid("edge")
    with pk.resume(tid, store=local_store, state=Chat) as run:
        d = edge(0)
        d["i"] = "changed after the step"
        run.state.messages.append(d)
        e = edge(1)
        run.state.messages.append({"v": True, "pad": pad, "i": 1})
        run.state.messages.append(e)  # an exact copy after a near miss: this one is referenced
    got = local_store.get_state(tid, state=Chat).messages
    assert got == [{"v": 1, "pad": pad, "i": "changed after the step"}, {"v": True, "pad": pad, "i": 1}, e]
    assert type(got[1]["v"]) is bool and type(got[2]["v"]) is int
    with pk.resume(tid, store=local_store, state=Chat, run_id=run.run_id):
        assert edge(0) == {"v": 1, "pad": pad, "i": 0}
    raw = stored_json(local_store, tid)
    assert raw.count(b'"ri":[1]') == 1  # the end record's segment: [near miss, exact copy]


def test_async_steps_store_once(local_store: pk.Store) -> None:
    tag = uuid.uuid4().hex[:8]

    @pk.checkpointed(name="dedupe.areply")
    async def areply(i: int) -> Any:
        return message(i, tag, "plain")

    async def agent(tid: str) -> None:
        async with pk.resume(tid, store=local_store, state=Chat) as run:
            for i in range(4):
                run.state.messages.append(await areply(i))

    tid = uid("async")
    asyncio.run(agent(tid))
    raw = stored_json(local_store, tid)
    assert all(raw.count(f"<{tag}-{i}>".encode()) == 1 for i in range(4))
    assert same(local_store.get_state(tid, state=Chat).messages, [message(i, tag, "plain") for i in range(4)])


@pytest.mark.parametrize("big", [False, True], ids=["inline", "over64k"])
def test_threads_written_before_references_load_and_continue(
    local_store: pk.Store, monkeypatch: pytest.MonkeyPatch, big: bool
) -> None:
    from persistkit.state import _dedupe

    tid, tag = uid("old"), uuid.uuid4().hex[:8]
    with monkeypatch.context() as m:
        m.setattr(_dedupe, "MIN_BYTES", 1 << 30)  # the format before references: every item in full
        with pk.resume(tid, store=local_store, state=Chat) as run:
            for i in range(3):
                run.state.messages.append(reply(i, tag, "plain", big))
    old_run = run.run_id
    assert b'"ri"' not in stored_json(local_store, tid)
    with pk.resume(tid, store=local_store, state=Chat) as run:
        for i in range(3, 6):
            run.state.messages.append(reply(i, tag, "plain", big))
    msgs = [message(i, tag, "plain", big) for i in range(6)]
    assert same(local_store.get_state(tid, state=Chat).messages, msgs)
    with pk.resume(tid, store=local_store, state=Chat, run_id=old_run):
        assert same([reply(i, tag, "plain", big) for i in range(3)], msgs[:3])
    if big:  # the old run's items in full, the new run's as references: 3 items stored twice, not 6
        assert stored_bytes(local_store, tid) < (item_bytes(msgs) + item_bytes(msgs[:3])) * 0.75 * 1.1
    else:
        assert stored_json(local_store, tid).count(f"<{tag}-4>".encode()) == 1


def _tamper(store: pk.Store, tid: str, edit: Any) -> None:
    """Rewrite the newest row holding a result reference with ``edit(body)``."""
    for row in store.backend.list(tid, ""):
        body = store.codec.unpack_tree(row.payload)
        if any("ri" in seg for seg in (body.get("sg") or {}).values()):
            edit(body)
            new = CheckpointRow(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id, row.run_id,
                                store.codec.pack_tree(body))
            store.backend.rewrite(tid, [new], {})
            return
    raise AssertionError("no row with a reference")


def _point_elsewhere(body: dict[str, Any]) -> None:
    seg = body["sg"]["messages"]
    seg["i"][seg["ri"][0]]["v"] = "0" * 24


def _bad_index(body: dict[str, Any]) -> None:
    body["sg"]["messages"]["ri"] = [5]


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [(_point_elsewhere, pk.IntegrityError, "is missing"), (_bad_index, pk.SerializationError, "not a result reference")],
)
def test_a_broken_reference_is_an_error_never_a_wrong_value(edit: Any, error: type, match: str) -> None:
    store = pk.connect("memory://")
    tid, tag = uid("broken"), uuid.uuid4().hex[:8]
    with pk.resume(tid, store=store, state=Chat) as run:
        for i in range(3):
            run.state.messages.append(reply(i, tag, "plain"))
    _tamper(store, tid, edit)
    with pytest.raises(error, match=match):
        store.get_state(tid, state=Chat)


def test_a_reference_to_a_lost_result_blob_is_an_error() -> None:
    """An item stored as a result over 64 KB whose blob the row no longer names: an error, not a value."""
    store = pk.connect("memory://")
    tid, tag = uid("lostblob"), uuid.uuid4().hex[:8]
    with pk.resume(tid, store=store, state=Chat) as run:
        for i in range(2):
            run.state.messages.append(reply(i, tag, "plain", True))
    rows = store.backend.list(tid, "")
    body = store.codec.unpack_tree(rows[1].payload)  # the last step's row: the end record refers to it
    assert body["k"] == "step" and "rb" in body
    body["rb"] = "v:" + "0" * 32
    row = rows[1]
    store.backend.rewrite(tid, [CheckpointRow(row.thread_id, row.namespace, row.checkpoint_id, row.parent_id,
                                              row.run_id, store.codec.pack_tree(body))], {})
    with pytest.raises(pk.IntegrityError, match="is missing"):
        store.get_state(tid, state=Chat)


def test_a_reader_that_does_not_know_references_fails_loudly(local_store: pk.Store) -> None:
    """What persistkit before this format does with a reference: an unknown tag, not a value."""
    with pytest.raises(pk.SerializationError, match="newer persistkit"):
        local_store.codec.decode({"__pk__": "rr", "v": "0" * 24})


CRASH_SCRIPT = """
import json, os, sys
sys.path.insert(0, {tests!r})
import persistkit as pk
from test_dedupe import Chat, reply

url, tid, tag, kill_at, when = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
store = pk.connect(url)
with pk.resume(tid, store=store, state=Chat) as run:
    for i in range(6):
        msg = reply(i, tag, "plain")
        if i == kill_at and when == "returned":
            os._exit(3)  # the step committed, its result not appended yet
        run.state.messages.append(msg)
        if i == kill_at and when == "appended":
            os._exit(3)  # appended, not committed: the next checkpoint would have carried it
print(json.dumps({{"messages": run.state.messages, "replayed": len(run.replayed)}}))
"""


@pytest.mark.parametrize(("kill_at", "when"), [(0, "returned"), (2, "appended"), (5, "returned"), (5, "appended")])
def test_crash_and_resume_in_a_new_process(store_url: str, kill_at: int, when: str, tmp_path: Path) -> None:
    if store_url.startswith("memory://"):
        pytest.skip("a memory store does not outlive its process")
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(CRASH_SCRIPT.format(tests=str(Path(__file__).resolve().parent))))
    tid, tag = uid("crash"), uuid.uuid4().hex[:8]
    args = [sys.executable, str(script), store_url, tid, tag]
    first = subprocess.run([*args, str(kill_at), when], capture_output=True, text=True)
    assert first.returncode == 3, first.stderr
    second = subprocess.run([*args, "-1", "none"], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    msgs = [message(i, tag, "plain") for i in range(6)]
    assert same(out["messages"], msgs)
    assert out["replayed"] == kill_at + 1
    with pk.connect(store_url) as store:
        assert same(store.get_state(tid, state=Chat).messages, msgs)
        raw = stored_json(store, tid)
        for i in range(6):
            assert raw.count(f"<{tag}-{i}>".encode()) <= 2  # a replayed result appended live is stored in full
        assert raw.count(f"<{tag}-{5}>".encode()) == 1 or kill_at == 5
