"""Suspended runs: the questions a run waits on, and when it may go on (no I/O here).

``pk.suspend(payload)`` (``engine/_suspend.py``) takes the next step position of its
scope and writes a *suspend record* there: an ordinary step record (``k: step``) whose
step status ``s`` and run status ``rs`` are ``suspended`` and whose ``q`` holds the
question (see ``state/_records.py``). The block then ends through :class:`Suspended` (a
``BaseException``, so an agent's ``except Exception`` does not swallow it; a step it
escapes is not recorded) and ``pk.resume`` suppresses it: the lease is given up and the
process may exit.

``store.answer(thread, value)`` (``_answer.py``) writes the answer as a step record at
the SAME position (``s: completed``, ``r``: the answer, ``rs: running``). A resume then
replays up to that position, finds the answer record (a later record at a position wins)
and ``pk.suspend`` returns ``r``: no step before it runs again.

Question objects in ``q`` (short keys, written once per suspension):

====  ===============================================================
``i``  the question id: the position (``"3"``, ``"0/2"``); ``"3.1"`` for the
       second question of a ``pk.suspend_all`` at position 3
``v``  the payload (an encoded tree)
``d``  deadline (seconds since the epoch); for a timer its wake time
``df`` the default answer (an encoded tree), taken by a resume after ``d``
``ty`` the answer type (``"module:qualname"``), checked at ``answer()``
``w``  1: a timer (``pk.sleep``), no question
``a``  the answer given (an encoded tree), in a ``suspend_all`` record
       answered in part
``tp`` the topic of a ``pk.receive`` that waits for a message (no question):
       ``store.send`` is what it waits for; ``d`` is its timeout
``ch`` the child run a ``handle.result()`` waits for (``_children``: its handle's
       tree); ``d`` is its timeout
====  ===============================================================
"""

from __future__ import annotations

import builtins
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._errors import (
    AnswerError,
    ConfigurationError,
    PersistkitError,
    SchemaVersionError,
    SerializationError,
)
from ..codec import _names
from ..codec._registry import _REGISTRY, class_name

if TYPE_CHECKING:
    from ..codec._pipeline import Codec
    from ..state._records import Record

__all__ = [
    "SUSPENDED",
    "DueRun",
    "Question",
    "Suspended",
    "deadline_of",
    "end_async",
    "end_sync",
    "make_question",
    "questions",
    "ready",
    "suppressed",
    "suspend_body",
    "waiting_on",
    "write_async",
    "write_sync",
]

#: The step status and run status of a suspend record.
SUSPENDED = "suspended"
#: The names of the records a run waits in: an answer to one, left at the head, is a run to resume.
ANSWERABLE = ("pk.suspend", "pk.suspend_all")

#: The JSON-like builtin answer types (checked by isinstance; an int is also a float).
_BUILTINS = (bool, int, float, str, list, dict, type(None))


class _Missing:
    def __repr__(self) -> str:
        return "<no default>"


MISSING: Any = _Missing()


@dataclass(frozen=True, slots=True)
class Question:
    """One open question (or timer) of a suspended run (``run.suspended``, ``store.pending()``).

    ``question_id`` is what ``store.answer(..., question=...)`` names (the position of the
    ``pk.suspend`` call; ``"<position>.<k>"`` for the k-th question of ``pk.suspend_all``).
    ``deadline`` (aware UTC) is when ``default`` is taken by the next resume, None without
    one; for a timer (``kind == "timer"``, from ``pk.sleep``) it is the wake time. A run
    waiting for a message (``kind == "message"``, from ``pk.receive``) names its ``topic``
    and takes no answer: ``store.send`` is what it waits for, ``deadline`` its timeout.
    ``payload`` is decoded as stored (secrets stay handles; a class this process cannot
    revive arrives as a plain dict).
    """

    thread_id: str
    namespace: str
    run_id: str
    question_id: str
    payload: Any
    deadline: datetime | None
    has_default: bool
    answer_type: str | None
    asked_at: datetime
    kind: str = "question"
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class DueRun:
    """A suspended run that a resume now continues (``store.due()``): every open question's
    deadline (or the timer's wake time) passed, or (``due(answered=True)``) its questions were
    answered and nobody resumed it since (then ``questions`` is empty and ``due_at`` is the
    answer's time). Resume it with
    ``pk.resume(thread_id, run_id=run_id, namespace=namespace)`` running the same code."""

    thread_id: str
    namespace: str
    run_id: str
    due_at: datetime
    questions: tuple[Question, ...]


class Suspended(BaseException):
    """The run suspended (``pk.suspend``, ``pk.sleep``): raised inside the block, suppressed by
    its ``pk.resume`` (``with`` and ``async with``), after which ``run.status == "suspended"``
    and ``run.suspended`` lists the open questions. A ``BaseException``: ``except Exception``
    in the agent's code does not swallow it, and a step it escapes is not recorded (it runs
    again, up to the suspend, when the run goes on). Do not catch it yourself."""

    def __init__(self, thread_id: str, namespace: str, run_id: str, open_questions: Sequence[Question]) -> None:
        self.thread_id = thread_id
        self.namespace = namespace
        self.run_id = run_id
        self.questions = tuple(open_questions)
        self._record: Record | None = None  # the suspend record (engine/_suspend.py)
        what = ", ".join(q.question_id for q in self.questions)
        super().__init__(f"thread {thread_id!r} run {run_id} suspended on {what}")


def suspended_again(run: Any) -> Suspended:
    """What a step called after the run suspended raises (the block caught ``pk.Suspended``,
    or another task goes on): the run's suspension again, so nothing runs past the question
    and the thread's head stays the suspend record."""
    return Suspended(run.thread_id, run.namespace, run.run_id, run._questions)


def suppressed(run: Any, exc: BaseException | None) -> Suspended | None:
    """This run's :class:`Suspended` that ``pk.resume``'s exit suppresses: ``exc`` itself, or
    one of an exception group of only those (from a ``TaskGroup``); else None."""
    if exc is None or run.status != SUSPENDED:
        return None

    def mine(e: BaseException) -> bool:
        return isinstance(e, Suspended) and e.run_id == run.run_id and e.thread_id == run.thread_id

    if isinstance(exc, BaseExceptionGroup):
        match, rest = exc.split(mine)
        if rest is not None or match is None:
            return None
        found = [e for e in _leaves(match) if isinstance(e, Suspended)]
        return next((e for e in found if e._record is not None), found[0] if found else None)
    return exc if isinstance(exc, Suspended) and mine(exc) else None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def suspend_body(position: str, name: str, q: Any) -> dict[str, Any]:
    """The body of a suspend record at ``position`` (the step named ``name``)."""
    return {"k": "step", "p": position, "n": name, "s": SUSPENDED, "rs": SUSPENDED, "q": q}


def write_sync(run: Any, body: dict[str, Any], again: bool = False) -> Record | None:
    """Commit ``body`` (a suspend record, or the answer a resume records) as the run's next
    checkpoint, with the state as it is; the record it wrote. A suspend record is not written
    (None) when another task of the run suspended it meanwhile, unless ``again``."""
    with run._lock:
        if body["s"] == SUSPENDED and run.status == SUSPENDED and not again:
            return None
        run._result_raw = run._result_tree = None  # no step result for later list items to refer to
        run._write_sync(body, {}, None, None)
        if body["s"] == SUSPENDED:
            run.status = SUSPENDED  # under the lock: a concurrent ask sees it
    rec: Record = run._index[body["p"]]  # run: the engine's Run (which imports this module)
    return rec


async def write_async(run: Any, body: dict[str, Any], again: bool = False) -> Record | None:
    async with run.async_lock():
        if body["s"] == SUSPENDED and run.status == SUSPENDED and not again:
            return None
        run._result_raw = run._result_tree = None
        await run._write_async(body, {}, None, None)
        if body["s"] == SUSPENDED:
            run.status = SUSPENDED
    rec: Record = run._index[body["p"]]
    return rec


def _moved_past(run: Any, exc: BaseException | None) -> dict[str, Any] | None:
    """When the block ends suspended but the thread's head is no longer the suspend record
    (a concurrent step of the run committed after it): the record to write again, so that
    the head says suspended (``store.pending``, ``answer`` and ``due`` read the head)."""
    sus = suppressed(run, exc)
    rec = sus._record if sus is not None else None
    if rec is None or run.replay_only or run._head is None or run._head.checkpoint_id == rec.id:
        return None
    return suspend_body(str(rec.body["p"]), str(rec.body["n"]), rec.body["q"])


def end_sync(run: Any, exc: BaseException | None) -> bool:
    """``pk.resume``'s exit for a block that writes no end record: whether ``exc`` is this
    run's ``pk.Suspended`` (suppressed: the block ends cleanly, the run is suspended)."""
    again = _moved_past(run, exc)
    if again is not None:
        write_sync(run, again, again=True)
    return suppressed(run, exc) is not None


async def end_async(run: Any, exc: BaseException | None) -> bool:
    again = _moved_past(run, exc)
    if again is not None:
        await write_async(run, again, again=True)
    return suppressed(run, exc) is not None


# -- asking --------------------------------------------------------------------------------


def in_range(at: float, what: str, given: object) -> float:
    """``at`` (seconds since the epoch), refused unless it is a time a datetime can hold: a
    deadline or wake time past year 9999 would be stored and then fail every listing."""
    try:
        datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        raise ConfigurationError(
            f"{what}: {given!r} puts the time at {at!r} seconds since the epoch, outside the years "
            "1-9999: pass a real date or duration (seconds, not milliseconds); for no deadline pass none"
        ) from None
    return at


def deadline_of(deadline: datetime | timedelta | float | None, now: float, what: str) -> float | None:
    """A deadline as seconds since the epoch: an aware datetime, a timedelta from now, or None."""
    if deadline is None:
        return None
    if isinstance(deadline, timedelta):
        return in_range(now + deadline.total_seconds(), what, deadline)
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ConfigurationError(
                f"{what}: deadline={deadline!r} is a naive datetime; pass an aware one "
                "(datetime.now(UTC) + timedelta(days=2)) or a timedelta"
            )
        return in_range(deadline.timestamp(), what, deadline)
    raise ConfigurationError(
        f"{what}: deadline must be an aware datetime, a timedelta or None, got {type(deadline).__name__}"
    )


def type_name(answer_type: Any, what: str) -> str | None:
    """The stored name of an answer type: a builtin, a pydantic model or a dataclass."""
    if answer_type is None:
        return None
    if answer_type in _BUILTINS:
        return class_name(answer_type)
    if isinstance(answer_type, type) and (dataclasses.is_dataclass(answer_type) or _is_model(answer_type)):
        if "<locals>" in answer_type.__qualname__:
            raise ConfigurationError(
                f"{what}: answer_type {answer_type.__qualname__} is defined inside a function, so "
                "the process that answers cannot import it; define it at module level"
            )
        return class_name(answer_type)
    raise ConfigurationError(
        f"{what}: answer_type must be a pydantic model, a dataclass or one of bool, int, float, "
        f"str, list, dict, None; got {answer_type!r}"
    )


def make_question(
    codec: Codec, qid: str, payload: Any, deadline: float | None, default: Any, answer_type: str | None, what: str
) -> dict[str, Any]:
    """The ``q`` object of one question (see the module docstring)."""
    q: dict[str, Any] = {"i": qid, "v": codec.encode(payload, f"{what}: payload")}
    if (deadline is None) != (default is MISSING):
        raise ConfigurationError(
            f"{what}: deadline= and default= go together: the default is the answer a resume "
            "after the deadline takes when nobody answered (pass both, or neither)"
        )
    if deadline is not None:
        q["d"] = float(deadline)
        q["df"] = codec.encode(default, f"{what}: default")
    if answer_type is not None:
        q["ty"] = answer_type
    return q


def items(rec: Record) -> list[dict[str, Any]]:
    """The question objects of a suspend record (one, or several for ``suspend_all``)."""
    q = rec.body.get("q")
    return list(q) if isinstance(q, list) else [q] if isinstance(q, dict) else []


def is_answered(rec: Record) -> bool:
    """Whether ``rec`` (a thread's head) is an answer nobody has resumed its run with yet:
    the answer record is still the newest checkpoint, so the run waits for a resume."""
    return rec.kind == "step" and rec.body.get("n") in ANSWERABLE and rec.body.get("s") == "completed"


def is_suspension(rec: Record) -> bool:
    """Whether ``rec`` is a suspend record still waiting (a thread's head that is suspended)."""
    return rec.kind == "step" and rec.body.get("s") == SUSPENDED and "q" in rec.body


def ready(rec: Record, now: float) -> Any:
    """The tree ``pk.suspend`` returns once every open question of suspend record ``rec`` is
    answered or past its deadline (defaults taken), or MISSING while one still waits.
    A timer is ready at its wake time (its value: None)."""
    qs = items(rec)
    answers: list[Any] = []
    for q in qs:
        if "a" in q:
            answers.append(q["a"])
        elif "d" in q and now >= float(q["d"]):
            answers.append(None if q.get("w") else q.get("df"))
        else:
            return MISSING
    return answers if isinstance(rec.body.get("q"), list) else answers[0]


def questions(codec: Codec, rec: Record, open_only: bool = True) -> list[Question]:
    """The public view of a suspend record's open questions."""
    out = []
    asked = datetime.fromtimestamp(float(rec.body.get("t") or 0.0), UTC)
    for q in items(rec):
        if open_only and "a" in q:
            continue
        d = q.get("d")
        timer, topic, child = bool(q.get("w")), q.get("tp"), "ch" in q
        out.append(Question(
            thread_id=rec.row.thread_id, namespace=rec.row.namespace, run_id=rec.row.run_id or "",
            question_id=str(q["i"]), payload=q["ch"] if child else None if timer or topic is not None
            else _payload(codec, q.get("v"), rec),
            deadline=None if d is None else datetime.fromtimestamp(float(d), UTC),
            has_default="df" in q, answer_type=q.get("ty"), asked_at=asked,
            kind="timer" if timer else "message" if topic is not None else "child" if child else "question",
            topic=topic if isinstance(topic, str) else None,
        ))
    return out


def _payload(codec: Codec, tree: Any, rec: Record) -> Any:
    at = f"payload of question at {rec.body.get('p')} of thread {rec.row.thread_id!r}"
    try:
        return codec.decode(tree, at, reveal=False)
    except (SerializationError, SchemaVersionError):  # a class this process cannot revive: as stored
        return codec.decode(tree, at, reveal=False, plain=True)


def now() -> float:
    return time.time()


# -- answering -------------------------------------------------------------------------------


def resolve_type(name: str, given: Any, allow: Sequence[str], thread_id: str, qid: str) -> type:
    """The class a question's answer must fit, in the answering process: ``given``
    (``answer(..., answer_type=)``, which must be that class), a registered class, or one
    from an allowlisted module; else a ConfigurationError saying what to do."""
    if given is not None:
        if not isinstance(given, type) or class_name(given) != name:
            raise AnswerError(
                f"thread {thread_id!r} question {qid}: answer_type={given!r} is not the question's "
                f"answer type {name}; pass that class, or leave answer_type out",
                thread_id=thread_id, question=qid,
            )
        return given
    module, _, qualname = name.partition(":")
    if module == "builtins" and qualname in {t.__name__ for t in _BUILTINS}:
        found: Any = type(None) if qualname == "NoneType" else getattr(builtins, qualname)
        return found  # type: ignore[no-any-return]
    cls = _REGISTRY.get(name)
    if cls is not None:
        return cls
    parsed = _names.parse(name)
    if parsed is not None and _names.trusted(module, tuple(allow)):
        try:
            obj: Any = _names.defined(module, qualname)
        except Exception as exc:
            raise ConfigurationError(f"cannot load answer type {name} for question {qid}: {exc}") from exc
        if isinstance(obj, type):
            return obj
    dotted = f"{module}.{qualname}"
    fix = (
        f"import it and pass it: store.answer(..., answer_type={qualname.rpartition('.')[2]}), or "
        f"pk.register({dotted}), or open the store with pk.connect(..., allow_modules=[{module!r}]) "
        f"(CLI: --allow-module {module})"
    )
    raise ConfigurationError(
        f"thread {thread_id!r} question {qid}: its answer must be a {dotted}, which this process "
        f"cannot resolve: {_names.refusal(name, 'an answer type', fix)}"
    )


def validate(value: Any, cls: type, thread_id: str, qid: str, context: dict[str, Any] | None = None) -> Any:
    """``value`` as an answer of type ``cls`` (a model or dataclass built from a dict),
    or AnswerError saying why it does not fit (nothing is stored). A model or dataclass is
    validated with pydantic's ``context=`` (at ``answer()``: :func:`context_of`), so its
    validators can check the answer against the question; an ``AnswerError`` one raises
    reaches the caller as it is."""
    def refuse(why: str) -> AnswerError:
        return AnswerError(
            f"thread {thread_id!r} question {qid}: the answer does not fit its type "
            f"{cls.__qualname__}: {why}. Nothing was stored; answer again with a valid value",
            thread_id=thread_id, question=qid,
        )

    if cls in _BUILTINS:
        if cls is float and type(value) is int:
            return float(value)
        if isinstance(value, cls) and not (cls is int and type(value) is bool):
            return value
        raise refuse(f"got {type(value).__name__} {value!r}")
    if isinstance(value, cls):
        return value
    if _is_model(cls):
        try:
            return cls.model_validate(value, context=context)  # type: ignore[attr-defined]
        except AnswerError:
            raise
        except Exception as exc:  # pydantic's ValidationError
            raise refuse(str(exc)) from exc
    if dataclasses.is_dataclass(cls):
        if not isinstance(value, dict):
            raise refuse(f"expected a {cls.__qualname__} or a dict of its fields, got {type(value).__name__}")
        try:
            from pydantic import TypeAdapter
        except ImportError:
            try:
                return cls(**value)
            except TypeError as exc:
                raise refuse(str(exc)) from exc
        try:
            return TypeAdapter(cls).validate_python(value, context=context)
        except AnswerError:
            raise
        except Exception as exc:
            raise refuse(str(exc)) from exc
    raise refuse("not a supported answer type")


def context_of(codec: Codec, rec: Record, q: dict[str, Any], cls: type) -> dict[str, Any] | None:
    """The validation context of an answer of type ``cls`` to question ``q`` of suspend record
    ``rec``: the question's decoded ``payload``, ``thread_id`` and ``question`` id (None for a
    builtin type)."""
    if cls in _BUILTINS:
        return None
    return {"payload": _payload(codec, q.get("v"), rec), "thread_id": rec.row.thread_id, "question": str(q["i"])}


def _is_model(cls: Any) -> bool:
    return isinstance(cls, type) and hasattr(cls, "model_validate") and hasattr(cls, "model_fields")


def pick(rec: Record, question: str | None, thread_id: str, at: float) -> tuple[int, dict[str, Any]]:
    """The open question of suspend record ``rec`` that ``answer(question=)`` names."""
    qs = items(rec)
    if qs and qs[0].get("w"):
        wake = datetime.fromtimestamp(float(qs[0].get("d") or 0.0), UTC).isoformat(timespec="seconds")
        raise AnswerError(
            f"thread {thread_id!r} is waiting on a timer (pk.sleep) until {wake}, not on a question: "
            "there is nothing to answer. store.due() lists it once it is due; resume it then",
            thread_id=thread_id, question=question,
        )
    if qs and "tp" in qs[0]:
        raise AnswerError(
            f"thread {thread_id!r} is waiting for a message on topic {qs[0]['tp']!r} (pk.receive), not on a "
            f"question: send it, store.send({thread_id!r}, message, topic={qs[0]['tp']!r}), then resume the run",
            thread_id=thread_id, question=question,
        )
    if qs and "ch" in qs[0]:
        raise AnswerError(
            f"thread {thread_id!r} is waiting for child run {qs[0]['ch'].get('r')!r} (handle.result()), not on "
            "a question: resume the run once the child ended (store.due() lists it then)",
            thread_id=thread_id, question=question,
        )
    open_ = [(k, q) for k, q in enumerate(qs) if "a" not in q]
    ids = [str(q["i"]) for _, q in open_]
    if question is None:
        if len(open_) != 1:
            raise AnswerError(
                f"thread {thread_id!r} has {len(open_)} open questions ({', '.join(ids)}): name one "
                "with question=<id> (store.pending() lists them)",
                thread_id=thread_id,
            )
        k, q = open_[0]
    else:
        hit = [(k, q) for k, q in enumerate(qs) if str(q["i"]) == question]
        if not hit:
            raise AnswerError(
                f"thread {thread_id!r} has no open question {question!r}; its open questions are "
                f"{', '.join(ids) or 'none'} (store.pending() lists them)",
                thread_id=thread_id, question=question,
            )
        k, q = hit[0]
        if "a" in q:
            raise AnswerError(
                f"thread {thread_id!r}: question {question} was answered already; an answer is "
                "given once. Nothing was stored",
                thread_id=thread_id, question=question,
            )
    d = q.get("d")
    if d is not None and at >= float(d):
        when = datetime.fromtimestamp(float(d), UTC).isoformat(timespec="seconds")
        raise AnswerError(
            f"thread {thread_id!r}: question {q['i']} expired at {when}; the run takes its default "
            "answer when it is resumed (store.due() lists it). Nothing was stored",
            thread_id=thread_id, question=str(q["i"]),
        )
    return k, q


#: What a record of each kind is, in a sentence ("its newest checkpoint … is the end of a run").
_KIND_WORDS = {"step": "a step's record", "end": "the end of a run", "fork": "the first record of a fork",
               "update": "a state update (store.update_state)"}


def not_suspended(thread_id: str, head: Record, question: str | None) -> PersistkitError:
    """The error for answering a thread whose head is no open suspension."""
    if is_answered(head):
        why = (
            "its question was answered already (the answer is its newest checkpoint, "
            f"{head.id}); an answer is given once. Resume the run to go on: "
            f"pk.resume({thread_id!r}, run_id={head.row.run_id!r})"
        )
    else:
        what = _KIND_WORDS.get(head.kind, f"a {head.kind!r} record")
        status = f", run status {head.run_status}" if head.run_status else ""
        why = f"it is not suspended (its newest checkpoint {head.id} is {what}{status})"
    return AnswerError(
        f"cannot answer thread {thread_id!r}: {why}. Nothing was stored", thread_id=thread_id, question=question
    )


def waiting_on(run: Any, rec: Record | None) -> Suspended:
    """The ``pk.Suspended`` to raise: the run waits on ``rec`` (None: another task of the run
    suspended it while this one was about to ask; its question is asked on the next resume).
    ``pk.suspend``/``pk.sleep`` (engine/_suspend) and ``pk.receive`` (_receive) raise it;
    ``run`` is the engine's Run (not imported: the engine imports this module)."""
    run.status = SUSPENDED
    if rec is not None:
        run._questions = questions(run.codec, rec)
    exc = Suspended(run.thread_id, run.namespace, run.run_id, run._questions)
    exc._record = rec
    return exc
