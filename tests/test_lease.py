"""Leases inside one process, on every store: policies, heartbeats, fencing, wrappers.

The process-level guarantees (pauses, kills, FIFO across processes) are in
test_lease_processes.py; these check the same rules with threads and tasks.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.backends import Backend
from persistkit.backends.memory import MemoryBackend


@pk.checkpointed(name="lease.step")
def step(i: int) -> int:
    return i


def _lease(store: pk.Store, thread: str) -> pk.LeaseInfo:
    [found] = [lease for lease in store.leases(prefix=thread) if lease.thread_id == thread]
    return found


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_block_holds_the_lease_and_gives_it_up(store: pk.Store) -> None:
    t = uid("hold")
    with pk.resume(t, store=store) as run:
        step(1)
        inside = _lease(store, t)
        assert inside.held and inside.holder is not None and f":{os.getpid()}:" in inside.holder
        assert run.lease is not None and inside.token == run.lease.token == 1
    after = _lease(store, t)
    assert not after.held and after.holder is None and after.token == 1
    with pk.resume(t, store=store) as run:
        assert run.lease is not None and run.lease.token == 2  # a new holder, a new token
    with pk.resume(t, store=store, busy=None) as run:
        assert run.lease is None
        step(2)
    assert _lease(store, t).token == 2


def test_a_live_run_is_never_joined(store: pk.Store) -> None:
    """Without run_id, a second block waits for the live run instead of continuing it."""
    t = uid("live")
    inside, release = threading.Event(), threading.Event()
    runs: dict[str, str] = {}

    def first() -> None:
        with pk.resume(t, store=store) as run:
            step(1)
            runs["first"] = run.run_id
            inside.set()
            assert release.wait(60)
            step(2)

    holder = threading.Thread(target=first)
    holder.start()
    assert inside.wait(60)
    with pytest.raises(pk.ThreadBusyError) as busy, pk.resume(t, store=store, busy="reject"):
        step(99)
    assert busy.value.holder and busy.value.expires_at > time.time() and busy.value.thread_id == t
    assert "holds its lease until" in str(busy.value)
    with pytest.raises(pk.ThreadBusyError, match=r"busy_timeout=0\.1"), pk.resume(t, store=store, busy="wait", busy_timeout=0.1):
        step(99)
    done: list[str] = []

    def second() -> None:
        with pk.resume(t, store=store, busy="wait") as run:
            done.append(run.run_id)
            step(3)

    waiter = threading.Thread(target=second)
    waiter.start()
    release.set()
    holder.join(60)
    waiter.join(60)
    assert done and done[0] != runs["first"]  # a new run, after the first completed
    kinds = [(cp.kind, cp.run_status) for cp in reversed(store.history(t))]
    assert kinds == [("step", "running"), ("step", "running"), ("end", "completed"), ("step", "running"), ("end", "completed")]


def _take_over(store: pk.Store, thread_id: str) -> bool:
    rec = store.backend.lease_get(thread_id, "")
    assert rec is not None
    return store.backend.lease_swap(thread_id, "", rec.version, rec.token + 1, rec.data)


def test_the_heartbeat_renews_and_a_lost_lease_stops_the_run(store: pk.Store) -> None:
    t = uid("beat")
    with pytest.raises(pk.LeaseLostError) as lost, pk.resume(t, store=store, lease_ttl=0.3) as run:
        step(1)
        first = _lease(store, t).expires_at
        _until(lambda: _lease(store, t).expires_at > first, "a renewal")
        assert run.lease is not None
        # another holder takes over (as after an expiry): the next commit is refused. The
        # heartbeat renews every 0.1 s, so it may move the record between this read and swap
        # (a slow store): read again until the takeover's swap lands.
        _until(lambda: _take_over(store, t), "a takeover")
        step(2)
    assert lost.value.token == 1 and lost.value.found == 2
    history = store.history(t)
    assert [cp.step for cp in history] == ["lease.step"]  # neither step 2 nor an end record landed


def test_async_blocks_hold_renew_and_are_fenced(store: pk.Store) -> None:
    t = uid("async")

    @pk.checkpointed(name="lease.astep")
    async def astep(i: int) -> int:
        return i

    async def main() -> None:
        async with pk.resume(t, store=store, lease_ttl=0.3) as run:
            await astep(1)
            first = (await store.aleases(prefix=t))[0].expires_at
            while (await store.aleases(prefix=t))[0].expires_at <= first:
                await asyncio.sleep(0.01)
            assert run.lease is not None
        assert not (await store.aleases(prefix=t))[0].held
        with pytest.raises(pk.LeaseLostError):
            async with pk.resume(t, store=store, lease_ttl=5):
                await astep(2)
                rec = await store.backend.alease_get(t, "")
                assert rec is not None
                assert await store.backend.alease_swap(t, "", rec.version, rec.token + 1, rec.data)
                await astep(3)

    asyncio.run(main())
    assert [cp.step for cp in store.history(t) if cp.kind == "step"] == ["lease.astep"] * 2


def test_queue_serves_threads_in_arrival_order(local_store: pk.Store) -> None:
    t = uid("fifo")
    order: list[int] = []
    inside, release = threading.Event(), threading.Event()

    def holder() -> None:
        with pk.resume(t, store=local_store):
            inside.set()
            assert release.wait(60)

    def waiter(i: int) -> None:
        with pk.resume(t, store=local_store, busy="queue"):
            order.append(i)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert inside.wait(60)
    for i in range(5):
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        _until(lambda i=i: len(_lease(local_store, t).waiting) == i + 1, f"waiter {i}")  # type: ignore[misc]
    release.set()
    for th in threads:
        th.join(60)
    assert order == list(range(5))


def test_busy_error_counts_only_the_runs_ahead_of_the_waiter(store: pk.Store) -> None:
    """issue 18: a queued waiter that timed out counted itself among those ahead of it."""
    t = uid("ahead")
    inside, release = threading.Event(), threading.Event()

    def holder() -> None:
        with pk.resume(t, store=store):
            inside.set()
            assert release.wait(60)

    def waiter() -> None:
        with pk.resume(t, store=store, busy="queue"):
            step(1)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert inside.wait(60)
    try:
        # alone in the queue: nobody is ahead of it
        with pytest.raises(pk.ThreadBusyError) as alone, pk.resume(t, store=store, busy="queue", busy_timeout=0.2):
            step(0)
        assert alone.value.waiting == 0 and "queue before" not in str(alone.value), str(alone.value)
        threads.append(threading.Thread(target=waiter))
        threads[-1].start()
        _until(lambda: len(_lease(store, t).waiting) == 1, "a waiter")
        with pytest.raises(pk.ThreadBusyError) as second, pk.resume(t, store=store, busy="queue", busy_timeout=0.2):
            step(0)
        assert second.value.waiting == 1 and "; 1 run(s) queue before this one." in str(second.value), str(second.value)
        with pytest.raises(pk.ThreadBusyError) as rejected, pk.resume(t, store=store, busy="reject"):
            step(0)
        assert rejected.value.waiting == 1, str(rejected.value)
    finally:
        release.set()
        for th in threads:
            th.join(60)


@pytest.mark.parametrize("bad", [
    {"busy": "later"}, {"lease_ttl": 0}, {"lease_ttl": True}, {"busy_timeout": -1},
    {"busy_timeout": float("nan")}, {"lease_ttl": float("nan")}, {"lease_ttl": float("inf")},
])
def test_options_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(pk.ConfigurationError, match=next(iter(bad))):
        pk.resume("t", **bad)


def test_an_infinite_busy_timeout_waits_as_long_as_it_takes(tmp_path: Path) -> None:
    with pk.connect(f"sqlite:///{tmp_path}/inf.db") as store, pk.resume("t", store=store, busy_timeout=float("inf")):
        pass


class _NoLeases(MemoryBackend):
    """A store written before leases (it has none of the primitives)."""

    lease_get = Backend.lease_get  # type: ignore[assignment]
    lease_swap = Backend.lease_swap  # type: ignore[assignment]


def test_a_store_without_leases_runs_as_before_unless_asked() -> None:
    store = pk.connect(_NoLeases())
    with pk.resume("t", store=store) as run:
        assert run.lease is None
        step(1)
    with pytest.raises(pk.ConfigurationError, match=r"does not implement lease_get\(\).*busy=None"), pk.resume("t", store=store, busy="queue"):
        pass


def test_wrappers_forward_leases(tmp_path: Any) -> None:
    key = pk.generate_key()
    store = pk.connect(f"sqlite:///{tmp_path}/w.db", encryption=key, integrity=pk.generate_key())
    t = uid("wrapped")
    with pk.resume(t, store=store) as run:
        step(1)
        assert run.lease is not None and _lease(store, t).held
    with pytest.raises(pk.LeaseLostError), pk.resume(t, store=store):
        rec = store.backend.lease_get(t, "")
        assert rec is not None and store.backend.lease_swap(t, "", rec.version, rec.token + 1, rec.data)
        step(2)
    assert store.verify(t).ok


class _WatchedCondition(threading.Condition):
    """Counts notifies, and tells when the lease thread has gone back to waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.notified = 0
        self.waiting = threading.Event()

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_blocks_after_an_idle_spell_never_wake_the_lease_thread() -> None:
    """Waking the lease thread costs the block a GIL hand-over: a block with the default
    TTL must not need it, also right after the thread found nothing to renew."""
    from persistkit.coordination import DEFAULT_TTL
    from persistkit.coordination._drive import _Beater
    from persistkit.coordination._lease import Lease

    backend = MemoryBackend()
    beater = _Beater()
    cond = beater._cond = _WatchedCondition()
    held = Lease("idle", "", "me", None, 1, DEFAULT_TTL)
    key = beater.add(backend, held)  # starts the thread, which waits for this renewal
    assert cond.waiting.wait(timeout=60)
    beater.remove(key)
    cond.waiting.clear()
    with cond:
        cond.notify()  # the thread wakes, finds nothing to renew: the idle spell
    assert cond.waiting.wait(timeout=60)
    cond.notified = 0
    for _ in range(20):  # short blocks, each ending before its renewal is due
        beater.remove(beater.add(backend, held))
    assert cond.notified == 0
    short = Lease("idle", "", "me", None, 1, 0.3)  # due before the thread's next wake-up: wake it
    beater.remove(beater.add(backend, short))
    assert cond.notified == 1


def test_busy_error_fields_are_none_when_they_do_not_apply(tmp_path: Path) -> None:
    import pickle

    with pk.connect(f"sqlite:///{tmp_path}/f.db") as store, pk.connect(f"sqlite:///{tmp_path}/f.db") as other:
        with pk.resume("t", store=store, run_id="A"), pytest.raises(pk.ThreadBusyError) as busy, \
                pk.resume("t", store=other, run_id="B", busy="reject"):
            pass
        assert busy.value.unfinished_run is None and busy.value.holder
        assert pickle.loads(pickle.dumps(busy.value)).unfinished_run is None

        class Crash(BaseException):
            pass

        with pytest.raises(Crash), pk.resume("u", store=store, run_id="A") as run:
            run.state["x"] = 1
            pk.checkpointed(name="f.one")(lambda: 1)()
            raise Crash
        with pytest.raises(pk.ThreadBusyError) as reserved, pk.resume("u", store=store, run_id="B", busy="reject"):
            pass
        assert reserved.value.unfinished_run == "A" and reserved.value.holder is None
        again = pickle.loads(pickle.dumps(reserved.value))
        assert (again.unfinished_run, again.holder) == ("A", None)


def test_abandon_keeps_the_state_of_the_last_committed_checkpoint(tmp_path: Path) -> None:
    """docs/coordination.md: store.abandon / await store.aabandon; what the crashed block
    changed after its last step committed was never written and is not kept."""

    class Crash(BaseException):
        pass

    @pk.checkpointed(name="abandon.step")
    def step(x: str) -> str:
        return x

    with pk.connect(f"sqlite:///{tmp_path}/ab.db") as store:
        for thread in ("sync", "async"):
            with pytest.raises(Crash), pk.resume(thread, store=store, run_id="A") as run:
                run.state["items"] = [step("a0")]  # the step committed before this assignment
                run.state["items"].append(step("a1"))  # a1 committed; the append never was
                raise Crash
        end = store.abandon("sync", "A")
        assert end.run_status == "abandoned"
        assert store.get_state("sync") == {"items": ["a0"]}

        async def main() -> None:
            aend = await store.aabandon("async", "A")
            assert aend.run_status == "abandoned"

        asyncio.run(main())
        assert store.get_state("async") == {"items": ["a0"]}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_block_that_ends_after_its_heartbeat_found_a_takeover_raises(store: pk.Store, mode: str) -> None:
    # A holder paused past its lease (a GC pause, SIGSTOP) whose heartbeat then finds another
    # holder: its block must not end quietly. It writes no end record (the run stays
    # unfinished for its redelivery), so ending without an error let a queue ack the turn
    # and left every later turn of the thread waiting for a redelivery that never came.
    t = uid(f"quiet-{mode}")

    def take_over_and_wait(run: pk.Run) -> None:
        _until(lambda: _take_over(store, t), "a takeover")
        _until(lambda: run.lease is not None and run.lease.lost is not None, "the heartbeat to see it")

    async def main() -> None:
        async with pk.resume(t, store=store, lease_ttl=0.3) as run:
            step(1)
            await asyncio.to_thread(take_over_and_wait, run)

    with pytest.raises(pk.LeaseLostError):
        if mode == "sync":
            with pk.resume(t, store=store, lease_ttl=0.3) as run:
                step(1)
                take_over_and_wait(run)
        else:
            asyncio.run(main())
    assert [cp.kind for cp in store.history(t)] == ["step"], "no end record after the takeover"
