"""``pk.suspend`` / ``pk.suspend_all`` / ``pk.sleep`` (and async twins): a run that waits.

Each call takes the next step position of its scope, like a step named ``pk.suspend``
(``pk.suspend_all``, ``pk.sleep``). Live, it writes a suspend record there and raises
``pk.Suspended``, which ``pk.resume`` suppresses. On a later resume it finds, at that
position, the answer (``store.answer``) and returns it; or, every question being past its
deadline (a timer past its wake time), it records the defaults as the answer and returns
them; or else it raises ``pk.Suspended`` again and writes nothing. The logic of questions
is in ``coordination/_suspend.py``; this module finds the run and writes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .._errors import AnswerError, ConfigurationError
from ..codec._registry import register
from ..coordination import _suspend as S
from ..coordination._cancel import halt
from ..state._records import Record
from ._api import _CURRENT
from ._run import Run

__all__ = ["DEFAULT_SUSPEND_ABOVE", "asleep", "asuspend", "asuspend_all", "sleep", "suspend", "suspend_all"]

#: ``pk.sleep`` sleeps in the process up to this many seconds; a longer sleep suspends the
#: run with a wake time (``store.due()`` lists it once due). Per call: ``suspend_above=``.
DEFAULT_SUSPEND_ABOVE = 60.0

_SUSPEND, _SUSPEND_ALL, _SLEEP = "pk.suspend", "pk.suspend_all", "pk.sleep"


def _frame(what: str) -> tuple[Run, str]:
    frame = _CURRENT.get()
    if frame is None:
        raise ConfigurationError(
            f"{what}() must be called inside a run (a `with pk.resume(thread_id):` block, or a "
            "@pk.checkpointed step running in one): only a run can be suspended and resumed later"
        )
    run = frame.run
    if run.status != "running":  # another task suspended it (the block is ending), or a stop was asked
        halt(run)
    return run, frame.child()


def _look(run: Run, position: str, name: str) -> Record | None:
    rec = run.lookup(position, name) if position in run._index or run.replay_only else None
    if rec is not None and rec.body.get("s") == S.SUSPENDED and run.replay_only and run._moved_on is not None:
        raise run._unfinished(position, name, "is a suspension that was never answered")
    return rec


def _questions(run: Run, body_q: Any, position: str, what: str, payloads: Sequence[Any], deadline: Any,
               default: Any, answer_type: Any) -> Any:
    name = S.type_name(answer_type, what)
    at = S.deadline_of(deadline, time.time(), what)
    if answer_type is not None and default is not S.MISSING:  # the default is an answer too
        try:
            default = S.validate(default, answer_type, run.thread_id, position)
        except AnswerError as exc:
            raise ConfigurationError(
                f"{what}: default={default!r} does not fit answer_type {answer_type!r}: a resume after "
                f"the deadline would return it as the answer ({exc}). Pass a default of that type"
            ) from None
    qs = [S.make_question(run.codec, position if body_q is None else f"{position}.{k}", p, at, default, name, what)
          for k, p in enumerate(payloads)]
    return qs[0] if body_q is None else qs


def _done_body(position: str, name: str, tree: Any, q: Any = None) -> dict[str, Any]:
    body = {"k": "step", "p": position, "n": name, "s": "completed", "rs": "running", "r": tree}
    if q is not None:
        body["q"] = q
    return body


def _decide(run: Run, rec: Record | None, position: str, name: str) -> tuple[str, Any]:
    """What a suspend call does now: ("return", value), ("write", done body) or ("wait", None)."""
    if rec is None:
        return "ask", None
    if rec.body.get("s") != S.SUSPENDED:  # answered (or the defaults taken): replay it
        return "return", run.replay(rec)
    run.replay(rec)  # the state as it was when the run suspended
    tree = S.ready(rec, time.time())
    if tree is S.MISSING:
        return "wait", None
    return "write", _done_body(position, name, tree)


_write, _awrite, _suspend_body = S.write_sync, S.write_async, S.suspend_body


def _value(run: Run, rec: Record | None) -> Any:
    """The answer recorded in ``rec`` (the defaults this run just recorded)."""
    assert rec is not None  # a completed record is always written
    at = f"thread {run.thread_id!r} run {run.run_id}: answer at {rec.body['p']}"
    return run.codec.decode(rec.body.get("r"), at, live=rec.live)


def _ask(what: str, payloads: Sequence[Any], many: bool, deadline: Any, default: Any, answer_type: Any
         ) -> tuple[Run, str, str, str, Any]:
    run, position = _frame(what)
    if answer_type is not None and not S.type_name(answer_type, what).startswith("builtins:"):  # type: ignore[union-attr]
        register(answer_type)  # the recorded answer revives in this process when the run goes on
    name = _SUSPEND_ALL if many else _SUSPEND
    rec = _look(run, position, name)
    action, value = _decide(run, rec, position, name)
    if action == "ask":
        return run, position, name, "ask", _questions(run, [] if many else None, position, what, payloads,
                                                       deadline, default, answer_type)
    if action == "wait":
        assert rec is not None
        raise S.waiting_on(run, rec)
    return run, position, name, action, value


def _check_many(payloads: object) -> list[Any]:
    if isinstance(payloads, (str, bytes)) or not isinstance(payloads, Sequence) or not payloads:
        raise ConfigurationError(
            f"pk.suspend_all() takes a non-empty list of payloads (one per question), got {payloads!r}"
        )
    return list(payloads)


def suspend(
    payload: Any, *, answer_type: Any = None, deadline: datetime | timedelta | None = None, default: Any = S.MISSING
) -> Any:
    """Suspend the run until ``store.answer(thread_id, value)`` answers ``payload``; return the answer.

    Live, it records the question at the next step position, gives the run's lease up and
    raises ``pk.Suspended``: the ``pk.resume`` block ends cleanly with ``run.status ==
    "suspended"`` and the process may exit. The run's next resume (``pk.resume(thread_id)``
    or its ``run_id``), once answered, replays up to here without running any recorded step
    again and returns the answer. ``answer_type`` (a pydantic model, a dataclass, or bool,
    int, float, str, list, dict) is checked by ``answer()``; ``deadline`` (an aware datetime
    or a timedelta) with ``default``: a resume after the deadline returns ``default``.
    Inside a step, the step's body runs again up to here when the run goes on.
    In async code use ``await pk.asuspend(...)``."""
    run, position, name, action, value = _ask("pk.suspend", [payload], False, deadline, default, answer_type)
    if action == "return":
        return value
    if action == "write":
        return _value(run, _write(run, value))
    raise S.waiting_on(run, _write(run, _suspend_body(position, name, value)))


async def asuspend(
    payload: Any, *, answer_type: Any = None, deadline: datetime | timedelta | None = None, default: Any = S.MISSING
) -> Any:
    """The async twin of :func:`suspend`."""
    run, position, name, action, value = _ask("pk.asuspend", [payload], False, deadline, default, answer_type)
    if action == "return":
        return value
    if action == "write":
        return _value(run, await _awrite(run, value))
    raise S.waiting_on(run, await _awrite(run, _suspend_body(position, name, value)))


def suspend_all(
    payloads: Sequence[Any], *, answer_type: Any = None, deadline: datetime | timedelta | None = None,
    default: Any = S.MISSING,
) -> list[Any]:
    """Ask several questions at once (one position, one suspend record); return their answers
    in order once every one is answered (or past its deadline). Each is answered on its own:
    ``store.answer(thread_id, value, question="<position>.<k>")`` (``store.pending()`` and
    ``run.suspended`` list the ids). ``answer_type``, ``deadline`` and ``default`` apply to each."""
    many = _check_many(payloads)
    run, position, name, action, value = _ask("pk.suspend_all", many, True, deadline, default, answer_type)
    if action == "return":
        return list(value)
    if action == "write":
        return list(_value(run, _write(run, value)))
    raise S.waiting_on(run, _write(run, _suspend_body(position, name, value)))


async def asuspend_all(
    payloads: Sequence[Any], *, answer_type: Any = None, deadline: datetime | timedelta | None = None,
    default: Any = S.MISSING,
) -> list[Any]:
    """The async twin of :func:`suspend_all`."""
    many = _check_many(payloads)
    run, position, name, action, value = _ask("pk.asuspend_all", many, True, deadline, default, answer_type)
    if action == "return":
        return list(value)
    if action == "write":
        return list(_value(run, await _awrite(run, value)))
    raise S.waiting_on(run, await _awrite(run, _suspend_body(position, name, value)))


# -- timers ------------------------------------------------------------------------------------


def _seconds(duration: object, suspend_above: object) -> tuple[float, float]:
    if isinstance(duration, timedelta):
        secs = duration.total_seconds()
    elif isinstance(duration, (int, float)) and not isinstance(duration, bool):
        secs = float(duration)
    else:
        raise ConfigurationError(f"pk.sleep() takes seconds (a number) or a timedelta, got {duration!r}")
    if not secs >= 0 or secs == float("inf"):
        raise ConfigurationError(f"pk.sleep() needs a finite duration >= 0, got {duration!r}")
    S.in_range(time.time() + secs, "pk.sleep()", duration)
    if not isinstance(suspend_above, (int, float)) or isinstance(suspend_above, bool) or not suspend_above >= 0:
        raise ConfigurationError(f"pk.sleep(suspend_above=) must be a number of seconds >= 0, got {suspend_above!r}")
    return secs, float(suspend_above)


def _timer(duration: object, suspend_above: object, what: str) -> tuple[Run, str, str, float, Any]:
    """What a sleep does: ("sleep", seconds, body to write first or None), ("done", 0) or raise."""
    secs, above = _seconds(duration, suspend_above)
    run, position = _frame(what)
    rec = _look(run, position, _SLEEP)
    now = time.time()
    if rec is None:
        q = {"i": position, "w": 1, "d": now + secs}
        if secs <= above:  # sleep here; the wake time is recorded first, so a crash sleeps only the rest
            return run, position, "sleep", secs, _done_body(position, _SLEEP, None, q)
        return run, position, "suspend", 0.0, _suspend_body(position, _SLEEP, q)
    run.replay(rec)
    wake = float(S.items(rec)[0].get("d") or 0.0) if "q" in rec.body else now
    left = max(0.0, wake - now)
    if rec.body.get("s") != S.SUSPENDED:
        return run, position, "sleep", left, None  # slept in part before a crash: only the rest
    if left > above:
        raise S.waiting_on(run, rec)
    return run, position, "sleep", left, _done_body(position, _SLEEP, None)


def sleep(duration: float | timedelta, *, suspend_above: float = DEFAULT_SUSPEND_ABOVE) -> None:
    """A durable sleep inside a run. Up to ``suspend_above`` seconds (default 60) it sleeps
    in this process, its wake time recorded first (a crash resumes sleeping only the rest);
    longer, it suspends the run with that wake time (``pk.Suspended``, like ``pk.suspend``):
    ``store.due()`` lists it once due, and a resume then goes on. A replay never sleeps
    again for time already slept. In async code use ``await pk.asleep(...)``."""
    run, _, action, secs, body = _timer(duration, suspend_above, "pk.sleep")
    if action == "suspend":
        raise S.waiting_on(run, _write(run, body))
    if body is not None and "q" in body:  # live: the wake time first, then the sleep
        _write(run, body)
        body = None
    if secs > 0:
        time.sleep(secs)
    if body is not None:  # a suspended timer woken here: recorded done
        _write(run, body)


async def asleep(duration: float | timedelta, *, suspend_above: float = DEFAULT_SUSPEND_ABOVE) -> None:
    """The async twin of :func:`sleep`."""
    import asyncio  # not at import time: `import persistkit` stays cheap

    run, _, action, secs, body = _timer(duration, suspend_above, "pk.asleep")
    if action == "suspend":
        raise S.waiting_on(run, await _awrite(run, body))
    if body is not None and "q" in body:
        await _awrite(run, body)
        body = None
    if secs > 0:
        await asyncio.sleep(secs)
    if body is not None:
        await _awrite(run, body)
