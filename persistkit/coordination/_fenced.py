"""A run's end record that gives its lease up with it (``Backend.write_fenced_swap``).

The run's last write carries the swap that frees its lease (``_lease.freeing``): on a
store that does both in one statement (PostgreSQL) the release costs no round trip of
its own. If the swap does not happen (the record changed since: a waiter queued, a
renewal raced it) the write still stands and ``release`` gives the lease up as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .._errors import BackendUnavailableError, PersistkitError
from .._io import Call, call_async, call_sync, checked
from ..backends import Backend, CheckpointRow, Head
from ._lease import Lease

__all__ = ["write_fenced_swap_async", "write_fenced_swap_sync"]


class Store(Protocol):
    """What these use of a ``persistkit.Store`` (named by what it offers: the store module
    imports the run module, which imports this one)."""

    backend: Backend
    _closed: bool

    def _check_open(self) -> None: ...


def write_fenced_swap_sync(
    store: Store, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, lease: Lease, swap: tuple[int, bytes]
) -> tuple[Head, bool]:
    """``store.write_fenced_sync`` that swaps ``lease``'s record to ``swap`` (its version, new
    data) with the write: (the new head, whether it swapped). After a transient failure the
    write is resolved as ``write_fenced_sync`` resolves it, and reported not swapped."""
    if lease.lost is not None:
        raise lease.lost
    if store._closed:
        store._check_open()
    try:
        return store.backend.write_fenced_swap(row, blobs, expected, lease.token, *swap)
    except BackendUnavailableError as exc:
        req = Call("write_fenced", (row, blobs, expected, lease.token))
        return call_sync(store.backend, req, exc), False
    except PersistkitError:
        raise
    except Exception as exc:
        raise checked("write_fenced_swap", exc) from exc


async def write_fenced_swap_async(
    store: Store, row: CheckpointRow, blobs: Mapping[str, bytes], expected: int, lease: Lease, swap: tuple[int, bytes]
) -> tuple[Head, bool]:
    if lease.lost is not None:
        raise lease.lost
    if store._closed:
        store._check_open()
    try:
        return await store.backend.awrite_fenced_swap(row, blobs, expected, lease.token, *swap)
    except BackendUnavailableError as exc:
        req = Call("write_fenced", (row, blobs, expected, lease.token))
        return await call_async(store.backend, req, exc), False
    except PersistkitError:
        raise
    except Exception as exc:
        raise checked("write_fenced_swap", exc) from exc
