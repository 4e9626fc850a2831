"""What ``Run.open`` asks of the coordination layer (it imports nothing above it): is the
thread's newest run another turn's unfinished run (``_turns``), and was this run abandoned
(``_abandon``)?"""

from __future__ import annotations

import time

from .._errors import RunAbandonedError, RunCancelledError
from ..state._records import Record

__all__ = [
    "ABANDONED", "CANCELLED", "ENDED", "INTERRUPTED", "ROLLED_BACK", "Unfinished", "abandoned_error", "check_turn",
    "ended_error",
]

#: The run status of an abandoned run's end record.
ABANDONED = "abandoned"
#: The run statuses of a run stopped at a step boundary (``_cancel``): ``store.cancel``, and a
#: second message under ``busy="interrupt"``.
CANCELLED, INTERRUPTED, ROLLED_BACK = "cancelled", "interrupted", "rolled_back"
#: End statuses after which the run never runs again: its redelivery raises (``ended_error``).
ENDED = (ABANDONED, CANCELLED, INTERRUPTED, ROLLED_BACK)


def ended_error(thread_id: str, run_id: str, end: Record) -> RunAbandonedError | RunCancelledError:
    """What opening a run whose end record says ``abandoned``, ``cancelled`` or ``interrupted`` raises."""
    if end.run_status == ABANDONED:
        return abandoned_error(thread_id, run_id, end)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(end.body.get("t") or 0.0)))
    return RunCancelledError(
        f"thread {thread_id!r}: run {run_id} was {end.run_status} (at {when} or before): it does not run "
        "again, and retrying will not change that. Its committed steps stay in the thread. Drop this "
        "message (ack it); to do its work anyway, run it as a new turn with a new run_id",
        thread_id=thread_id, run_id=run_id, status=str(end.run_status),
    )


def abandoned_error(thread_id: str, run_id: str, end: Record) -> RunAbandonedError:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(end.body.get("t") or 0.0)))
    return RunAbandonedError(
        f"thread {thread_id!r}: run {run_id} was abandoned at {when} (store.abandon): it does not "
        "run again, and retrying will not change that. Its committed steps stay in the thread and "
        "later turns went on from them. Drop this message (ack it); to do its work anyway, run it "
        "as a new turn with a new run_id",
        thread_id=thread_id,
        run_id=run_id,
    )


class Unfinished(Exception):
    """Raised by ``Run.open`` (before it changes anything) under a lease: the thread's newest
    run ``run_id`` is unfinished and the run being opened is another one."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


def check_turn(head: Record, run_id: str) -> None:
    """Raise :class:`Unfinished` if ``head`` (the thread's head) is a step of a run other than
    ``run_id`` (a run that has no records yet): that run did not finish (it crashed, or it
    is suspended: ``pk.suspend``, ``pk.sleep``)."""
    other = head.row.run_id
    if head.kind == "step" and head.run_status in ("running", "suspended", "compensating") and other and other != run_id:
        raise Unfinished(other)
