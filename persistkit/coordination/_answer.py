"""``store.answer(thread_id, value)``: record the answer to a suspended run's question.

The answer is an ordinary step record at the suspend record's position (``s: completed``,
``r``: the answer, ``rs: running``, the suspended run's ``run_id``), carrying the head's
channel refs and schema stamp without decoding a value (as ``store.abandon`` does). For a
``pk.suspend_all`` answered in part it is a suspend record again, with the answer in the
question (``a``), until the last open question is answered.

It is written under the thread's lease, taken the way ``abandon`` takes it (ahead of the
queue, and a lease reserved for the suspended run is taken too), with its fencing token,
against the head version it read: two processes answering at once are serialized by the
lease (and by the head's compare-and-swap on a store without leases), so the second finds
the question answered and raises ``AnswerError``. Nothing of the user's code runs here:
the process that answers (or a worker) calls ``pk.resume`` afterwards.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import AnswerError, ConflictError, NotFoundError, ThreadBusyError
from .._ids import next_checkpoint_id
from .._io import Plan, call, run_async, run_sync
from ..backends._protocol import CheckpointRow, Head, new_row
from ..state._records import Checkpoint, Record
from . import _suspend as S
from ._fence import write_under
from ._lease import DEFAULT_TTL, Lease, acquire, release

if TYPE_CHECKING:
    from ..backends._protocol import Backend
    from ..codec._pipeline import Codec

__all__ = ["answer_async", "answer_sync"]

#: Seconds answer waits for a held lease before it refuses (as ``store.abandon``).
_PATIENCE = 2.0


class Store(Protocol):
    backend: Backend
    codec: Codec

    def _check_open(self) -> None: ...
    def run_sync(self, plan: Plan[Any]) -> Any: ...
    async def run_async(self, plan: Plan[Any]) -> Any: ...


def _where(thread_id: str, namespace: str) -> str:
    return repr(thread_id) + (f" (namespace {namespace!r})" if namespace else "")


def _head(codec: Codec, thread_id: str, namespace: str) -> Plan[tuple[Head, Record]]:
    found: tuple[Head, CheckpointRow] | None = yield call("head_row", thread_id, namespace)
    if found is None:
        raise NotFoundError(f"cannot answer thread {_where(thread_id, namespace)}: it has no checkpoints")
    return found[0], Record.decode(codec, found[1])


def _suspended_run(codec: Codec, thread_id: str, namespace: str, question: str | None) -> Plan[str]:
    """The run id of the thread's suspended run (read before taking the lease)."""
    _, rec = yield from _head(codec, thread_id, namespace)
    if not S.is_suspension(rec):
        raise S.not_suspended(thread_id, rec, question)
    return rec.row.run_id or ""


def _plan(
    store: Store, thread_id: str, namespace: str, value: Any, question: str | None, answer_type: Any,
    lease: Lease | None,
) -> Plan[Checkpoint]:
    codec, t, ns = store.codec, thread_id, namespace
    head, rec = yield from _head(codec, t, ns)
    if not S.is_suspension(rec):
        raise S.not_suspended(t, rec, question)
    k, q = S.pick(rec, question, t, time.time())
    qid = str(q["i"])
    if "ty" in q:
        cls = S.resolve_type(str(q["ty"]), answer_type, codec.serializer.allow_modules, t, qid)
        value = S.validate(value, cls, t, qid, S.context_of(codec, rec, q, cls))
    elif answer_type is not None:
        S.type_name(answer_type, "store.answer(answer_type=)")  # a supported type, or ConfigurationError
        value = S.validate(value, answer_type, t, qid, S.context_of(codec, rec, q, answer_type))
    # unstorable: nothing stored; in stored form, as the copied refs and questions are
    tree = codec.redact_tree(codec.encode(value, f"answer to question {qid} of thread {t!r}"))
    body: dict[str, Any] = {"k": "step", "p": rec.body["p"], "n": rec.body["n"], "t": time.time()}
    qs = rec.body["q"]
    if isinstance(qs, list):
        qs = [dict(x) for x in qs]
        qs[k]["a"] = tree
    if isinstance(qs, list) and any("a" not in x for x in qs):
        body.update({"s": S.SUSPENDED, "rs": S.SUSPENDED, "q": qs})  # still waiting on the others
    else:
        body.update({"s": "completed", "rs": "running", "r": [x["a"] for x in qs] if isinstance(qs, list) else tree})
    # the head's state as it is (channel refs copied, nothing decoded)
    body["ch"] = rec.body.get("ch") or {}
    body["sc"] = rec.body.get("sc")
    if "m" in rec.body:  # the run's metadata, as its own records carry it (a child run's mark too)
        body["m"] = rec.body["m"]
    row = new_row(t, ns, next_checkpoint_id(rec.id), rec.id, rec.row.run_id, codec.pack_stored(body))
    try:
        yield write_under(lease, row, head.version)
    except ConflictError as exc:
        raise AnswerError(
            f"cannot answer thread {_where(t, ns)}: another writer moved the thread's head while the "
            "answer was being written (another answer, or the run going on), so nothing was stored. "
            "Look at the thread again (store.pending()) and answer again if the question is still open",
            thread_id=t, question=qid,
        ) from exc
    return Record(row, body).public(codec)


def _refused(thread_id: str, exc: ThreadBusyError) -> ThreadBusyError:
    return ThreadBusyError(
        f"cannot answer thread {thread_id!r} now: a live run holds the thread's lease ({exc.holder}) — "
        "the suspended run being resumed, or another turn. Nothing was stored; answer again once "
        "it is done (`persistkit leases` shows the holder)",
        thread_id=thread_id, holder=exc.holder, expires_at=exc.expires_at, unfinished_run=exc.unfinished_run,
    )


def answer_sync(
    store: Store, thread_id: str, value: Any, question: str | None, namespace: str, answer_type: Any
) -> Checkpoint:
    store._check_open()
    lease = None
    if store.backend.supports_leases:
        run_id = store.run_sync(_suspended_run(store.codec, thread_id, namespace, question))
        try:
            lease = run_sync(
                store.backend, acquire(thread_id, namespace, "wait", DEFAULT_TTL, _PATIENCE, run_id, ahead=True)
            )
        except ThreadBusyError as exc:
            raise _refused(thread_id, exc) from exc
    try:
        result: Checkpoint = store.run_sync(_plan(store, thread_id, namespace, value, question, answer_type, lease))
        return result
    finally:
        if lease is not None:
            run_sync(store.backend, release(lease))


async def answer_async(
    store: Store, thread_id: str, value: Any, question: str | None, namespace: str, answer_type: Any
) -> Checkpoint:
    store._check_open()
    lease = None
    if store.backend.supports_leases:
        run_id = await store.run_async(_suspended_run(store.codec, thread_id, namespace, question))
        try:
            lease = await run_async(
                store.backend, acquire(thread_id, namespace, "wait", DEFAULT_TTL, _PATIENCE, run_id, ahead=True)
            )
        except ThreadBusyError as exc:
            raise _refused(thread_id, exc) from exc
    try:
        result: Checkpoint = await store.run_async(
            _plan(store, thread_id, namespace, value, question, answer_type, lease)
        )
        return result
    finally:
        if lease is not None:
            await run_async(store.backend, release(lease))
