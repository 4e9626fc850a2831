"""The ``prune`` capability: deleting single checkpoint rows and blobs (retention).

A base of :class:`~persistkit.backends._protocol.Backend` (the protocol module is
near its size bound). Retention (``persistkit/ops/_retention.py``) decides what
goes; these primitives only delete, and are never on the step path:

``prune_rows(thread_id, namespace, checkpoint_ids)``
    Delete these rows of ``(thread_id, namespace)``, newest first. Ids that do not
    exist are skipped. Rows whose id is not below the head's checkpoint id are
    never deleted (skipped, in the same atomic operation as the deletion where the
    store has transactions): the head's row, and anything written after the caller
    decided, stay. Returns how many rows were deleted. A store without
    multi-object transactions (S3) deletes newest first, so an interrupted call
    leaves the older part of what was asked: retention roots a kept list at the
    newest row it loses (``state._channels.root_key``), so that row goes first and
    readers never reach a row older than it; retention is safe to run again.
``delete_blobs(thread_id, keys)``
    Delete these blobs of ``thread_id``; missing keys are skipped. Returns how many
    existed.
``blob_sizes(thread_id)``
    Every blob key of ``thread_id`` with its stored size in bytes (what the store
    holds, after any wrapper's sealing), for the sweep and the byte counts.

Lease records and kv spaces are never touched: a lease's token must keep growing.
Each has an async twin (``a``-prefixed). Not abstract: a store without them still
passes the required suites, and ``store.prune`` refuses it with a
``ConfigurationError`` naming the capability.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from .._errors import ConfigurationError

__all__ = ["ForwardPrune", "PrunePrimitives"]

_PRUNE = (
    "retention (store.prune) needs; implement prune_rows, delete_blobs and blob_sizes (see "
    "persistkit.backends.Backend and persistkit.testing.prune_suite) or prune on a store that "
    "has them: memory, sqlite, postgresql, redis, s3, dynamodb"
)


def missing_prune(backend: Any, method: str) -> ConfigurationError:
    return ConfigurationError(
        f"the store {type(backend).__name__} ({getattr(backend, 'url', '') or 'no URL'}) does not "
        f"implement {method}(), which {_PRUNE}"
    )


class PrunePrimitives:
    """The prune primitives and their defaults (which refuse); see the module docstring."""

    @property
    def supports_prune(self) -> bool:
        """Whether this store implements the prune primitives (wrappers ask their inner store)."""
        return type(self).prune_rows is not PrunePrimitives.prune_rows

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        """Delete rows older than the head, newest first; how many were deleted."""
        raise missing_prune(self, "prune_rows")

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        """Delete blobs of ``thread_id``; how many existed."""
        raise missing_prune(self, "delete_blobs")

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        """Every blob key of ``thread_id`` and its stored size in bytes."""
        raise missing_prune(self, "blob_sizes")

    async def aprune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        raise missing_prune(self, "aprune_rows")

    async def adelete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        raise missing_prune(self, "adelete_blobs")

    async def ablob_sizes(self, thread_id: str) -> dict[str, int]:
        raise missing_prune(self, "ablob_sizes")


class ForwardPrune(PrunePrimitives):
    """The prune primitives of a wrapper that stores ids and keys as they are: its inner
    store's (``prune_inner``, the wrapper's ``inner`` by default)."""

    def prune_inner(self) -> Any:
        return getattr(self, "inner")  # noqa: B009 - each wrapper names its inner store so

    @property
    def supports_prune(self) -> bool:
        return bool(self.prune_inner().supports_prune)

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return int(self.prune_inner().prune_rows(thread_id, namespace, checkpoint_ids))

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        return int(self.prune_inner().delete_blobs(thread_id, keys))

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        return dict(self.prune_inner().blob_sizes(thread_id))

    async def aprune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return int(await self.prune_inner().aprune_rows(thread_id, namespace, checkpoint_ids))

    async def adelete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        return int(await self.prune_inner().adelete_blobs(thread_id, keys))

    async def ablob_sizes(self, thread_id: str) -> dict[str, int]:
        return dict(await self.prune_inner().ablob_sizes(thread_id))


def sorted_ids(checkpoint_ids: Sequence[str]) -> builtins.list[str]:
    """The distinct ids, newest first (the order every store deletes in)."""
    return sorted(set(checkpoint_ids), reverse=True)
