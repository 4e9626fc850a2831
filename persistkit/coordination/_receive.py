"""``pk.receive`` / ``pk.set_event`` (and async twins): messages into a running run, events out.

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
from typing import Any

from .._errors import ConfigurationError
from ..backends._capabilities import require
from ..engine._run import Run
from ..engine._suspend import _frame, _look, _suspended
from . import _inbox as I
from . import _suspend as S

__all__ = ["DEFAULT_RECEIVE_SUSPEND_ABOVE", "areceive", "aset_event", "receive", "set_event"]

#: ``pk.receive`` waits in the process for at most this many seconds; a longer ``timeout``
#: (or none) suspends the run until a message is sent. Per call: ``suspend_above=``.
DEFAULT_RECEIVE_SUSPEND_ABOVE = 60.0

_RECEIVE, _EVENT = "pk.receive", "pk.set_event"


def _options(topic: object, timeout: object, suspend_above: object, what: str) -> tuple[str, float | None, float]:
    I.check_topic(topic, f"{what}(topic=)")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout < float("inf")
    ):
        raise ConfigurationError(f"{what}(timeout=) must be seconds >= 0, or None to wait as long as it takes; got {timeout!r}")
    if isinstance(suspend_above, bool) or not isinstance(suspend_above, int | float) or not suspend_above >= 0:
        raise ConfigurationError(f"{what}(suspend_above=) must be a number of seconds >= 0, got {suspend_above!r}")
    if timeout is not None:
        S.in_range(time.time() + timeout, f"{what}()", timeout)
    return str(topic), None if timeout is None else float(timeout), float(suspend_above)


def _plan(run: Run, position: str, topic: str, timeout: float | None, above: float, what: str) -> tuple[str, Any]:
    """What a receive does now, before any I/O: ("replay", value), ("wait", until, or None
    for: look once, then suspend), or raise ``pk.Suspended`` (a resumed run whose message
    has not come: decided after one look, see :func:`_after_look`)."""
    require(run.store.backend, "kv", f"{what}()")
    rec = _look(run, position, _RECEIVE)
    if rec is not None and rec.body.get("s") != S.SUSPENDED:
        return "replay", run.replay(rec)
    now = time.time()
    if rec is None:
        deadline = None if timeout is None else now + timeout
    else:
        run.replay(rec)  # the state as it was when the run suspended here
        d = S.items(rec)[0].get("d")
        deadline = None if d is None else float(d)
    local = deadline is not None and deadline - now <= above
    return "look", (rec, deadline, local)


def _suspend_body(position: str, topic: str, deadline: float | None) -> dict[str, Any]:
    q: dict[str, Any] = {"i": position, "tp": topic}
    if deadline is not None:
        q["d"] = deadline
    return S.suspend_body(position, _RECEIVE, q)


def receive(topic: str = "", *, timeout: float | None = None, suspend_above: float = DEFAULT_RECEIVE_SUSPEND_ABOVE) -> Any:
    """The next message sent to this run's thread on ``topic`` (``store.send``), recorded as a
    step: a resumed run gets the same message here and never takes a second one at this place.
    Messages sent before the run got here wait for it, in the order they were sent.

    With no message there yet it waits in this process when ``timeout`` (seconds) is at most
    ``suspend_above`` (default 60), and returns None if none came by then (recorded too). A
    longer ``timeout``, or None (wait as long as it takes), suspends the run instead
    (``pk.Suspended``, as ``pk.suspend``): the process may exit; ``store.due()`` lists the
    run once a message was sent (or the timeout passed) and its next resume goes on here.
    In async code use ``await pk.areceive(...)``."""
    topic, timeout, above = _options(topic, timeout, suspend_above, "pk.receive")
    run, position = _frame("pk.receive")
    action, found = _plan(run, position, topic, timeout, above, "pk.receive")
    if action == "replay":
        return found
    rec, deadline, local = found
    store, args = run.store, (run.codec, run.thread_id, run.namespace, topic, run.run_id, position)
    until = deadline if local and deadline is not None else 0.0
    got = store.run_sync(I.wait_plan(*args, until) if until else I.take(*args))
    if got is I.NOTHING and not (deadline is not None and time.time() >= deadline):
        if rec is not None:
            raise _suspended(run, rec)  # resumed, and still nothing: wait on, write nothing
        raise _suspended(run, S.write_sync(run, _suspend_body(position, topic, deadline)))
    value = None if got is I.NOTHING else got
    run.step_sync(position, _RECEIVE, None, result=value)
    return value


async def areceive(
    topic: str = "", *, timeout: float | None = None, suspend_above: float = DEFAULT_RECEIVE_SUSPEND_ABOVE
) -> Any:
    """The async twin of :func:`receive`."""
    topic, timeout, above = _options(topic, timeout, suspend_above, "pk.areceive")
    run, position = _frame("pk.areceive")
    action, found = _plan(run, position, topic, timeout, above, "pk.areceive")
    if action == "replay":
        return found
    rec, deadline, local = found
    store, args = run.store, (run.codec, run.thread_id, run.namespace, topic, run.run_id, position)
    until = deadline if local and deadline is not None else 0.0
    got = await store.run_async(I.wait_plan(*args, until) if until else I.take(*args))
    if got is I.NOTHING and not (deadline is not None and time.time() >= deadline):
        if rec is not None:
            raise _suspended(run, rec)
        raise _suspended(run, await S.write_async(run, _suspend_body(position, topic, deadline)))
    value = None if got is I.NOTHING else got
    await run.step_async(position, _RECEIVE, None, result=value)
    return value


# -- events out -----------------------------------------------------------------------------


def _event(key: object, what: str) -> tuple[Run, str, bool]:
    checked = I.check_key(key, f"{what}(key)")
    if checked is None:
        raise ConfigurationError(f"{what}() needs an event key (a non-empty str), got None")
    run, position = _frame(what)
    require(run.store.backend, "kv", f"{what}()")
    rec = _look(run, position, _EVENT)
    if rec is not None:
        run.replay(rec)
        return run, position, True
    return run, position, False


def set_event(key: str, value: Any) -> None:
    """Publish ``value`` as event ``key`` of this run's thread: ``store.get_event(thread_id,
    key)`` returns it to any process (progress a caller waits on: "refund approved", a result
    URL). Recorded as a step: a resumed run does not set it again (the newest value set by
    any run of the thread wins). In async code use ``await pk.aset_event(...)``."""
    run, position, done = _event(key, "pk.set_event")
    if done:
        return
    run.store.run_sync(I.event_plan(run.codec, run.thread_id, run.namespace, key, value, run.run_id, position))
    run.step_sync(position, _EVENT, None, result=None)


async def aset_event(key: str, value: Any) -> None:
    """The async twin of :func:`set_event`."""
    run, position, done = _event(key, "pk.aset_event")
    if done:
        return
    await run.store.run_async(I.event_plan(run.codec, run.thread_id, run.namespace, key, value, run.run_id, position))
    await run.step_async(position, _EVENT, None, result=None)
