"""``StreamStore``: what ``pk.Store`` offers of durable streams (docs/streams.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._io import call
from ..backends._capabilities import require
from . import _format as F
from ._reader import StreamReader

__all__ = ["StreamStore"]


class StreamStore:
    """Mixed into ``pk.Store``: reading and deleting a thread's streams."""

    backend: Any
    codec: Any
    call_sync: Callable[[Any], Any]  # pk.Store's

    def read_stream(
        self, thread_id: str, stream: str = "default", *, after: int | str = 0, final_only: bool = False,
        follow: bool = True, timeout: float | None = None, namespace: str = "", poll_interval: float = 0.05,
    ) -> StreamReader:
        """The records of ``thread_id``'s stream after offset ``after`` (0: from the start), in
        order; then, with ``follow``, its live tail until a run's ``end`` record, or until
        ``timeout`` seconds pass without a record. Iterate it with ``for`` or ``async for``.
        ``final_only``: events only once final (never a superseded one, never a rewind)."""
        return StreamReader(self, thread_id, stream, namespace, after, final_only, follow, timeout, poll_interval)

    def delete_stream(self, thread_id: str, stream: str = "default", *, namespace: str = "") -> bool:
        """Delete one stream of a thread, every record of it; whether it had any."""
        require(self.backend, "kv", "store.delete_stream")
        name = F.check_stream(stream)
        dropped: bool = self.call_sync(call("kv_drop", F.scope_of(thread_id, namespace, name)))
        return dropped
