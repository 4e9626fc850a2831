"""The DynamoDB store's ``prune`` capability (retention), a mixin of ``DynamoBackend``.

``prune_rows`` reads the head, then deletes the asked rows below its checkpoint id
(newest first, 25 a ``BatchWriteItem``) with their chunks. The head only moves
forward and each new id sorts after its parent's, so a row below the head read
stays below it: the head's row and anything written later are never deleted.
Rows are read first (one ``BatchGetItem`` per 100) to count the ones that exist
and find the chunks of big ones. ``blob_sizes`` is a Query of the thread's ``b!``
items; ``delete_blobs`` reads them, then deletes them and their chunks. Lease
records and kv scopes are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._dynamo_items import DynamoCalls, chunk_nonce, size_of
from ._prune import sorted_ids

__all__ = ["DynamoPrune"]


class DynamoPrune(DynamoCalls):
    if TYPE_CHECKING:  # the DynamoBackend methods these use

        def _row_sk(self, namespace: str, checkpoint_id: str) -> str: ...
        def head(self, thread_id: str, namespace: str) -> Any: ...

    def _delete_with_chunks(self, keys: Sequence[tuple[str, str]], what: str) -> int:
        """Delete the items at ``keys`` that exist, and their chunks; how many existed."""
        found = self._batch_get(keys, what)
        gone: list[tuple[str, str]] = []
        for key in keys:  # in the order given: newest first for rows
            item = found.get(key)
            if item is None:
                continue
            gone.append(key)
            nonce = chunk_nonce(item.get("v"))
            if nonce is not None:
                gone += [(key[0], str(c["s"]["S"])) for c in self._chunks(key[0], f"c!{nonce}!")]
        self._batch_write([], gone, what)
        return sum(1 for k in keys if k in found)

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        self._check_open()
        head = self.head(thread_id, namespace)
        if head is None:
            return 0
        p = self._p(thread_id)
        wanted = [c for c in sorted_ids(checkpoint_ids) if c < head.checkpoint_id]
        keys = [(p, self._row_sk(namespace, c)) for c in wanted]
        return self._delete_with_chunks(keys, f"pruning checkpoints of {thread_id!r}")

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        self._check_open()
        p = self._p(thread_id)
        unique = list(dict.fromkeys(keys))
        return self._delete_with_chunks(
            [(p, "b!" + k) for k in unique], f"deleting blobs of {thread_id!r}"
        )

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        self._check_open()
        items = self._query(self._p(thread_id), f"listing blobs of {thread_id!r}", begins="b!")
        return {str(i["s"]["S"])[2:]: size_of(i["v"]) for i in items}
