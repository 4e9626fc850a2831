"""``store.abandon(thread_id, run_id)``: give up an unfinished run that will never be redelivered.

A crashed run keeps its place (``_turns``): the thread's next turns wait for its
redelivery. When no redelivery will ever come (the message was dropped, the
queue gave up), ``abandon`` ends the run with an end record whose run status is
``abandoned``. Nothing is rolled back: the record carries the head's state as
it is, so the run's committed steps stay in the thread and the next turn starts
from them. A redelivery of an abandoned run raises ``pk.RunAbandonedError``
when it opens (not retryable: it runs nothing).

It refuses (``ThreadBusyError``) while a live run holds the thread's lease (after
``_PATIENCE`` s): that may be the run itself, still going. It takes the lease
ahead of the queue (abandoning is no turn) and writes with its fencing token.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import ConfigurationError, ConflictError, NotFoundError, ThreadBusyError
from .._ids import next_checkpoint_id
from .._io import Plan, call, run_async, run_sync
from ..backends._protocol import new_row
from ..state._records import Checkpoint, Record
from ._fence import write_under
from ._lease import DEFAULT_TTL, Lease, acquire, release
from ._unfinished import ABANDONED

#: The run status of a failed run's end record (engine/_cursor.py names it too).
FAILED = "failed"

if TYPE_CHECKING:
    from ..backends._protocol import Backend
    from ..codec._pipeline import Codec


class Store(Protocol):
    """What abandoning uses of a ``persistkit.Store`` (which imports this module)."""

    backend: Backend
    codec: Codec

    def _check_open(self) -> None: ...
    def run_sync(self, plan: Plan[Any]) -> Any: ...
    async def run_async(self, plan: Plan[Any]) -> Any: ...
    def read_record(self, thread_id: str, namespace: str, checkpoint_id: str | None) -> Plan[Record]: ...

__all__ = ["abandon_async", "abandon_sync"]

#: Seconds abandon waits for a held lease (a waiting turn looks at the thread for a moment
#: every second) before it refuses: a run that holds it longer is live.
_PATIENCE = 2.0


def _plan(
    store: Store, thread_id: str, namespace: str, run_id: str, lease: Lease | None, status: str = ABANDONED
) -> Plan[Checkpoint]:
    t, ns, codec = thread_id, namespace, store.codec
    where = repr(t) + (f" (namespace {ns!r})" if ns else "")
    verb = "abandon" if status == ABANDONED else "cancel"
    found = yield call("head_row", t, ns)  # the head first: a run that commits meanwhile moves it (the write's CAS)
    head, top = (found[0], Record.decode(codec, found[1])) if found else (None, None)
    if top is not None and top.row.run_id == run_id:
        last = top  # the run's newest record is the head
    else:
        mine = yield call("list", t, ns, run_id=run_id, limit=1)
        if not mine:
            if head is None:
                raise NotFoundError(f"cannot {verb} run {run_id}: thread {where} has no checkpoints")
            raise NotFoundError(
                f"cannot {verb} run {run_id}: thread {where} has no checkpoint of that run (check the "
                "run id in `persistkit history`). A run that committed nothing holds no place: no turn waits for it"
            )
        last = Record.decode(codec, mine[0])
    if last.kind == "end":
        if last.run_status == status:
            return last.public(codec)  # abandoned (cancelled) already: nothing to do
        # A failed run is not over: its redelivery (the same run id) continues it while its
        # failed end is the head. A cancel ends it for good (#39): the redelivery runs nothing.
        if status == ABANDONED or last.run_status != FAILED:
            kinds = "live, suspended, or its process died before its end" if status == ABANDONED else (
                "live, suspended, failed, or its process died before its end")
            raise ConfigurationError(
                f"cannot {verb} run {run_id} of thread {where}: it finished ({last.run_status}); only an "
                f"unfinished run ({kinds}) can be {'abandoned' if status == ABANDONED else 'cancelled'}"
            )
    assert head is not None and top is not None  # the run has a record, so the thread has a head
    if top.id != last.id:
        raise ConfigurationError(
            f"cannot {verb} run {run_id} of thread {where}: the thread moved on past it (its head is "
            f"checkpoint {top.id}" + (f" of run {top.row.run_id}" if top.row.run_id else "") + "), so "
            "no turn waits for it; a redelivery of it raises ConflictError and runs nothing"
        )
    # The head's state as it is (channel refs copied, nothing decoded): the run's steps stay.
    body = {"k": "end", "rs": status, "ch": top.body.get("ch") or {}, "sc": top.body.get("sc"), "t": time.time()}
    row = new_row(t, ns, next_checkpoint_id(top.id), top.id, run_id, codec.pack_stored(body))  # copied: stored form
    try:
        yield write_under(lease, row, head.version)
    except ConflictError as exc:
        raise ConflictError(
            f"cannot {verb} run {run_id} of thread {where}: another writer moved the thread's head "
            f"meanwhile, so nothing was written. Look at the thread again "
            f"(`persistkit history`) and {verb} again if the run is still unfinished",
            thread_id=t, namespace=ns, expected=exc.expected, found=exc.found, found_checkpoint=exc.found_checkpoint,
        ) from exc
    return Record(row, body).public(codec)


def _refused(thread_id: str, run_id: str, exc: ThreadBusyError) -> ThreadBusyError:
    if exc.unfinished_run:
        why = f"the thread waits for its unfinished run {exc.unfinished_run}, not for {run_id}"
    else:
        why = (
            f"a live run holds the thread's lease ({exc.holder}): it may be run {run_id} itself, still "
            "going. Abandon a run only once its process is gone: wait until the lease expires "
            "(`persistkit leases`) and abandon again"
        )
    return ThreadBusyError(
        f"cannot abandon run {run_id} of thread {thread_id!r}: {why}",
        thread_id=thread_id, holder=exc.holder, expires_at=exc.expires_at, unfinished_run=exc.unfinished_run,
    )


def abandon_sync(store: Store, thread_id: str, run_id: str, namespace: str, status: str = ABANDONED) -> Checkpoint:
    store._check_open()
    lease = None
    if store.backend.supports_leases:
        try:
            lease = run_sync(store.backend, acquire(thread_id, namespace, "wait", DEFAULT_TTL, _PATIENCE, run_id, ahead=True))
        except ThreadBusyError as exc:
            raise _refused(thread_id, run_id, exc) from exc
    try:
        result: Checkpoint = store.run_sync(_plan(store, thread_id, namespace, run_id, lease, status))
        return result
    finally:
        if lease is not None:
            run_sync(store.backend, release(lease))


async def abandon_async(
    store: Store, thread_id: str, run_id: str, namespace: str, status: str = ABANDONED
) -> Checkpoint:
    store._check_open()
    lease = None
    if store.backend.supports_leases:
        try:
            lease = await run_async(
                store.backend, acquire(thread_id, namespace, "wait", DEFAULT_TTL, _PATIENCE, run_id, ahead=True)
            )
        except ThreadBusyError as exc:
            raise _refused(thread_id, run_id, exc) from exc
    try:
        result: Checkpoint = await store.run_async(_plan(store, thread_id, namespace, run_id, lease, status))
        return result
    finally:
        if lease is not None:
            await run_async(store.backend, release(lease))
