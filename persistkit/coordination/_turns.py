"""Turns of one thread in arrival order, even when one of them crashed.

A run is *unfinished* when the thread's head is one of its step records (no end
record): its process died, it was interrupted, it lost its lease, or its block
ended with a ``pk.RetryableError`` (a queue retries it). Another turn (a run
opened with another ``run_id``) must not start on top of it: the unfinished
run's redelivery would find the thread moved on and could never finish.

So ``pk.resume`` opens its run under the lease, and when ``Run.open`` finds the
thread's newest run unfinished and not its own it raises :class:`Unfinished`;
:func:`open_sync` / :func:`open_async` then give the lease up *reserved* for that
run (``_lease.step_aside``: only a resume continuing it, or ``store.abandon``, may
take it; under ``busy="queue"`` this run keeps its place at the front of the
queue) and wait for their turn again, up to ``busy_timeout`` in all, after which
``ThreadBusyError`` names the unfinished run (``unfinished_run``).
``busy="reject"`` raises at once. With ``unfinished_timeout`` (``unfinished``), a turn
waits that long for the unfinished run, then gives its place back and raises
``ThreadBusyError`` with ``retry_after`` (``_lease.acquire``): on a job queue its
worker slot is then free for the unfinished run's redelivery, which would otherwise
wait for a slot behind the turns waiting for it. ``busy=None`` takes no lease and checks
nothing (the run starts on top; the unfinished run's redelivery then raises
``ConflictError``).

A redelivered turn that finished waits for nothing: with a ``run_id``, when the lease
cannot be taken at once (before waiting, queueing or refusing), one indexed read of the
run's newest record (:func:`_asker`) tells whether the run completed or was abandoned;
it then opens without the lease (a completed run replays and writes nothing; an
abandoned one raises ``RunAbandonedError``), even while another turn holds the thread.
A turn that finds the lease free pays nothing for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._io import Plan, run_async, run_sync
from ._cancel import ask_local, watch
from ._drive import AsyncHeartbeat, Heartbeat
from ._hooks import Holding, hold_async, hold_sync, let_go_async, let_go_sync
from ._lease import Finished, acquire, step_aside
from ._saga import COMPENSATED
from ._unfinished import ENDED, Unfinished

COMPLETED = "completed"  # the end status of a completed run (engine/_cursor.py names it too)

if TYPE_CHECKING:
    from ..engine._run import Run

__all__ = ["open_async", "open_sync"]


def _asker(run: Run, run_id: str | None) -> Callable[[], Plan[bool]] | None:
    """What ``acquire`` asks, once, when the lease cannot be taken at once: did run ``run_id``
    finish (completed or abandoned) on the thread? Nothing can change such a run any more,
    so it opens without the lease. A failed run is not among them: on a thread that has
    not moved on, its redelivery continues it (its escaped steps run again) under the lease."""
    if run_id is None:
        return None

    def finished() -> Plan[bool]:
        status = yield from run.ended(run_id)
        return status in (COMPLETED, COMPENSATED, *ENDED)

    return finished


def open_sync(
    run: Run, run_id: str | None, busy: str | None, explicit: bool, ttl: float,
    timeout: float | None, outer: Run | None, unfinished: float | None = None,
) -> Holding | None:
    """Take the thread's lease and open ``run`` (``run_id``) under it, waiting while the
    thread's newest run is another, unfinished one. Holds nothing when it raises (a lease it
    could not give up, the store failing, expires by itself)."""
    store, since = run.store, time.monotonic()
    if busy in ("interrupt", "rollback") and outer is None:
        ask_local(run.thread_id, run.namespace, busy)  # a live run of this process: told at once
    try:
        holding = hold_sync(
            store, run.thread_id, run.namespace, busy, explicit, ttl, timeout, outer, run_id, _asker(run, run_id),
            unfinished,
        )
    except Finished:
        store.run_sync(run.open(run_id))  # replays without the lease (or raises RunAbandonedError)
        return None
    while True:
        run.lease = holding.lease if holding else None
        # a block nested in a block of the same thread shares its lease: it cannot wait
        # (the two runs meet at the head's compare-and-swap, as without leases)
        run.keeps_turns = holding is not None and holding.beat is not None
        try:
            store.run_sync(run.open(run_id))
            watch(run, holding)
            return holding
        except Unfinished as exc:
            blocked = exc
        except BaseException:
            let_go_sync(store, holding)
            raise
        assert holding is not None and busy is not None  # open() raises Unfinished only under its own lease
        holding.beat.stop()
        lease = holding.lease
        if run.turn_check is not None:  # busy="debounce": a turn may have taken this one's message meanwhile
            try:
                store.run_sync(run.turn_check())
            except BaseException:
                run_sync(store.backend, step_aside(lease, blocked.run_id, "wait"))  # reserved again, not queued
                raise
        run_sync(store.backend, step_aside(lease, blocked.run_id, busy))
        me = (lease.owner, lease.probe)
        new = run_sync(
            store.backend, acquire(
                run.thread_id, run.namespace, busy, ttl, timeout, run_id, me=me, since=since,
                unfinished=unfinished, looked=True,
            )
        )
        holding = Holding(new, Heartbeat(store.backend, new))


async def open_async(
    run: Run, run_id: str | None, busy: str | None, explicit: bool, ttl: float,
    timeout: float | None, outer: Run | None, unfinished: float | None = None,
) -> Holding | None:
    store, since = run.store, time.monotonic()
    if busy in ("interrupt", "rollback") and outer is None:
        ask_local(run.thread_id, run.namespace, busy)
    try:
        holding = await hold_async(
            store, run.thread_id, run.namespace, busy, explicit, ttl, timeout, outer, run_id, _asker(run, run_id),
            unfinished,
        )
    except Finished:
        await store.run_async(run.open(run_id))
        return None
    while True:
        run.lease = holding.lease if holding else None
        # a block nested in a block of the same thread shares its lease: it cannot wait
        # (the two runs meet at the head's compare-and-swap, as without leases)
        run.keeps_turns = holding is not None and holding.beat is not None
        try:
            await store.run_async(run.open(run_id))
            watch(run, holding)
            return holding
        except Unfinished as exc:
            blocked = exc
        except BaseException:
            await let_go_async(store, holding)
            raise
        assert holding is not None and busy is not None
        await holding.beat.stop()
        lease = holding.lease
        if run.turn_check is not None:
            try:
                await store.run_async(run.turn_check())
            except BaseException:
                await run_async(store.backend, step_aside(lease, blocked.run_id, "wait"))
                raise
        await run_async(store.backend, step_aside(lease, blocked.run_id, busy))
        me = (lease.owner, lease.probe)
        new = await run_async(
            store.backend, acquire(
                run.thread_id, run.namespace, busy, ttl, timeout, run_id, me=me, since=since,
                unfinished=unfinished, looked=True,
            )
        )
        holding = Holding(new, AsyncHeartbeat(store.backend, new))
