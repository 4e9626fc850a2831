"""Fencing for writes made outside ``pk.resume``: a block that holds a thread's lease
(an adapter running a framework's own loop, e.g. LangGraph's ``durable_invoke``) makes
every store write of that ``(thread, namespace)`` in its context carry the lease's
token, so a holder that was replaced (its lease expired or taken over) gets
``LeaseLostError`` instead of writing over its successor."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from .._io import Call, call
from ._lease import Lease

__all__ = ["fence_for", "fenced", "write_call", "write_under"]

_FENCES: ContextVar[tuple[Lease, ...]] = ContextVar("persistkit_fences", default=())


@contextmanager
def fenced(lease: Lease) -> Iterator[None]:
    """Writes to ``(lease.thread_id, lease.namespace)`` made in this context (threads and
    tasks started from it inherit it) are fenced by ``lease``'s token."""
    token = _FENCES.set((*_FENCES.get(), lease))
    try:
        yield
    finally:
        _FENCES.reset(token)


def fence_for(thread_id: str, namespace: str) -> Lease | None:
    """The lease fencing writes to ``(thread_id, namespace)`` in this context, if any."""
    for lease in reversed(_FENCES.get()):
        if lease.thread_id == thread_id and lease.namespace == namespace:
            return lease
    return None


def write_call(thread_id: str, namespace: str, *args: Any) -> Call:
    """The store request writing ``args`` (row, blobs, expected version) to ``(thread_id,
    namespace)``: ``write_fenced`` with the token of the lease fencing it in this context (its
    ``LeaseLostError`` if the heartbeat found it taken over), else a plain ``write``."""
    lease = fence_for(thread_id, namespace)
    if lease is None:
        return call("write", *args)
    if lease.lost is not None:
        raise lease.lost
    return call("write_fenced", *args, lease.token)


def write_under(lease: Lease | None, row: Any, expected: int) -> Call:
    """The request writing ``row`` (no blobs) over the thread's head at version ``expected``,
    fenced by ``lease``'s token when one is held; a store without leases: a plain write. What
    the maintenance writes over a head use (``abandon``, ``answer``, a drain's done mark)."""
    if lease is None:
        return call("write", row, {}, expected)
    return call("write_fenced", row, {}, expected, lease.token)
