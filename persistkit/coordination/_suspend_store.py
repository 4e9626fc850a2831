"""``pk.Store``'s methods for suspended runs: ``answer``, ``pending``, ``due`` (and async twins).

``pending`` and ``due`` find suspended runs with the store protocol alone: they list the
store's threads and read each thread's head (``head_row``: one round trip per thread, one
statement on PostgreSQL, SQLite and memory). A suspended run is a thread whose head is a
suspend record, so nothing else is read; the cost is O(threads in the store, or under
``prefix``). Poll them at the rate your reminders or timers need (a minute), not per request.
A store with a key-value index (the planned ``kv`` capability) can later list suspended
threads directly; the answers stay the same.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from .._io import Plan, call
from ..state._records import Checkpoint, Record
from . import _suspend as S
from ._answer import answer_async, answer_sync
from ._children import marked

if TYPE_CHECKING:
    from ..backends._protocol import Backend
    from ..codec._pipeline import Codec

__all__ = ["SuspendStore"]

_PAGE = 500


def _check(value: object, what: str) -> str:
    if not isinstance(value, str) or (what != "namespace" and (not value or "\x00" in value)):
        raise ConfigurationError(f"{what} must be a non-empty str without NUL, got {value!r}")
    return value


def _when(now: datetime | float | None) -> float:
    if now is None:
        return time.time()
    if isinstance(now, datetime):
        if now.tzinfo is None:
            raise ConfigurationError(f"now={now!r} is a naive datetime; pass an aware one (datetime.now(UTC))")
        return now.timestamp()
    if isinstance(now, (int, float)) and not isinstance(now, bool):
        return S.in_range(float(now), "now", now)
    raise ConfigurationError(f"now must be an aware datetime, seconds since the epoch or None, got {now!r}")


def _suspensions(codec: Codec, prefix: str, namespace: str, answered: bool = False) -> Plan[list[Record]]:
    """The suspend record at the head of every thread (under ``prefix``) that has one (and,
    with ``answered``, the answer record of a run nobody resumed since)."""
    if not isinstance(prefix, str):
        raise ConfigurationError(f"prefix must be a str, got {type(prefix).__name__}")
    out: list[Record] = []
    after = None
    while True:
        page: list[str] = yield call("threads", prefix=prefix, after=after, limit=_PAGE)
        for t in page:
            found = yield call("head_row", t, namespace)
            if found is None:
                continue
            rec = Record.decode(codec, found[1])
            if S.is_suspension(rec) or (answered and S.is_answered(rec)):
                out.append(rec)
        if len(page) < _PAGE:
            return out
        after = page[-1]


def _pending(codec: Codec, prefix: str, namespace: str, at: float) -> Plan[list[S.Question]]:
    recs = yield from _suspensions(codec, prefix, namespace)
    out: list[S.Question] = []
    for rec in recs:
        for q in S.questions(codec, rec):
            if q.kind in ("question", "message", "child") and (q.deadline is None or q.deadline.timestamp() > at):
                out.append(q)
    return out


def _due(codec: Codec, prefix: str, namespace: str, at: float, answered: bool) -> Plan[list[S.DueRun]]:
    recs = yield from _suspensions(codec, prefix, namespace, answered=answered)
    out: list[S.DueRun] = []
    for rec in recs:
        if marked(rec):
            continue  # a child run: its parent is due instead (its resume hands the child over again)
        if S.is_answered(rec):  # answered, and the process that answered never resumed it
            out.append(S.DueRun(
                thread_id=rec.row.thread_id, namespace=rec.row.namespace, run_id=rec.row.run_id or "",
                due_at=datetime.fromtimestamp(float(rec.body.get("t") or at), UTC), questions=(),
            ))
            continue
        if S.ready(rec, at) is S.MISSING and not (yield from _message_came(codec, rec)) and not (
            yield from _child_ended(codec, rec)
        ):
            continue
        qs = S.questions(codec, rec)
        when = max((q.deadline for q in qs if q.deadline is not None), default=None)
        out.append(S.DueRun(
            thread_id=rec.row.thread_id, namespace=rec.row.namespace, run_id=rec.row.run_id or "",
            due_at=when or datetime.fromtimestamp(at, UTC), questions=tuple(qs),
        ))
    out.sort(key=lambda d: (d.due_at, d.thread_id))
    return out


def _message_came(codec: Codec, rec: Record) -> Plan[bool]:
    """Whether ``rec`` is a ``pk.receive`` waiting for a message that was sent since (``_inbox``)."""
    qs = S.items(rec)
    topic = qs[0].get("tp") if qs else None
    if not isinstance(topic, str):
        return False
    from ._inbox import peek

    came: bool = yield from peek(
        codec, rec.row.thread_id, rec.row.namespace, topic, rec.row.run_id or "", str(rec.body.get("p"))
    )
    return came


def _child_ended(codec: Codec, rec: Record) -> Plan[bool]:
    """Whether ``rec`` is a ``handle.result()`` waiting for a child run that has ended (``_children``)."""
    from ._children import done_plan

    ended: bool = yield from done_plan(codec, rec)
    return ended


class SuspendStore:
    """Answering suspended runs, and finding them (mixed into ``pk.Store``)."""

    if TYPE_CHECKING:
        backend: Backend
        codec: Codec

        def _check_open(self) -> None: ...
        def run_sync(self, plan: Plan[Any]) -> Any: ...
        async def run_async(self, plan: Plan[Any]) -> Any: ...

    def answer(
        self, thread_id: str, value: Any, *, question: str | None = None, namespace: str = "",
        answer_type: Any = None,
    ) -> Checkpoint:
        """Answer the open question of a suspended run (``pk.suspend``); its next
        ``pk.resume`` goes on, and ``pk.suspend`` returns ``value`` there. ``question`` names
        one when several are open (``store.pending()``). A value that does not fit the
        question's ``answer_type`` (resolved here: pass ``answer_type=`` if this process has
        not registered the class) is refused with ``AnswerError``, as is answering a thread
        that is not suspended, a question answered already or past its deadline; a live run
        holding the thread's lease is ``ThreadBusyError``. Nothing is stored then.
        Returns the answer's checkpoint. It runs no user code: resume the run afterwards."""
        return answer_sync(
            self, _check(thread_id, "thread_id"), value, _question(question), _check(namespace, "namespace"),
            answer_type,
        )

    async def aanswer(
        self, thread_id: str, value: Any, *, question: str | None = None, namespace: str = "",
        answer_type: Any = None,
    ) -> Checkpoint:
        return await answer_async(
            self, _check(thread_id, "thread_id"), value, _question(question), _check(namespace, "namespace"),
            answer_type,
        )

    def pending(self, *, prefix: str = "", namespace: str = "") -> list[S.Question]:
        """Open questions of suspended runs across threads (under ``prefix``), with payloads
        and deadlines: what a review UI or a reminder bot reads. A run waiting for a message
        (``pk.receive``) is listed with ``kind == "message"`` and its ``topic``. A question past its
        deadline is not listed (it takes its default: ``store.due()``). Reads each thread's
        head: O(threads)."""
        result: list[S.Question] = self.run_sync(_pending(self.codec, prefix, _check(namespace, "namespace"), time.time()))
        return result

    async def apending(self, *, prefix: str = "", namespace: str = "") -> list[S.Question]:
        result: list[S.Question] = await self.run_async(
            _pending(self.codec, prefix, _check(namespace, "namespace"), time.time())
        )
        return result

    def due(
        self, now: datetime | float | None = None, *, prefix: str = "", namespace: str = "", answered: bool = False
    ) -> list[S.DueRun]:
        """Suspended runs that a resume now continues: a timer (``pk.sleep``) whose wake time
        passed, questions whose deadlines passed (their defaults are taken), and a
        ``pk.receive`` whose message was sent (``store.send``) or whose timeout passed (one
        more read of the store's kv space for each such run). With
        ``answered=True`` also runs whose questions were answered but that nobody resumed
        since (the answering process died before its resume; ``questions`` is empty for those,
        and one a worker is resuming right now may be listed too: resuming it again waits for
        its lease, then replays) — for the code that resumes answered runs, not for a timer
        scheduler, whose entry may not be the run's. For a
        scheduler (cron, Celery beat, a loop): resume each with ``pk.resume(thread_id,
        run_id=run_id)`` running the same code. Oldest first. Reads each thread's head."""
        _flag(answered)
        result: list[S.DueRun] = self.run_sync(
            _due(self.codec, prefix, _check(namespace, "namespace"), _when(now), answered)
        )
        return result

    async def adue(
        self, now: datetime | float | None = None, *, prefix: str = "", namespace: str = "", answered: bool = False
    ) -> list[S.DueRun]:
        _flag(answered)
        result: list[S.DueRun] = await self.run_async(
            _due(self.codec, prefix, _check(namespace, "namespace"), _when(now), answered)
        )
        return result


def _flag(answered: object) -> None:
    if not isinstance(answered, bool):
        raise ConfigurationError(f"answered must be True or False, got {answered!r}")


def _question(question: object) -> str | None:
    if question is not None and not isinstance(question, str):
        raise ConfigurationError(f"question must be a question id (a str, see store.pending()) or None, got {question!r}")
    return question
