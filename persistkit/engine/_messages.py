"""``pk.receive`` / ``pk.set_event`` (and async twins): find the run and the position in the
engine's frame; the rest is ``coordination/_receive.py`` (messages and events: ``_inbox.py``)."""

from __future__ import annotations

from typing import Any

from ..coordination import _receive as R
from ..coordination._cancel import cancelled as _cancelled
from ._context import CURRENT
from ._suspend import _frame, _look

__all__ = ["areceive", "aset_event", "cancelled", "receive", "set_event"]


def receive(topic: str = "", *, timeout: float | None = None, suspend_above: float = R.DEFAULT_RECEIVE_SUSPEND_ABOVE) -> Any:
    """The next message sent to this run's thread on ``topic`` (``store.send``), recorded as a
    step: a resumed run gets the same message here and never takes a second one at this place.
    Messages sent before the run got here wait for it, in the order they were sent.

    With no message there yet it waits in this process when ``timeout`` (seconds) is at most
    ``suspend_above`` (default 60), and returns None if none came by then (recorded too). A
    longer ``timeout``, or None (wait as long as it takes), suspends the run instead
    (``pk.Suspended``, as ``pk.suspend``): the process may exit; ``store.due()`` lists the
    run once a message was sent (or the timeout passed) and its next resume goes on here.
    In async code use ``await pk.areceive(...)``."""
    topic, wait, above = R.options(topic, timeout, suspend_above, "pk.receive")
    run, position = _frame("pk.receive")
    return R.receive_sync(run, position, _look(run, position, R.RECEIVE), topic, wait, above, "pk.receive")


async def areceive(
    topic: str = "", *, timeout: float | None = None, suspend_above: float = R.DEFAULT_RECEIVE_SUSPEND_ABOVE
) -> Any:
    """The async twin of :func:`receive`."""
    topic, wait, above = R.options(topic, timeout, suspend_above, "pk.areceive")
    run, position = _frame("pk.areceive")
    return await R.receive_async(run, position, _look(run, position, R.RECEIVE), topic, wait, above, "pk.areceive")


def set_event(key: str, value: Any) -> None:
    """Publish ``value`` as event ``key`` of this run's thread: ``store.get_event(thread_id,
    key)`` returns it to any process (progress a caller waits on: "refund approved", a result
    URL). Recorded as a step: a resumed run does not set it again (the newest value set by
    any run of the thread wins). In async code use ``await pk.aset_event(...)``."""
    key = R.check_event(key, "pk.set_event")
    run, position = _frame("pk.set_event")
    R.event_sync(run, position, _look(run, position, R.EVENT), key, value, "pk.set_event")


async def aset_event(key: str, value: Any) -> None:
    """The async twin of :func:`set_event`."""
    key = R.check_event(key, "pk.aset_event")
    run, position = _frame("pk.aset_event")
    await R.event_async(run, position, _look(run, position, R.EVENT), key, value, "pk.aset_event")


def cancelled() -> bool:
    """Whether the current run was asked to stop (``store.cancel``, or a second message under
    ``busy="interrupt"``): it stops at its next step boundary; a long step may check this and
    return early. False outside a run."""
    frame = CURRENT.get()
    return _cancelled(frame.run if frame is not None else None)
