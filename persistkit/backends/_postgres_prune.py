"""The PostgreSQL store's ``prune`` capability (retention): the mixin :class:`PostgresPrune`.

The operations are methods of the store's cores (``_postgres_async.py``, hand-written,
and its generated twin ``_postgres_sync.py``); their SQL is ``_postgres_sql.py``'s
``_PRUNE_SQL``. ``prune_rows`` is ONE statement on an autocommit connection (one
transaction): it reads the head as a write does (the newest versioned row), deletes
the asked rows whose id is below the head's by primary key, and drops the ``runs``
entries of runs left without rows. A run whose first row was pruned keeps its entry:
``first_id`` stays a lower bound of its rows, which is all ``list(run_id=...)`` asks of
it; a run with no entry is listed by a scan from the thread's first row. No lease is
touched. ``blob_sizes`` reads ``octet_length``, not the bytes. Native async, like
every operation of the store; a store opened on a sync connection answers the async
methods from a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._postgres_async import AsyncCore
from ._postgres_sync import Core
from ._protocol import Backend

__all__ = ["PostgresPrune"]


class PostgresPrune(Backend):
    """``prune_rows``, ``delete_blobs``, ``blob_sizes`` and their async twins for
    :class:`~persistkit.backends.postgres.PostgresBackend` (a mixin)."""

    if TYPE_CHECKING:  # provided by PostgresBackend

        def _sync_core(self) -> Core: ...

        def _async_core(self) -> AsyncCore | None: ...

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        return self._sync_core().prune_rows(thread_id, namespace, checkpoint_ids)

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        return self._sync_core().delete_blobs(thread_id, keys)

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        return self._sync_core().blob_sizes(thread_id)

    async def aprune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.prune_rows, thread_id, namespace, checkpoint_ids)
        return await core.prune_rows(thread_id, namespace, checkpoint_ids)

    async def adelete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.delete_blobs, thread_id, keys)
        return await core.delete_blobs(thread_id, keys)

    async def ablob_sizes(self, thread_id: str) -> dict[str, int]:
        core = self._async_core()
        if core is None:
            return await asyncio.to_thread(self.blob_sizes, thread_id)
        return await core.blob_sizes(thread_id)
