"""``pk.receive`` / ``pk.set_event`` (and async twins): messages into a running run, events out.

The user functions are ``engine/_messages.py`` (they find the run and the position in the
engine's frame); what they do with them is here.

``pk.receive(topic)`` takes the next step position of its scope, like a step named
``pk.receive``. Live, it claims the thread's next message of ``topic`` (``_inbox.take``) and
records it as that step's result: a resumed run replays it there and never takes a second
message at that position (a crash between the claim and the record takes the same one
again). With no message there yet it waits in this process up to ``timeout`` when that is at
most ``suspend_above`` seconds (then records ``None``, the timeout, at that position);
a longer wait (or ``timeout=None``) suspends the run as a long ``pk.sleep`` does: a suspend
record at the position names the topic (``q.tp``) and the timeout (``q.d``), ``pk.Suspended``
ends the block, ``store.pending()`` lists it (``kind == "message"``), and ``store.due()``
lists it once a message was sent or the timeout passed. Its next resume takes the message
(or records the timeout) at the same position and goes on.

``pk.set_event(key, value)`` takes a position too (``pk.set_event``): live it writes the
event to the thread's events (``_inbox.event_plan``), then records the step, so a replay
never sets it again (a later run's newer value is not overwritten by a replay of an older
one); a crash between the two sets the same value again on resume.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from ..backends._capabilities import has, require
from . import _inbox as I
from . import _suspend as S

if TYPE_CHECKING:
    from ..engine._run import Run
    from ..state._records import Record

__all__ = [
    "DEFAULT_RECEIVE_SUSPEND_ABOVE",
    "EVENT",
    "RECEIVE",
    "check_event",
    "event_async",
    "event_sync",
    "options",
    "receive_async",
    "receive_sync",
]

#: ``pk.receive`` waits in the process for at most this many seconds; a longer ``timeout``
#: (or none) suspends the run until a message is sent. Per call: ``suspend_above=``.
DEFAULT_RECEIVE_SUSPEND_ABOVE = 60.0

#: The step names of the records they write.
RECEIVE, EVENT = "pk.receive", "pk.set_event"


def options(topic: object, timeout: object, suspend_above: object, what: str) -> tuple[str, float | None, float]:
    """``pk.receive``'s arguments, checked."""
    I.check_topic(topic, f"{what}(topic=)")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout < float("inf")
    ):
        raise ConfigurationError(
            f"{what}(timeout=) must be seconds >= 0, or None to wait as long as it takes; got {timeout!r}"
        )
    if isinstance(suspend_above, bool) or not isinstance(suspend_above, int | float) or not suspend_above >= 0:
        raise ConfigurationError(f"{what}(suspend_above=) must be a number of seconds >= 0, got {suspend_above!r}")
    if timeout is not None:
        S.in_range(time.time() + timeout, f"{what}()", timeout)
    return str(topic), None if timeout is None else float(timeout), float(suspend_above)


def _decide(run: Run, position: str, rec: Record | None, timeout: float | None, above: float, what: str
            ) -> tuple[bool, Any, float | None, float]:
    """Before any I/O: (True, the recorded value) to replay; else (False, None, the deadline
    (None: none), how long to wait here (0: look once))."""
    if rec is not None and rec.body.get("s") != S.SUSPENDED:
        return True, run.replay(rec), None, 0.0
    if rec is not None and not has(run.store.backend, "kv"):  # store.check_replay's read-only view:
        run.replay(rec)  # the run waits here, as far as a replay can tell (as an unanswered pk.suspend)
        raise S.waiting_on(run, rec)
    require(run.store.backend, "kv", f"{what}()")
    now = time.time()
    if rec is None:
        deadline = None if timeout is None else now + timeout
    else:
        run.replay(rec)  # the state as it was when the run suspended here
        d = S.items(rec)[0].get("d")
        deadline = None if d is None else float(d)
    local = deadline is not None and deadline - now <= above
    return False, None, deadline, deadline if local and deadline is not None else 0.0


def _suspend_body(position: str, topic: str, deadline: float | None) -> dict[str, Any]:
    q: dict[str, Any] = {"i": position, "tp": topic}
    if deadline is not None:
        q["d"] = deadline
    return S.suspend_body(position, RECEIVE, q)


def _timed_out(deadline: float | None) -> bool:
    return deadline is not None and time.time() >= deadline


def receive_sync(
    run: Run, position: str, rec: Record | None, topic: str, timeout: float | None, above: float, what: str
) -> Any:
    """``pk.receive`` at ``position`` of ``run``, whose record there is ``rec`` (or None)."""
    replay, value, deadline, until = _decide(run, position, rec, timeout, above, what)
    if replay:
        return value
    args = (run.codec, run.thread_id, run.namespace, topic, run.run_id, position)
    got = run.store.run_sync(I.wait_plan(*args, until) if until else I.take(*args))
    if got is I.NOTHING and not _timed_out(deadline):
        if rec is not None:
            raise S.waiting_on(run, rec)  # resumed, and still nothing: wait on, write nothing
        raise S.waiting_on(run, S.write_sync(run, _suspend_body(position, topic, deadline)))
    value = None if got is I.NOTHING else got
    run.step_sync(position, RECEIVE, None, result=value)
    return value


async def receive_async(
    run: Run, position: str, rec: Record | None, topic: str, timeout: float | None, above: float, what: str
) -> Any:
    replay, value, deadline, until = _decide(run, position, rec, timeout, above, what)
    if replay:
        return value
    args = (run.codec, run.thread_id, run.namespace, topic, run.run_id, position)
    got = await run.store.run_async(I.wait_plan(*args, until) if until else I.take(*args))
    if got is I.NOTHING and not _timed_out(deadline):
        if rec is not None:
            raise S.waiting_on(run, rec)
        raise S.waiting_on(run, await S.write_async(run, _suspend_body(position, topic, deadline)))
    value = None if got is I.NOTHING else got
    await run.step_async(position, RECEIVE, None, result=value)
    return value


# -- events out -----------------------------------------------------------------------------


def check_event(key: object, what: str) -> str:
    checked = I.check_key(key, f"{what}(key)")
    if checked is None:
        raise ConfigurationError(f"{what}() needs an event key (a non-empty str), got None")
    return checked


def event_sync(run: Run, position: str, rec: Record | None, key: str, value: Any, what: str) -> None:
    """``pk.set_event`` at ``position`` of ``run`` (``rec``: its record there, replayed)."""
    if rec is not None:
        run.replay(rec)
        return
    require(run.store.backend, "kv", f"{what}()")
    run.store.run_sync(I.event_plan(run.codec, run.thread_id, run.namespace, key, value, run.run_id, position))
    run.step_sync(position, EVENT, None, result=None)


async def event_async(run: Run, position: str, rec: Record | None, key: str, value: Any, what: str) -> None:
    if rec is not None:
        run.replay(rec)
        return
    require(run.store.backend, "kv", f"{what}()")
    await run.store.run_async(I.event_plan(run.codec, run.thread_id, run.namespace, key, value, run.run_id, position))
    await run.step_async(position, EVENT, None, result=None)
