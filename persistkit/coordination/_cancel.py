"""Stopping a run at its next step boundary: ``store.cancel`` and ``busy="interrupt"``.

A stop is asked of the run that holds the thread's lease, in the lease record itself
(``_lease``: ``"x": [kind, run id or None, token]``; no new store primitive): the holder's
heartbeat reads the record at every renewal (every ``lease_ttl / 3`` s) and tells the run
(``Lease.on_stop``); a run of this process is told at once (:data:`_LIVE`). Told, the run's
status becomes ``cancelling``; the engine's step path, which already tests the status
before every step (for ``pk.suspend``), calls :func:`halt` when it is not ``running``, and
:func:`halt` raises ``pk.RunCancelledError`` there: the step is not run, the error escapes
the block (``finally`` blocks run), and the block's end record says ``cancelled`` (after the
compensations of a saga: ``compensated``) or ``interrupted``. A run that uses none of this
pays nothing per step: the test it meets is the one it always met.

A request names a run id (it outlives the holder: the run's redelivery, which takes the
lease after a crash, finds it when it opens, :func:`watch`) or only the holder's fencing
token (``run_id=None``, and ``busy="interrupt"``: whoever holds the lease now; a new
holder drops it). A run nobody holds (suspended, or its process died) is ended at once
with an end record whose run status is ``cancelled`` (``_abandon``'s record: nothing of
the user's code runs, its committed steps stay). A redelivery of a cancelled or
interrupted run raises ``pk.RunCancelledError`` when it opens and runs nothing.

A live run without a lease (``busy=None``) looks the same as one nobody holds, so it is
ended the same way; it learns of it at its next write, which the head's compare-and-swap
refuses (:func:`cancelled_under`: the engine asks only on a refused write): that step ran but
is not recorded, ``pk.RunCancelledError`` is raised there, and its compensations and its own
end record go on on top of the cancel's record. A failed run (its redelivery would continue
it) is ended the same way too (``_abandon``).
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from .._errors import ConflictError, RunCancelledError, ThreadBusyError
from .._io import Plan, Sleep, call, run_async, run_sync
from ..backends import Head, LeaseRecord
from ._abandon import FAILED
from ._lease import _State
from ._suspend import SUSPENDED, suspended_again
from ._unfinished import CANCELLED, INTERRUPTED, ROLLED_BACK

if TYPE_CHECKING:
    from ..engine._run import Run
    from ._hooks import Holding

__all__ = [
    "CANCELLING", "ask_local", "cancel_async", "cancel_sync", "ending", "halt", "rewind_async", "rewind_sync", "watch",
]

#: ``run.status`` between the stop asked and the step boundary where the run stops.
CANCELLING = "cancelling"
_STATUS = {"cancel": CANCELLED, "interrupt": INTERRUPTED, "rollback": ROLLED_BACK}

#: The live run of each (thread, namespace) opened in this process: a stop asked here is
#: told to it at once, without waiting for its heartbeat.
_LIVE: weakref.WeakValueDictionary[tuple[str, str], Run] = weakref.WeakValueDictionary()
#: The end status each asked run will have.
_ASKED: weakref.WeakKeyDictionary[Run, str] = weakref.WeakKeyDictionary()
#: How many times (20 ms apart, while the lease is held) a refused write that moved nothing looks
#: for a cancel's record: ~30 s, a loaded machine's cancel between taking the lease and writing.
_SEAL_LOOKS = 1500


def watch(run: Run, holding: Holding | None) -> None:
    """``_turns``: ``run`` is open under ``holding``'s lease; listen for stops asked of it."""
    if run.replay_only:
        return
    _LIVE[(run.thread_id, run.namespace)] = run
    lease = holding.lease if holding is not None else None
    if lease is None:
        return
    ref, token = weakref.ref(run), lease.token

    def on_stop(stop: list[Any]) -> None:  # on the heartbeat's thread (or task)
        found = ref()
        if found is not None:
            _apply(found, token, stop)

    lease.on_stop = on_stop
    if lease.known is not None and lease.known[1].stop is not None:  # asked before this holder took it
        _apply(run, token, lease.known[1].stop)


def _apply(run: Run, token: int, stop: list[Any]) -> None:
    kind, run_id, tok = stop
    if run_id == run.run_id or (run_id is None and tok == token):
        _ask(run, str(kind))


def _ask(run: Run, kind: str) -> None:
    if run.status == "running" and not run.replay_only:
        _ASKED[run] = _STATUS.get(kind, CANCELLED)
        run.status = CANCELLING  # the step path tests the status before every step


def ask_local(thread_id: str, namespace: str, kind: str, run_id: str | None = None) -> bool:
    """Tell the live run of the thread in this process (if any, and ``run_id`` if given) at once."""
    run = _LIVE.get((thread_id, namespace))
    if run is None or (run_id is not None and run.run_id != run_id) or run.status != "running":
        return False
    _ask(run, kind)
    return True


def halt(run: Run) -> None:
    """The engine's step path, for a run whose status is not ``running``: raise what stops it
    before the step (``pk.Suspended`` again after a suspend, ``pk.RunCancelledError`` once a
    stop was asked); return for the rest (a replay of a finished run, a rollback)."""
    status = run.status
    if status == SUSPENDED:
        raise suspended_again(run)
    if status == CANCELLING:
        raise stopped(run)


def stopped(run: Run) -> RunCancelledError:
    status = _ASKED.get(run, CANCELLED)
    why = (
        "store.cancel asked it to stop" if status == CANCELLED
        else f'a second message under busy="{"interrupt" if status == INTERRUPTED else "rollback"}" asked it '
        "to stop; the new turn runs next"
    )
    kept = "its state changes are undone, its records stay" if status == ROLLED_BACK else "its finished steps stay"
    return RunCancelledError(
        f"thread {run.thread_id!r} run {run.run_id}: {why}, so it stopped before its next step "
        f"(status {status}; {kept}). A redelivery of it runs nothing: drop the message",
        thread_id=run.thread_id, run_id=run.run_id, status=status,
    )


def ending(run: Run, exc: BaseException) -> bool:
    """``_rollback``: a block ends with ``exc``; if it is this run's stop, its end record takes
    the stop's status. True when nothing is to be rolled back (an interrupt keeps its steps)."""
    if not (isinstance(exc, RunCancelledError) and exc.run_id == run.run_id and run.status == CANCELLING):
        return False
    run._attach["rs"] = exc.status
    return exc.status in (INTERRUPTED, ROLLED_BACK)


def _base_state(run: Run) -> Plan[Any]:
    """The state the run started from: the state of the checkpoint before its first record
    (its base), or, if it wrote nothing, of the head it opened on."""
    from ..state._records import read_rows

    rows = yield from read_rows(run.codec, run.thread_id, run.namespace, run.run_id)
    base_id = rows[0].row.parent_id if rows else (run._head.checkpoint_id if run._head else None)
    if base_id is None:
        return run.spec.empty()
    base = yield from run.store.read_record(run.thread_id, run.namespace, base_id)
    state = yield from run.store.load_state(base, run.spec)
    return state


def rewind_sync(run: Run) -> None:
    """``busy="rollback"``: set ``run.state`` back to the state the run started from, so that its
    end record (status ``rolled_back``) puts the head's state back where the turn found it. Its
    records stay in the history (pruned as any), none of them is changed."""
    if run._attach.get("rs") == ROLLED_BACK:
        run.state = run.store.run_sync(_base_state(run))


async def rewind_async(run: Run) -> None:
    if run._attach.get("rs") == ROLLED_BACK:
        run.state = await run.store.run_async(_base_state(run))


def cancelled_under(run: Run, exc: ConflictError) -> Plan[RunCancelledError | None]:
    """The engine's commit path, when a write of a run without a lease (``busy=None``) is
    refused by the head's compare-and-swap: was it ``store.cancel`` from another process, which
    could not tell the run is live (no lease) and ended it with a ``cancelled`` end record over
    the run's last checkpoint? Then the run stops here: its head becomes that record (its
    compensations and its own end record chain on it), its status ``cancelling``, and the error
    raised in place of the refused write is ``pk.RunCancelledError`` (None for any other writer).
    Only a refused write pays this read."""
    head = run._head
    if run.lease is not None or run.replay_only or run.status != "running" or head is None:
        return None
    if not exc.found_checkpoint:
        return None
    from ..state._records import Record

    version = exc.found
    if exc.found_checkpoint == head.checkpoint_id:
        # Nothing moved: a store that checks the lease with the head's write (S3, DynamoDB)
        # refused it because someone (the cancel, to write its record) holds the lease. Look for
        # that record while the lease is held; once it is free and the head still has not moved,
        # it was no cancel.
        for _ in range(_SEAL_LOOKS):
            lease: LeaseRecord | None = yield call("lease_get", run.thread_id, run.namespace)
            found = yield call("head_row", run.thread_id, run.namespace)
            if found is None:
                return None
            if found[0].checkpoint_id != head.checkpoint_id:
                version, row = found[0].version, found[1]
                break
            if not _State.load(lease).held(time.time()):
                return None
            yield Sleep(0.02)
        else:
            return None
    else:
        row = yield call("get", run.thread_id, run.namespace, exc.found_checkpoint)
    if row is None:
        return None
    rec = Record.decode(run.codec, row)
    if not (rec.kind == "end" and rec.run_status == CANCELLED and rec.row.run_id == run.run_id
            and rec.row.parent_id == head.checkpoint_id):
        return None
    run._head = Head(rec.id, version)
    _ask(run, "cancel")
    return RunCancelledError(
        f"thread {run.thread_id!r} run {run.run_id}: store.cancel ended it (status cancelled) while it ran "
        "without the thread's lease (busy=None), so the checkpoint it was writing was refused: that step "
        "ran, its result is not recorded, and no step runs after it (its finished steps stay). A "
        "redelivery of it runs nothing: drop the message",
        thread_id=run.thread_id, run_id=run.run_id, status=CANCELLED,
    )


def cancelled(run: Run | None) -> bool:
    """``pk.cancelled()``: whether a stop was asked of ``run`` (a long step may stop early)."""
    return run is not None and run.status == CANCELLING


# -- store.cancel ---------------------------------------------------------------------------


def _request(thread_id: str, namespace: str, run_id: str | None) -> Plan[bool]:
    """Ask the holder of the thread's lease to stop (True), or False when nobody holds it."""
    while True:
        rec: LeaseRecord | None = yield call("lease_get", thread_id, namespace)
        st = _State.load(rec)
        if rec is None or not st.held(time.time()):
            return False
        st.stop = ["cancel", run_id, rec.token]
        if (yield call("lease_swap", thread_id, namespace, rec.version, rec.token, st.dump())):
            return True


def _target(store: Any, thread_id: str, namespace: str, run_id: str | None) -> Plan[str]:
    """The run to cancel: ``run_id``, or the thread's unfinished run."""
    if run_id is not None:
        return run_id
    from .._errors import NotFoundError
    from ..state._records import Record

    found = yield call("head_row", thread_id, namespace)
    head = Record.decode(store.codec, found[1]) if found else None
    if head is not None and head.kind == "end" and head.run_status in (CANCELLED, FAILED) and head.row.run_id:
        return head.row.run_id  # cancelled already: nothing more to do; failed: its retry would continue it
    if head is None or head.kind != "step" or not head.row.run_id:
        raise NotFoundError(
            f"cannot cancel thread {thread_id!r}: no run is live or unfinished on it (its newest record "
            f"is {'none' if head is None else 'the end of a run'}); name the run: store.cancel(thread_id, run_id)"
        )
    return head.row.run_id


#: For how many seconds ``store.cancel`` writes its end record again while a run without a lease
#: moves the thread's head meanwhile (each try reads the head anew).
_RETRY_FOR = 15.0


def cancel_sync(store: Any, thread_id: str, run_id: str | None, namespace: str) -> str:
    from ._abandon import abandon_sync

    store._check_open()
    told = ask_local(thread_id, namespace, "cancel", run_id)
    leases = store.backend.supports_leases
    if leases and run_sync(store.backend, _request(thread_id, namespace, run_id)):
        return "requested"
    if told:  # a run of this process, told at once: it may have stopped already, by itself
        return "requested"
    target = store.run_sync(_target(store, thread_id, namespace, run_id))
    until = time.monotonic() + _RETRY_FOR
    while True:
        try:
            abandon_sync(store, thread_id, target, namespace, CANCELLED)
        except ThreadBusyError:  # a run took the lease meanwhile: ask it
            if leases and run_sync(store.backend, _request(thread_id, namespace, target)):
                return "requested"
            raise
        except ConflictError:  # a run without a lease (busy=None) committed meanwhile: look again
            if time.monotonic() >= until:
                raise
            continue
        return CANCELLED


async def cancel_async(store: Any, thread_id: str, run_id: str | None, namespace: str) -> str:
    from ._abandon import abandon_async

    store._check_open()
    told = ask_local(thread_id, namespace, "cancel", run_id)
    leases = store.backend.supports_leases
    if leases and await run_async(store.backend, _request(thread_id, namespace, run_id)):
        return "requested"
    if told:  # a run of this process, told at once: it may have stopped already, by itself
        return "requested"
    target = await store.run_async(_target(store, thread_id, namespace, run_id))
    until = time.monotonic() + _RETRY_FOR
    while True:
        try:
            await abandon_async(store, thread_id, target, namespace, CANCELLED)
        except ThreadBusyError:
            if leases and await run_async(store.backend, _request(thread_id, namespace, target)):
                return "requested"
            raise
        except ConflictError:
            if time.monotonic() >= until:
                raise
            continue
        return CANCELLED
