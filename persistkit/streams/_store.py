"""``StreamStore``: what ``pk.Store`` offers of durable streams (docs/streams.md)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

from .._errors import ConfigurationError, ConflictError
from .._io import Plan, call
from ..backends._capabilities import require
from ..backends._protocol import KvOp
from . import _format as F
from ._reader import StreamReader

__all__ = ["StreamStore", "drop_streams"]


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


def drop_streams(codec: Any, thread_id: str) -> Plan[int]:
    """Drop every stream of ``thread_id``, in each of its namespaces, and its index of streams
    (what ``store.delete_thread`` does to them); how many streams were dropped."""
    try:
        namespaces: list[str] = yield call("namespaces", thread_id)
    except ConfigurationError:  # a store that cannot list them: the default namespace
        namespaces = []
    dropped = 0
    for ns in sorted({"", *namespaces}):
        key = F.index_key(thread_id, ns)
        entry = yield call("kv_get", F.INDEX, key)
        if entry is None or entry.value is None:
            continue
        index = codec.unpack_tree(bytes(entry.value), f"thread {thread_id!r} stream index")
        for name in index.get("s") or () if isinstance(index, dict) else ():
            yield call("kv_drop", F.scope_of(thread_id, ns, str(name)))
            dropped += 1
        with suppress(ConflictError):  # a run of the thread registered a stream meanwhile: its index stays
            yield call("kv_write", F.INDEX, [KvOp(key, entry.version, None)], keep=1)
    return dropped
