"""``pk.emit``: append an event to the current thread's durable stream (docs/streams.md).

Here, in the engine's floor, only because it reads the engine's frame (as ``_outbox`` does
for ``pk.after_commit``); what an emit does is ``persistkit/streams/_writer.py``.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigurationError
from ..streams._writer import emit_in
from ._context import CURRENT
from ._replay_check import CHECKING

__all__ = ["emit"]


def emit(event: Any, /, *, stream: str = "default") -> None:
    """Append ``event`` (a JSON-able value: anything a step may return) to the thread's stream
    ``stream``. It returns at once; readers (``store.read_stream``) see it within milliseconds,
    before the step that emits it commits. An emit that replayed code makes again (a resume,
    a retry) writes nothing: the earlier attempt's event stands; events of an attempt that
    died are taken back by one ``rewind`` record (docs/streams.md)."""
    frame = CURRENT.get()
    if frame is None:
        raise ConfigurationError(
            "pk.emit(...) was called outside a pk.resume block: a stream belongs to a thread. "
            "Call it inside `with pk.resume(thread_id):` (or a @pk.checkpointed step of one)"
        )
    if CHECKING.get() is not None:  # store.check_replay: nothing is written
        return
    emit_in(frame, event, stream)
