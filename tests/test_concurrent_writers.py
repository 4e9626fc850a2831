"""Concurrent writers on one thread: every ConflictError says what committed, and its
advice, followed, neither loses nor duplicates work (issue 13, item 7).

Without leases, two runs may write one thread; the head's compare-and-swap refuses
the later commit. The interleavings are driven deterministically (nested blocks on
one thread), then by real concurrent writers (threads, and processes where the
store is shared across processes), on every store.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import threading
import uuid
from collections import Counter
from typing import Annotated, Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit import ConflictError


class Log(pk.State, name="tests.concurrent.Log"):
    items: Annotated[list[str], pk.append] = []


RAN: Counter[str] = Counter()  # how often each item's side effect ran (this process)


@pk.checkpointed(name="produce")
def produce(item: str) -> str:
    RAN[item] += 1
    return item


@pk.checkpointed(name="add")
def add(item: str) -> str:
    """A step that appends its item to the state itself (inside the step)."""
    RAN[item] += 1
    run = pk.current_run()
    assert run is not None
    run.state.items.append(item)
    return item


@pk.checkpointed(name="aadd")
async def aadd(item: str) -> str:
    RAN[item] += 1
    run = pk.current_run()
    assert run is not None
    run.state.items.append(item)
    return item


def body(run: pk.Run, item: str, where: str) -> None:
    """One unit of work: the step appends the item, or the caller appends the step's result."""
    if where == "inside":
        add(item)
    else:
        run.state.items.append(produce(item))


def rows_of(store: pk.Store, t: str, run_id: str) -> list[pk.Checkpoint]:
    return store.history(t, run_id=run_id)


def check_advice(store: pk.Store, t: str, run_id: str, exc: ConflictError) -> None:
    """What the message says committed is what the store holds."""
    msg = str(exc)
    assert "nothing was written" not in msg.lower() or "fork" in msg  # the old lie is gone
    assert f"run_id={run_id!r}" in msg, msg
    mine = rows_of(store, t, run_id)
    if "Nothing of run" in msg:
        assert mine == [], msg
    else:
        m = re.search(r"checkpoints up to ([0-9a-f]{24}) are committed", msg)
        assert m is not None, msg
        assert mine and mine[0].checkpoint_id == m.group(1), msg


# -- deterministic interleavings ------------------------------------------------------------


@pytest.mark.parametrize("where", ["inside", "after"])
def test_end_record_after_another_writer(store: pk.Store, where: str) -> None:
    """W's step commits, X commits on top, then W's block ends (the quoted case)."""
    t, w, x = uid(), f"w-{uuid.uuid4().hex[:8]}", f"x-{uuid.uuid4().hex[:8]}"
    a, b = f"a-{t}", f"b-{t}"
    error: ConflictError | None = None
    try:
        with pk.resume(t, store=store, state=Log, run_id=w) as run:
            body(run, a, where)
            with pk.resume(t, store=store, state=Log, run_id=x) as other:
                body(other, b, "inside")
    except ConflictError as exc:
        error = exc
    if where == "inside":
        # The run's outcome is in its committed step: its end record is skipped, no error.
        assert error is None and run.status == "completed"
        assert [c.kind for c in rows_of(store, t, w)] == ["step"]
    else:
        # The caller's append after the step is what the end record carried: it is not
        # stored, and the error says so, names the channel, and says what committed.
        assert error is not None
        msg = str(error)
        assert "state.items" in msg and "update_state" in msg, msg
        check_advice(store, t, w, error)
    # Following the advice (the same run_id) replays W's step: it does not run again.
    before = RAN[a]
    with pk.resume(t, store=store, state=Log, run_id=w) as again:
        body(again, a, where)
    assert RAN[a] == before and again.replayed and not again.executed
    items = store.get_state(t, state=Log).items
    assert items.count(b) == 1 and items.count(a) == (1 if where == "inside" else 0)
    if where == "after":  # the advice to apply the change to the new head works
        store.update_state(t, {"items": [a]}, state=Log)
        assert store.get_state(t, state=Log).items.count(a) == 1


def test_step_conflict_with_nothing_committed(store: pk.Store) -> None:
    """X moves the head before W's first step commits: nothing of W is stored, and
    running W again under the same run_id runs it once from the new head."""
    t, w = uid(), f"w-{uuid.uuid4().hex[:8]}"
    a, b = f"a-{t}", f"b-{t}"
    with pytest.raises(ConflictError) as info, pk.resume(t, store=store, state=Log, run_id=w):
        with pk.resume(t, store=store, state=Log):
            add(b)
        add(a)
    msg = str(info.value)
    assert "Nothing of run" in msg and "runs this step again" in msg, msg
    assert not getattr(info.value, "__notes__", None)  # no second, contradicting story
    check_advice(store, t, w, info.value)
    with pk.resume(t, store=store, state=Log, run_id=w) as again:
        add(a)
    assert again.executed and store.get_state(t, state=Log).items == [b, a]


def test_step_conflict_after_committed_steps(store: pk.Store) -> None:
    """W commits step 0, X builds on it, W's step 1 is refused: the message says W's
    step 0 stays, resuming W replays it and stops at step 1, and fork goes on."""
    t, w = uid(), f"w-{uuid.uuid4().hex[:8]}"
    a0, a1, b = f"a0-{t}", f"a1-{t}", f"b-{t}"
    with pytest.raises(ConflictError) as info, pk.resume(t, store=store, state=Log, run_id=w):
        add(a0)
        with pk.resume(t, store=store, state=Log, run_id=f"x-{w}"):
            add(b)
        add(a1)
    msg = str(info.value)
    assert "cannot go on on this thread" in msg and "store.fork" in msg, msg
    assert not getattr(info.value, "__notes__", None)  # no second, contradicting story
    check_advice(store, t, w, info.value)
    ran = RAN[a0]
    with pytest.raises(ConflictError) as replay, pk.resume(t, store=store, state=Log, run_id=w) as again:
        add(a0)
        add(a1)
    assert RAN[a0] == ran and [s.name for s in again.replayed] == ["add"]
    assert "did not finish before the thread moved on" in str(replay.value)
    last = re.search(r"store\.fork\('[^']*', '([0-9a-f]{24})'\)", msg)
    assert last is not None
    fork = store.fork(t, last.group(1))
    assert store.get_state(fork.thread_id, state=Log).items == [a0]
    assert store.get_state(t, state=Log).items == [a0, b]


def test_async_end_record_after_another_writer(store: pk.Store) -> None:
    t, w = uid(), f"w-{uuid.uuid4().hex[:8]}"
    a, b = f"a-{t}", f"b-{t}"

    async def main() -> pk.Run:
        async with pk.resume(t, store=store, state=Log, run_id=w) as run:
            await aadd(a)
            async with pk.resume(t, store=store, state=Log, run_id=f"x-{w}"):
                await aadd(b)
        return run

    run = asyncio.run(main())
    assert run.status == "completed"
    before = RAN[a]

    async def again() -> None:
        async with pk.resume(t, store=store, state=Log, run_id=w):
            await aadd(a)

    asyncio.run(again())
    assert RAN[a] == before and store.get_state(t, state=Log).items == [a, b]


def test_update_state_and_fork_conflicts_say_what_to_do(store: pk.Store) -> None:
    t = uid()
    with pk.resume(t, store=store, state=Log):
        add("x")
    src = store.get_checkpoint(t)
    # A state edit racing a writer: the CAS base is the head read by update_state.
    real = store.backend.head

    def stale_head(thread_id: str, namespace: str) -> Any:
        head = real(thread_id, namespace)
        if thread_id == t:
            store.backend.head = real  # type: ignore[method-assign]
            with pk.resume(t, store=store, state=Log):
                add("y")
        return head

    store.backend.head = stale_head  # type: ignore[method-assign]
    try:
        with pytest.raises(ConflictError, match=r"update_state wrote nothing.*Call update_state again"):
            store.update_state(t, {"items": ["z"]}, state=Log)
    finally:
        store.backend.head = real  # type: ignore[method-assign]
    store.update_state(t, {"items": ["z"]}, state=Log)  # the advice works
    assert store.get_state(t, state=Log).items == ["x", "y", "z"]
    assert src.checkpoint_id != store.get_checkpoint(t).checkpoint_id

    # A fork racing another writer that creates the same new thread first.
    new = uid("fork")

    def created_meanwhile(thread_id: str, namespace: str) -> Any:
        if thread_id == new:
            store.backend.head = real  # type: ignore[method-assign]
            store.fork(t, new_thread_id=new)
            return None  # what the fork read before the other writer created it
        return real(thread_id, namespace)

    store.backend.head = created_meanwhile  # type: ignore[method-assign]
    try:
        with pytest.raises(ConflictError, match=r"another writer created it first.*Fork again"):
            store.fork(t, src.checkpoint_id, new_thread_id=new)
    finally:
        store.backend.head = real  # type: ignore[method-assign]
    assert store.fork(t, src.checkpoint_id).thread_id != new  # the advice works


def test_ambiguous_write_that_landed_below_another_writer(store: pk.Store) -> None:
    """The connection dies after W's step committed, and X writes on top before W reads
    the head back: W's step landed (it is not a conflict, and it is not run again).
    Two writers on one thread: the path without leases (busy=None)."""
    t, w = uid(), f"w-{uuid.uuid4().hex[:8]}"
    a, b = f"a-{t}", f"b-{t}"
    real = store.backend.write
    lost = [True]

    def write(row: Any, blobs: Any, expected: int) -> Any:
        head = real(row, blobs, expected)
        if row.run_id == w and lost[0]:
            lost[0] = False
            with pk.resume(t, store=store, state=Log, run_id=f"x-{w}", busy=None):
                add(b)
            raise pk.BackendUnavailableError("connection lost around the commit (test)")
        return head

    store.backend.write = write  # type: ignore[method-assign]
    try:
        with pk.resume(t, store=store, state=Log, run_id=w, busy=None) as run:
            add(a)
    finally:
        store.backend.write = real  # type: ignore[method-assign]
    assert run.status == "completed" and RAN[a] == 1
    with pk.resume(t, store=store, state=Log, run_id=w) as again:
        add(a)
    assert RAN[a] == 1 and again.replayed
    assert store.get_state(t, state=Log).items == [a, b]


# -- real concurrent writers ---------------------------------------------------------------------

WRITERS = 6
RUNS = 3


def writer(url: str, t: str, name: str, where: str, out: list[str]) -> None:
    """RUNS runs, each with a fresh run_id, each retried on ConflictError as its message says."""
    store = pk.connect(url)
    try:
        for i in range(RUNS):
            item, run_id = f"{name}-{i}", f"{name}-run-{i}"
            for _attempt in range(200):
                try:
                    with pk.resume(t, store=store, state=Log, run_id=run_id) as run:
                        body(run, item, where)
                    break
                except ConflictError as exc:
                    check_advice(store, t, run_id, exc)
                    msg = str(exc)
                    out.append(msg)
                    if "update_state" in msg:  # the caller's append was not stored: apply it
                        for _ in range(200):
                            try:  # through the field's reducer (pk.append), on the head it reads
                                store.update_state(t, {"items": [item]}, state=Log)
                                break
                            except ConflictError as again:
                                assert "Call update_state again" in str(again)
                        break
            else:
                raise AssertionError(f"{run_id} never committed")
    finally:
        store.close()


@pytest.mark.parametrize("where", ["inside", "after"])
def test_concurrent_writers_lose_and_duplicate_nothing(store_url: str, where: str) -> None:
    t = uid()
    conflicts: list[str] = []
    threads = [
        threading.Thread(target=writer, args=(store_url, t, f"w{n}-{uuid.uuid4().hex[:6]}", where, conflicts))
        for n in range(WRITERS)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with pk.connect(store_url) as store:
        items = store.get_state(t, state=Log).items
        assert len(items) == WRITERS * RUNS and len(set(items)) == len(items), Counter(items).most_common(3)
        for cp in store.history(t):
            assert cp.run_id is None or cp.kind in ("step", "end", "update")


def _process_writer(url: str, t: str, name: str, where: str) -> None:
    writer(url, t, name, where, [])


@pytest.mark.parametrize("where", ["inside", "after"])
def test_concurrent_writer_processes(store_url: str, where: str) -> None:
    if store_url.startswith("memory"):
        pytest.skip("a memory store is not shared between processes")
    t = uid()
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_process_writer, args=(store_url, t, f"p{n}-{uuid.uuid4().hex[:6]}", where))
        for n in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    with pk.connect(store_url) as store:
        items = store.get_state(t, state=Log).items
        assert len(items) == 3 * RUNS and len(set(items)) == len(items)
