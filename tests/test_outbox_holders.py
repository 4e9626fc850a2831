"""Who holds a thread's lease, as a drain and a prune report it (issue #34): a drain that
found the lease held by another drain said "a live run holds its lease"."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

import persistkit as pk

RELEASE: dict[str, threading.Event] = {}
STARTED: dict[str, threading.Event] = {}
CRASH: set[str] = set()
POSTED: list[str] = []


class _Crash(BaseException):
    """Stands for a process killed between a step's commit and its effect."""


@pk.register
def post(t: str) -> None:
    if t in CRASH:
        CRASH.discard(t)
        raise _Crash
    STARTED[t].set()  # a drain runs it: that drain holds the thread's lease until it returns
    assert RELEASE[t].wait(60)
    POSTED.append(t)


@pk.checkpointed
def reply(t: str) -> str:
    pk.after_commit(post, t)
    return t


@pk.checkpointed
def think(i: int) -> int:
    return i


def test_a_drain_and_a_prune_name_the_drain_that_holds_the_lease(local_store: pk.Store) -> None:
    t = f"holders-{uuid.uuid4().hex[:8]}"
    STARTED[t], RELEASE[t] = threading.Event(), threading.Event()
    with pk.resume(t, store=local_store):  # a finished turn: a prune may take its steps
        think(1)
        think(2)
    CRASH.add(t)
    with pytest.raises(_Crash), pk.resume(t, store=local_store):
        reply(t)  # committed; its post died: pending
    first: list[Any] = []
    drainer = threading.Thread(target=lambda: first.append(local_store.drain_outbox(thread_id=t)))
    drainer.start()
    try:
        assert STARTED[t].wait(60)  # the first drain holds the lease, running the post
        second = local_store.drain_outbox(thread_id=t)  # waits about 2 s for the lease, then skips
        pruned = local_store.prune(pk.Retention(keep_last=1), thread_id=t)
    finally:
        RELEASE[t].set()
        drainer.join(60)
    ((thread, _, why),) = second.skipped
    assert thread == t and second.done == () and "a live run" not in why, why
    assert why.startswith("a drain of the outbox (store.drain_outbox) in drain@") and "waited 2 s" in why, why
    ((_, _, why),) = pruned.skipped
    assert why.startswith("a drain of the outbox") and pruned.checkpoints == 0, why
    assert [e.thread_id for e in first[0].done] == [t] and POSTED.count(t) == 1
