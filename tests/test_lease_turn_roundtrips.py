"""What a turn costs in store round trips (counts only, never time; see bench/bench_turns.py).

A turn is ``with pk.resume(thread, run_id=...)`` with the default lease and a few
steps. Its fixed cost beside one fenced write a step: take the lease (read it, swap
it), open the run (the head and its row in one read, the run's rows), and the end
record, which gives the lease up in the same call (a swap against the record as the
holder last wrote it, with no read first). These count protocol calls; on PostgreSQL
each is one round trip (a store without ``head_row`` or ``write_fenced_swap`` of its
own makes two for those: the defaults compose two primitives).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import persistkit as pk
from persistkit.backends import Backend


class Calls:
    """Counts the protocol calls made into ``backend`` (a call it makes to itself, like
    a default ``head_row`` calling ``head`` and ``get``, counts once: as the call made)."""

    def __init__(self, backend: Backend) -> None:
        self.counts: Counter[str] = Counter()
        self._depth = 0
        for name in dir(type(backend)):
            fn = getattr(backend, name, None)
            if name.startswith("_") or not callable(fn) or name in ("from_url", "close", "aclose", "lease_inner"):
                continue
            setattr(backend, name, self._async(name, fn) if inspect.iscoroutinefunction(fn) else self._sync(name, fn))

    def _count(self, name: str) -> None:
        if self._depth == 0:
            self.counts[name.removeprefix("a") if name.startswith("a") and name != "atomic_blobs" else name] += 1

    def _sync(self, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._count(name)
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def _async(self, name: str, fn: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self._count(name)
            self._depth += 1
            try:
                return await fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted


@pk.checkpointed(name="test.say")
def say(text: str) -> int:
    run = pk.current_run()
    assert run is not None
    run.state.setdefault("messages", []).append(text)
    return len(run.state["messages"])


@pk.checkpointed(name="test.asay")
async def asay(text: str) -> int:
    run = pk.current_run()
    assert run is not None
    run.state.setdefault("messages", []).append(text)
    return len(run.state["messages"])


@pytest.fixture
def counted(store: pk.Store) -> Iterator[tuple[pk.Store, Calls]]:
    calls = Calls(store.backend)
    yield store, calls


# A turn of S steps on a thread: lease_get + lease_swap (take), head_row + list (open:
# the head and its row, the run's rows), S write_fenced (the steps), write_fenced_swap
# (the end record, giving the lease up). Before: head and get apart, and the release a
# lease_get and a lease_swap after the end record: 3 calls more.
FIXED = {"lease_get": 1, "lease_swap": 1, "head_row": 1, "list": 1, "write_fenced_swap": 1}


def _first_turn(steps: int) -> dict[str, int]:
    return {**FIXED, "write_fenced": steps} if steps else dict(FIXED)


@pytest.mark.parametrize("steps", [0, 2, 5])
def test_a_turn_on_a_new_thread(counted: tuple[pk.Store, Calls], steps: int) -> None:
    store, calls = counted
    thread = f"turn-{uuid.uuid4().hex}"
    with pk.resume(thread, store=store, run_id="event-1"):
        for i in range(steps):
            say(f"m{i}")
    assert dict(calls.counts) == _first_turn(steps)
    assert store.leases(prefix=thread)[0].holder is None  # released
    if steps:
        assert store.get_state(thread)["messages"] == [f"m{i}" for i in range(steps)]


def test_a_second_turn_costs_the_same_fixed_round_trips(counted: tuple[pk.Store, Calls]) -> None:
    """A thread's next turn: the run's rows are still one list call (a list channel whose
    items live in earlier rows reads them by page as well: this state keeps them inline),
    and a run id the thread has no record of costs one read more: its tombstone, which
    retention leaves when it deletes a run whole (a redelivery of it must not run again)."""
    store, calls = counted
    thread = f"turn-{uuid.uuid4().hex}"
    with pk.resume(thread, store=store, run_id="event-1"):
        say("hello")
    calls.counts.clear()
    with pk.resume(thread, store=store, run_id="event-2") as run:
        run.state["n"] = 1
        say("again")
    got = dict(calls.counts)
    assert got.pop("list") >= 1
    assert got == {**{k: v for k, v in _first_turn(1).items() if k != "list"}, "get_blobs": 1}


def test_async_turn_makes_the_same_calls(counted: tuple[pk.Store, Calls]) -> None:
    store, calls = counted
    thread = f"turn-{uuid.uuid4().hex}"

    async def turn() -> None:
        async with pk.resume(thread, store=store, run_id="event-1"):
            await asay("a")
            await asay("b")

    asyncio.run(turn())
    assert dict(calls.counts) == _first_turn(2)
    assert store.leases(prefix=thread)[0].holder is None


def test_release_reads_the_record_when_a_waiter_changed_it(counted: tuple[pk.Store, Calls]) -> None:
    """The end record's swap against the record as the holder wrote it fails once a waiter
    queued (the record's version moved): the end record stands, and the release reads the
    record and frees the lease with the waiter kept in place, first in line."""
    store, calls = counted
    thread = f"turn-{uuid.uuid4().hex}"
    backend = store.backend
    with pk.resume(thread, store=store, run_id="event-1"):
        say("x")
        rec = backend.lease_get(thread, "")
        assert rec is not None
        data = json.loads(rec.data)
        data["q"] = [["someone-else", data["e"] + 60, None]]
        assert backend.lease_swap(thread, "", rec.version, rec.token, json.dumps(data).encode())
        calls.counts.clear()
    # the end record (its swap failed), the release: a failed swap, a read, a swap
    assert dict(calls.counts) == {"write_fenced_swap": 1, "lease_swap": 2, "lease_get": 1}
    assert store.get_state(thread)["messages"] == ["x"]
    head = store.history(thread, limit=1)[0]
    assert head.kind == "end" and head.run_status == "completed"
    (info,) = store.leases(prefix=thread)
    assert info.holder is None and info.waiting == ("someone-else",)


def test_release_after_a_takeover_leaves_the_new_holder(counted: tuple[pk.Store, Calls]) -> None:
    """A holder whose lease was taken over (here: its record rewritten with a new token)
    does not free the new holder's lease on exit."""
    store, _ = counted
    thread = f"turn-{uuid.uuid4().hex}"
    backend = store.backend
    block = pk.resume(thread, store=store, run_id="event-1")
    block.__enter__()
    rec = backend.lease_get(thread, "")
    assert rec is not None
    data = json.loads(rec.data)
    data["o"], data["e"] = "the-new-holder", data["e"] + 60
    assert backend.lease_swap(thread, "", rec.version, rec.token + 1, json.dumps(data).encode())
    with pytest.raises(pk.LeaseLostError):
        block.__exit__(None, None, None)
    (info,) = store.leases(prefix=thread)
    assert info.holder == "the-new-holder" and info.token == rec.token + 1
