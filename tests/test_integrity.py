"""Tamper evidence on the read path: every tamper case, made on the RAW storage, is refused.

Each case writes a thread through an integrity store, edits the bytes behind
persistkit's back (sqlite3 on the file, psycopg on the tables, the memory
store's dicts), then opens a FRESH store with the same key and witness and
checks that every normal read path raises ``IntegrityError`` naming the
thread and the checkpoint, and that ``store.verify()`` reports it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from _tamper import MemoryRaw, Raw, RedisRaw, SQLRaw
from conftest import make_url, uid

import persistkit as pk
from persistkit._ids import next_checkpoint_id
from persistkit.backends import CheckpointRow
from persistkit.wrappers._integrity import IntegrityBackend
from persistkit.wrappers._keys import KeyRing
from persistkit.wrappers._witness import FileWitness, WitnessEntry

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
KINDS = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture(params=KINDS)
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[Env]:
    url = make_url(request.param, request, tmp_path_factory, isolated=True)  # whole-store verify: no other test's sealed threads
    e = Env(request.param, url, tmp_path)
    yield e
    e.close()


class Env:
    """One backend under test: a URL, its raw storage, a witness file, and the stores opened on it."""

    def __init__(self, kind: str, url: str, tmp: Path) -> None:
        self.kind, self.url, self.tmp = kind, url, tmp
        self.witness = f"file:{tmp}/witness.log"
        self.stores: list[pk.Store] = []
        self._raw: Raw | None = None

    def open(self, key: Any = KEY, witness: Any = "default") -> pk.Store:
        s = pk.connect(self.url, integrity=key, witness=self.witness if witness == "default" else witness)
        self.stores.append(s)
        return s

    @property
    def raw(self) -> Raw:
        if self._raw is None:
            if self.kind == "memory":
                self._raw = MemoryRaw(self.url)
            elif self.kind == "redis":
                self._raw = RedisRaw(self.url)
            else:
                self._raw = SQLRaw(self.kind, self.url)
        return self._raw

    def close(self) -> None:
        for s in self.stores:
            s.close()
        if self._raw is not None:
            self._raw.close()


# -- the agent ---------------------------------------------------------------------------------


@pk.checkpointed(name="alpha_step")
def alpha(i: int) -> int:
    run = pk.current_run()
    assert run is not None
    run.state["messages"].append(f"message {i}")
    return i


@pk.checkpointed(name="notes_step")
def notes(text: str) -> str:
    run = pk.current_run()
    assert run is not None
    run.state["notes"] = text * 40  # large: stored as a blob
    return "ok"


def agent(store: pk.Store, t: str, n: int = 5, start: int = 0) -> None:
    with pk.resume(t, store=store) as run:
        run.state.setdefault("messages", [])
        for i in range(start, start + n):
            alpha(i)
        notes(f"notes after {start + n} ")


def edit_body(payload: bytes, fn: Callable[[dict[str, Any]], None]) -> bytes:
    """Change the JSON inside a sealed payload, keeping the integrity header."""
    i = payload.find(b'\x01{"')
    assert i > 0, "payload is not a sealed plain-JSON record"
    tree = json.loads(payload[i + 1 :])
    fn(tree)
    return payload[:i] + b"\x01" + json.dumps(tree, separators=(",", ":")).encode()


def refused(fn: Callable[[], Any], thread: str, cids: set[str] | str | None = None) -> str:
    with pytest.raises(pk.IntegrityError) as info:
        fn()
    msg = str(info.value)
    assert repr(thread) in msg, msg
    if cids is not None:
        wanted = {cids} if isinstance(cids, str) else cids
        assert any(c in msg for c in wanted), (wanted, msg)
    return msg


def resume_of(store: pk.Store, t: str) -> Callable[[], None]:
    def go() -> None:
        with pk.resume(t, store=store):
            pass

    return go


def all_paths_refused(store: pk.Store, t: str, cids: set[str] | str | None, checkpoint: str | None = None) -> None:
    refused(resume_of(store, t), t, cids)
    refused(lambda: store.history(t), t, cids)
    refused(lambda: store.get_state(t), t, cids)
    if checkpoint is not None:
        refused(lambda: store.get_checkpoint(t, checkpoint), t, cids)


def reported(store: pk.Store, t: str, cids: set[str] | str | None = None) -> pk.IntegrityReport:
    report = store.verify()
    assert not report.ok
    mine = [p for p in report.problems if p.thread_id == t]
    assert mine, report
    if cids is not None:
        wanted = {cids} if isinstance(cids, str) else cids
        assert any(p.checkpoint_id in wanted for p in mine), (wanted, str(report))
    return report


def written(env: Env, n: int = 5) -> tuple[str, list[str]]:
    """A thread with one run of n alpha steps, a notes step and an end record; its checkpoint ids."""
    t = uid("int")
    agent(env.open(), t, n)
    cids = [r[0] for r in env.raw.rows(t)]
    assert len(cids) == n + 2
    return t, cids


# -- the nine cases ----------------------------------------------------------------------------


def test_untampered_store_reads_and_verifies(env: Env) -> None:
    t, cids = written(env)
    store = env.open()
    assert len(store.history(t)) == len(cids)
    assert store.get_state(t)["messages"][-1] == "message 4"
    assert store.get_checkpoint(t, cids[2]).step == "alpha_step"
    agent(store, t, 2, start=5)
    assert store.get_state(t)["messages"][-1] == "message 6"
    report = store.verify()  # the whole store: each test's store is its own (isolated=True)
    assert report.ok, str(report)
    assert report.records >= 11 and report.blobs >= 1


def test_1_content_edited(env: Env) -> None:
    t, cids = written(env)
    target = cids[2]
    payload = env.raw.rows(t)[2][3]
    env.raw.set_row(t, target, "payload", payload.replace(b"message 2", b"message X"))
    store = env.open()
    all_paths_refused(store, t, target, checkpoint=target)
    reported(store, t, target)


def test_1_blob_edited(env: Env) -> None:
    t, _ = written(env)
    (key, data), = ((k, v) for k, v in env.raw.blobs(t).items() if k.startswith("v:"))
    env.raw.set_blob(t, key, data[:-1] + bytes([data[-1] ^ 1]))
    store = env.open()
    msg = refused(lambda: store.get_state(t), t)
    assert key in msg
    refused(resume_of(store, t), t)
    report = store.verify()
    assert any(p.blob_key == key for p in report.problems), str(report)


def test_2_truncation_head_left_dangling(env: Env) -> None:
    t, cids = written(env)
    for cid in cids[-2:]:
        env.raw.delete_row(t, cid)
    # Where the head is read off the newest row, truncating rewinds it (the witness catches it).
    head = cids[-3] if env.raw.derived_head else cids[-1]
    store = env.open()
    all_paths_refused(store, t, head)
    reported(store, t, head)


def test_2_truncation_with_head_rewound_needs_the_witness(env: Env) -> None:
    t, cids = written(env)
    for cid in cids[-2:]:
        env.raw.delete_row(t, cid)
    env.raw.set_head(t, cids[-3], len(cids) - 2)
    store = env.open()
    all_paths_refused(store, t, cids[-3])
    reported(store, t, cids[-3])
    # Documented limit: without a witness, a consistent older prefix is indistinguishable.
    assert env.open(witness=None).get_state(t)["messages"][-1] == "message 4"


def test_3_middle_record_deleted(env: Env) -> None:
    t, cids = written(env)
    env.raw.delete_row(t, cids[2])
    store = env.open()
    all_paths_refused(store, t, {cids[2], cids[3]})
    reported(store, t, {cids[2], cids[3]})


def test_3_oldest_record_deleted(env: Env) -> None:
    t, cids = written(env)
    env.raw.delete_row(t, cids[0])
    store = env.open()
    refused(lambda: store.history(t), t, {cids[0], cids[1]})
    refused(lambda: store.get_state(t), t, {cids[0], cids[1]})
    reported(store, t, cids[1])


def test_4_records_reordered(env: Env) -> None:
    t, cids = written(env)
    rows = env.raw.rows(t)
    env.raw.set_row(t, cids[1], "payload", rows[3][3])
    env.raw.set_row(t, cids[3], "payload", rows[1][3])
    store = env.open()
    all_paths_refused(store, t, {cids[1], cids[3]}, checkpoint=cids[3])
    report = reported(store, t)
    broken = {p.checkpoint_id for p in report.problems if p.thread_id == t}
    assert {cids[1], cids[3]} <= broken, str(report)  # every broken record, not only the first


def test_5_forged_record_inserted_as_head(env: Env) -> None:
    t, cids = written(env)
    forged = next_checkpoint_id(cids[-1])
    head_payload = env.raw.rows(t)[-1][3]
    env.raw.insert_row(t, forged, cids[-1], None, head_payload)
    env.raw.set_head(t, forged, len(cids) + 1)
    store = env.open()
    all_paths_refused(store, t, forged, checkpoint=forged)
    reported(store, t, forged)


def test_5_forged_unsealed_record_in_the_middle(env: Env) -> None:
    # Ids of steps in one millisecond are adjacent numbers: two runs a few ms apart
    # leave a gap between them to forge into (a record before the first is not "in
    # the middle": no read of the head's state passes it).
    t = uid("int")
    agent(env.open(), t, 3)
    time.sleep(0.005)
    agent(env.open(), t, 2, start=3)
    cids = [r[0] for r in env.raw.rows(t)]
    plain = pk.connect(f"memory://{uid('plain')}")
    agent(plain, "src", 1)
    src_row = plain.backend.list("src", "", limit=1)[0]
    plain.close()
    gaps = [a for a, b in pairwise(cids) if int(b, 16) - int(a, 16) > 1]
    after = gaps[0]
    forged = format(int(after, 16) + 1, f"0{len(cids[0])}x")
    assert forged not in cids
    env.raw.insert_row(t, forged, after, None, src_row.payload)
    store = env.open()
    refused(lambda: store.history(t), t, forged)
    refused(lambda: store.get_state(t), t, forged)
    refused(lambda: store.get_checkpoint(t, forged), t, forged)
    reported(store, t, forged)


def test_6_record_copied_from_another_thread(env: Env) -> None:
    victim, vcids = written(env)
    donor, dcids = written(env)  # newer ids: they sort after the victim's
    donor_head = env.raw.rows(donor)[-1]
    env.raw.insert_row(victim, donor_head[0], vcids[-1], donor_head[2], donor_head[3])
    env.raw.set_head(victim, donor_head[0], len(vcids) + 1)
    store = env.open()
    all_paths_refused(store, victim, dcids[-1], checkpoint=dcids[-1])
    reported(store, victim, dcids[-1])
    assert store.get_state(donor)["messages"][-1] == "message 4"  # the donor is untouched


def test_7_head_replaced_by_an_older_genuine_version(env: Env) -> None:
    t, cids = written(env)
    env.raw.set_head(t, cids[2], 3)
    store = env.open()
    all_paths_refused(store, t, {cids[2], cids[-1]})
    reported(store, t, {cids[2], cids[-1]})


@pytest.mark.parametrize("edit", ["step name", "status", "timestamp", "parent link", "run id"])
def test_8_metadata_edited(env: Env, edit: str) -> None:
    t, cids = written(env)
    target = cids[2]
    payload = env.raw.rows(t)[2][3]
    if edit == "step name":
        env.raw.set_row(t, target, "payload", edit_body(payload, lambda b: b.update(n="omega_step")))
    elif edit == "status":
        env.raw.set_row(t, target, "payload", edit_body(payload, lambda b: b.update(s="failed")))
    elif edit == "timestamp":
        env.raw.set_row(t, target, "payload", edit_body(payload, lambda b: b.update(t=b["t"] - 3600)))
    elif edit == "parent link":
        env.raw.set_row(t, target, "parent_id", cids[0])
    else:
        env.raw.set_row(t, target, "run_id", "0" * 24)
    store = env.open()
    all_paths_refused(store, t, target, checkpoint=target)
    reported(store, t, target)


def test_9_whole_store_rolled_back(env: Env) -> None:
    t, _ = written(env)
    other, _ = written(env)
    snap = env.raw.snapshot([t, other])
    agent(env.open(), t, 3, start=5)
    newest = env.raw.rows(t)[-1][0]
    env.raw.restore(snap)
    old_head = env.raw.head(t)[0]
    store = env.open()
    all_paths_refused(store, t, {old_head, newest})
    reported(store, t, old_head)
    assert store.get_state(other)["messages"][-1] == "message 4"  # unchanged since the copy: fine


def test_9_thread_removed_behind_our_back(env: Env) -> None:
    t, cids = written(env)
    for cid in cids:
        env.raw.delete_row(t, cid)
    if env.kind == "memory":
        env.raw.data.heads.pop((t, ""))  # type: ignore[attr-defined]
    elif env.kind == "redis":
        env.raw.r.delete(env.raw._n(t, b"h"))  # type: ignore[attr-defined]
    elif not env.raw.derived_head:  # SQLite: no head left once the rows are gone
        env.raw._q("DELETE FROM {h} WHERE thread_id = ?", t)  # type: ignore[attr-defined]
    store = env.open()
    refused(lambda: store.get_state(t), t)
    refused(lambda: store.history(t), t)
    assert not store.verify(t).ok


# -- keys, witnesses, concurrency, the rest of the API -----------------------------------------------


def test_store_opened_without_the_key_or_with_a_wrong_key(env: Env, tmp_path: Path) -> None:
    t, cids = written(env)
    plain = pk.connect(env.url)
    env.stores.append(plain)
    with pytest.raises(pk.SerializationError, match="integrity"):
        plain.get_state(t)
    wrong = env.open(key=OTHER_KEY, witness=None)  # a different key id
    msg = refused(lambda: wrong.get_state(t), t, cids[-1])
    assert "not in the key ring" in msg
    kid = KeyRing.coerce(KEY, purpose="integrity").active_id
    same_id = env.open(key={kid: OTHER_KEY}, witness=None)  # same id, different key
    msg = refused(lambda: same_id.history(t), t, cids[-1])
    assert "does not match" in msg
    assert KEY.hex() not in msg and OTHER_KEY.hex() not in msg


def test_mac_key_rotation(env: Env) -> None:
    t = uid("rot")
    agent(env.open(key={"k1": KEY}), t, 2)
    rotated = env.open(key=KeyRing({"k1": KEY, "k2": OTHER_KEY}, active="k2", purpose="integrity"))
    agent(rotated, t, 2, start=2)
    assert rotated.get_state(t)["messages"] == [f"message {i}" for i in range(4)]
    assert rotated.verify(t).ok
    retired = env.open(key={"k2": OTHER_KEY})
    msg = refused(lambda: retired.history(t), t)
    assert "'k1'" in msg


def test_a_lost_compare_and_swap_is_still_a_conflict(env: Env) -> None:
    t = uid("cas")
    a, b = env.open(), env.open()
    agent(a, t, 1)
    with pytest.raises(pk.ConflictError), pk.resume(t, store=a):
        alpha(10)
        b.update_state(t, {"other": 1})  # moves the head under the running run
        alpha(11)
    assert a.verify(t).ok
    ib = a.backend
    assert isinstance(ib, IntegrityBackend)
    row = CheckpointRow(t, "", next_checkpoint_id(env.raw.head(t)[0]), None, None, b"\x01{}")
    with pytest.raises(pk.ConflictError):
        ib.write(row, {}, 1)


def test_async_paths(env: Env) -> None:
    t = uid("async")
    store = env.open()

    @pk.checkpointed(name="async_step")
    async def step(i: int) -> int:
        run = pk.current_run()
        assert run is not None
        run.state["messages"].append(i)
        return i

    async def go() -> None:
        async with pk.resume(t, store=store) as run:
            run.state.setdefault("messages", [])
            for i in range(4):
                await step(i)
        assert (await store.aget_state(t))["messages"] == [0, 1, 2, 3]
        assert len(await store.ahistory(t)) == 5

    asyncio.run(go())
    assert asyncio.run(store.averify(t)).ok
    cids = [r[0] for r in env.raw.rows(t)]
    payload = env.raw.rows(t)[1][3]
    env.raw.set_row(t, cids[1], "payload", edit_body(payload, lambda b: b.update(n="other")))
    fresh = env.open()

    async def read() -> None:
        with pytest.raises(pk.IntegrityError, match=cids[1]):
            await fresh.aget_state(t)
        with pytest.raises(pk.IntegrityError, match=cids[1]):
            async with pk.resume(t, store=fresh):
                pass
        await fresh.aclose()

    asyncio.run(read())


def test_fork_and_update_state_under_integrity(env: Env) -> None:
    t, _ = written(env)
    store = env.open()
    store.update_state(t, {"notes": "edited"})
    cp = store.fork(t, new_thread_id=uid("fork"), update={"notes": "forked"})
    assert store.get_state(cp.thread_id)["notes"] == "forked"
    assert store.get_state(t)["notes"] == "edited"
    agent(store, cp.thread_id, 2, start=5)
    assert store.get_state(cp.thread_id)["messages"][-1] == "message 6"
    assert store.verify(t).ok and store.verify(cp.thread_id).ok


def test_delete_clears_the_witness(env: Env, tmp_path: Path) -> None:
    t, _ = written(env)
    store = env.open()
    ib = store.backend
    assert isinstance(ib, IntegrityBackend) and ib.witness is not None
    assert ib.witness.latest(t, "") is not None
    assert store.delete_thread(t)
    assert ib.witness.latest(t, "") is None
    assert FileWitness(env.witness.removeprefix("file:")).latest(t, "") is None  # on disk too
    agent(env.open(), t, 1)  # recreated from scratch: not mistaken for a rollback
    assert env.open().get_state(t)["messages"] == ["message 0"]


def test_run_filtered_listing_checks_the_gaps(env: Env) -> None:
    t = uid("runs")
    ib = env.open().backend
    assert isinstance(ib, IntegrityBackend)
    runs = ["A", "B", "A", "A", "B", "B", "A"]
    cid: str | None = None
    for i, run in enumerate(runs):
        row = CheckpointRow(t, "", next_checkpoint_id(cid), cid, run, b"\x01{}")
        ib.write(row, {}, i)
        cid = row.checkpoint_id
    cids = [r[0] for r in env.raw.rows(t)]
    assert [r.run_id for r in ib.list(t, "", run_id="A")] == ["A"] * 4
    assert len(ib.list(t, "", run_id="B", limit=2)) == 2
    env.raw.delete_row(t, cids[4])  # a B row inside A's gap
    fresh = env.open().backend
    refused(lambda: fresh.list(t, "", run_id="A"), t, {cids[4], cids[5]})
    refused(lambda: fresh.list(t, "", run_id="B"), t, {cids[4], cids[5]})
    # the gap sits between two pages of A's listing: the row past the page catches it
    refused(lambda: fresh.list(t, "", run_id="A", limit=1), t, {cids[4], cids[5]})
    assert [r.checkpoint_id for r in fresh.list(t, "", run_id="A", before=cids[3], limit=1)] == [cids[2]]


def test_store_and_callback_witnesses(env: Env) -> None:
    book: dict[tuple[str, str], WitnessEntry] = {}

    class Book:
        def record(self, t: str, ns: str, seq: int, cid: str, tag: bytes) -> None:
            book[(t, ns)] = WitnessEntry(seq, cid, tag)

        def latest(self, t: str, ns: str) -> WitnessEntry | None:
            return book.get((t, ns))

    witness_url = f"sqlite:///{env.tmp}/witness.db"
    for witness in (witness_url, Book()):
        t = uid("wit")
        agent(env.open(witness=witness), t, 2)
        snap = env.raw.snapshot([t])
        agent(env.open(witness=witness), t, 2, start=2)
        env.raw.restore(snap)
        refused(lambda w=witness, t=t: env.open(witness=w).get_state(t), t)  # type: ignore[misc]
        assert env.open(witness=None).get_state(t)["messages"] == ["message 0", "message 1"]


def test_cli_verify(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from persistkit.__main__ import main

    if env.kind == "memory":
        pytest.skip("a memory store is not reachable from the CLI's own connection")
    keyfile = tmp_path / "keys"
    kid = KeyRing.coerce(KEY, purpose="integrity").active_id
    keyfile.write_text(f"{kid}:{KEY.hex()}\n")
    t, cids = written(env)
    args = ["verify", env.url, "--key", f"file:{keyfile}", "--witness", env.witness, "--thread", t]
    assert main(args) == 0
    monkeypatch.setenv("PERSISTKIT_INTEGRITY_KEYS", f"{kid}:{KEY.hex()}")
    assert main(["verify", env.url, "--thread", t]) == 0  # the key from the environment
    env.raw.set_row(t, cids[1], "run_id", "x")
    env.raw.set_row(t, cids[3], "run_id", "y")
    assert main(args) == 1
    out = capsys.readouterr().out
    assert cids[1] in out and cids[3] in out and "2 problem(s)" in out
    assert KEY.hex() not in out
    assert main(["verify", env.url, "--thread", t]) == 1
    monkeypatch.delenv("PERSISTKIT_INTEGRITY_KEYS")
    assert main(["verify", env.url, "--thread", t]) == 1  # no key in the environment: a clear error
    assert "PERSISTKIT_INTEGRITY_KEYS" in capsys.readouterr().err


def test_copy_an_unsealed_store_into_an_integrity_store(env: Env, tmp_path: Path) -> None:
    old_url = f"sqlite:///{tmp_path}/old.db"
    old = pk.connect(old_url)
    t = uid("old")
    agent(old, t, 3)
    old.update_state(t, {"notes": "edited"})
    history = [cp.checkpoint_id for cp in old.history(t)]
    old.close()
    sealed = env.open()
    assert sealed.copy_from(old_url, t) == len(history)
    assert [cp.checkpoint_id for cp in sealed.history(t)] == history
    assert sealed.get_state(t)["notes"] == "edited"
    agent(sealed, t, 1, start=3)  # and it goes on from there, sealed
    assert sealed.verify(t).ok


def test_a_failing_witness_never_fails_a_committed_step(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def record(self, *args: Any) -> None:
            raise OSError("witness disk full")

        def latest(self, t: str, ns: str) -> None:
            return None

    t = uid("wfail")
    store = env.open(witness=Broken())
    with caplog.at_level("WARNING", logger="persistkit"):
        agent(store, t, 2)
    assert store.get_state(t)["messages"] == ["message 0", "message 1"]
    assert "witness disk full" in caplog.text and repr(t) in caplog.text


def test_readers_racing_a_writer_see_no_tampering(env: Env) -> None:
    import threading

    t = uid("race")
    store = env.open()
    agent(store, t, 1)
    done = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        while not done.is_set():
            try:
                store.history(t, limit=3)
                store.get_state(t)
                store.get_checkpoint(t)
            except BaseException as exc:
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        agent(store, t, 30, start=1)
    finally:
        done.set()
        reader.join()
    assert not errors, errors[0]
    assert store.verify(t).ok


@pytest.fixture
def s3_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[Env]:
    e = Env("s3", make_url("s3", request, tmp_path_factory), tmp_path)
    yield e
    e.close()


def _s3_objects(url: str) -> tuple[Any, str, str]:
    import boto3

    parts = urlsplit(url)
    client = boto3.client("s3", endpoint_url=parse_qs(parts.query)["endpoint_url"][0])
    return client, parts.netloc, parts.path.strip("/")


def test_s3_content_edit_and_rollback(s3_env: Env) -> None:
    """S3 (the chain-of-tokens layout is the backend's own): a row object edited, and a rollback."""
    client, bucket, prefix = _s3_objects(s3_env.url)

    def objects() -> dict[str, bytes]:
        keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", [])]
        return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}

    t = uid("s3")
    agent(s3_env.open(), t, 5)
    cids = [cp.checkpoint_id for cp in reversed(s3_env.open().history(t))]
    snap = objects()
    (key, body), = ((k, v) for k, v in snap.items() if b"message 2" in v)
    client.put_object(Bucket=bucket, Key=key, Body=body.replace(b"message 2", b"message X"))
    store = s3_env.open()
    all_paths_refused(store, t, cids[2], checkpoint=cids[2])
    reported(store, t, cids[2])

    client.put_object(Bucket=bucket, Key=key, Body=body)  # repaired
    agent(s3_env.open(), t, 2, start=5)
    for k in set(objects()) - set(snap):
        client.delete_object(Bucket=bucket, Key=k)
    for k, v in snap.items():
        client.put_object(Bucket=bucket, Key=k, Body=v)  # the older complete copy
    store = s3_env.open()
    refused(lambda: store.get_state(t), t)
    refused(lambda: store.history(t), t)
    assert not store.verify(t).ok
    assert s3_env.open(witness=None).get_state(t)["messages"][-1] == "message 4"  # genuine, only older


def test_file_witness_compacts_reloads_and_refuses_an_edited_file(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    w = FileWitness(path)
    for seq in range(1, 1201):
        w.record("a", "", seq, f"c{seq}", bytes(32))
        w.record("b", "ns", seq, f"d{seq}", b"\x01" * 32)
    w.record("a", "", 5, "old", bytes(32))  # never goes backwards
    w.forget("b")
    w.close()
    assert len(path.read_text().splitlines()) < 1100  # compacted
    with path.open("a") as fh:
        fh.write('{"t": "a", "n": "", "s": 99')  # a line torn by a crash: ignored
    again = FileWitness(path)
    assert again.latest("a", "") == WitnessEntry(1200, "c1200", bytes(32))
    assert again.latest("b", "ns") is None
    again.record("a", "", 1201, "c1201", bytes(32))  # appended on a line of its own
    again.close()
    assert FileWitness(path).latest("a", "") == WitnessEntry(1201, "c1201", bytes(32))
    path.write_text('{"t": "a"}\n' + path.read_text())
    with pytest.raises(pk.IntegrityError, match="line 1"):
        FileWitness(path)


def test_a_record_moved_to_another_namespace_or_id_fails_its_tag() -> None:
    import dataclasses

    from persistkit.backends.memory import MemoryBackend
    from persistkit.wrappers._integrity import open_row

    ring = KeyRing({"k1": KEY}, purpose="integrity")
    inner = MemoryBackend()
    ib = IntegrityBackend(inner, ring)
    row = CheckpointRow("t", "a", next_checkpoint_id(None), None, "r", b"\x01{}")
    ib.write(row, {}, 0)
    stored = inner.get("t", "a", row.checkpoint_id)
    assert stored is not None and open_row(stored, ring).seq == 1
    for change in ({"namespace": "b"}, {"thread_id": "u"}, {"checkpoint_id": next_checkpoint_id(row.checkpoint_id)},
                   {"run_id": None}, {"parent_id": row.checkpoint_id}):
        with pytest.raises(pk.IntegrityError, match="does not match"):
            open_row(dataclasses.replace(stored, **change), ring)


# -- one flipped bit: the error names the ways forward, and the fork it shows works (issue 18) ----


def _flip(payload: bytes) -> bytes:
    # The high bit of a byte in the middle: in the JSON of an unsealed record it is never valid UTF-8.
    i = len(payload) // 2
    return payload[:i] + bytes([payload[i] ^ 0x80]) + payload[i + 1 :]


def _follow_fork_advice(store: pk.Store, msg: str, t: str, parent: str) -> None:
    call = re.search(r"store\.fork\([^)]*\)", msg)
    assert call is not None and call.group(0) == f"store.fork({t!r}, {parent!r})", msg
    forked = eval(call.group(0), {"store": store})  # the call exactly as the message shows it
    assert forked.forked_from == (t, parent)
    agent(store, forked.thread_id, 1, start=10)
    assert store.get_state(forked.thread_id)["messages"][-1] == "message 10"


@pytest.mark.parametrize("integrity", [True, False], ids=["integrity", "plain"])
def test_one_flipped_bit_names_the_ways_forward(env: Env, integrity: bool) -> None:
    t = uid("flip")
    store = env.open() if integrity else pk.connect(env.url)
    env.stores.append(store)
    agent(store, t, 3)
    rows = env.raw.rows(t)
    head, parent = rows[-1][0], rows[-2][0]
    env.raw.set_row(t, head, "payload", _flip(rows[-1][3]))
    kind = pk.IntegrityError if integrity else pk.SerializationError
    for attempt in (resume_of(store, t), lambda: store.get_state(t), lambda: store.history(t)):
        with pytest.raises(kind) as info:
            attempt()
        msg = str(info.value)
        assert head in msg and "Ways forward:" in msg and "Nothing was written." in msg, msg
        if integrity:
            # the store's URL (with the witness= the CLI needs), not a display name
            assert f"`persistkit verify --url '{env.url}" in msg and f"' --thread {t!r}`" in msg, msg
        else:
            assert "pk.connect(url, integrity=True)" in msg and "persistkit verify" in msg, msg
    assert [r[0] for r in env.raw.rows(t)] == [r[0] for r in rows]  # nothing was written
    _follow_fork_advice(store, msg, t, parent)
