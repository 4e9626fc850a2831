"""The S3 store's ``prune`` capability (retention): the mixin :class:`S3Prune` of ``S3Backend``.

A namespace's rows form a chain from the head (``head.token -> row prev -> ...``, see
``s3.py``); readers walk it and stop where a ``prev`` names no object. ``prune_rows``
reads the head and lists the chain first, then, newest first (the order of
``backends/_prune.py``: an interrupted prune leaves the older part of what was asked):

* an asked row ABOVE a kept one cannot go without cutting the kept rows below it off
  the walk: its object is replaced by an empty one (``If-Match`` on the ETag listed, so
  a row deleted or rewritten meanwhile is left alone), a marker that links the chain
  and that every reader skips (a real row object is never empty). One request each, in
  order, newest first;
* the asked rows (and markers) at the bottom of the chain, below the oldest row kept:
  the newest of them is deleted alone first, which ends the walk above the rest, then
  the rest with ``DeleteObjects`` (1000 keys a request). Interrupted after the first
  request, the rest is off the chain: no reader sees it, and the next prune of the
  namespace deletes it (row objects off the chain with an id below the oldest row
  kept: a write in flight writes an id above the head's, so none of these is one).

Only rows whose id is below the head's checkpoint id (the head read first) are
touched, so the head's row and anything written since stay. S3 has no transaction
over objects: a reader that listed the chain before a prune may find a row gone when
it reads it, and skips it (``list`` returns what is left). The store keeps no run
index: the run of a row is in its key (``list(run_id=...)`` filters the chain), and a
marker keeps that key. Leases (``l/``) and kv objects are never touched.

``blob_sizes`` is a listing of the thread's blob prefix (``Size``, one LIST per 1000
blobs); ``delete_blobs`` lists it too (``DeleteObjects`` does not say whether a key
existed), then deletes the asked keys that exist.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ._protocol import Backend
from ._s3_keys import _CONFLICT_CODES, _HeadState, _is_client_error, _map_error, _RowRef

__all__ = ["S3Prune"]


class S3Prune(Backend):
    """``prune_rows``, ``delete_blobs`` and ``blob_sizes`` of the S3 store (the async twins
    are ``ThreadedAsync``'s: the store's calls are blocking boto3 ones)."""

    if TYPE_CHECKING:  # provided by S3Backend
        _client: Any
        _bucket: str

        def _check_open(self) -> None: ...

        def _chain_refs(
            self, thread_id: str, namespace: str
        ) -> tuple[_HeadState | None, list[_RowRef], list[_RowRef]]: ...

        def _resolved(self, chain: builtins.list[_RowRef]) -> builtins.list[_RowRef]: ...

        def _delete_keys(self, keys: Sequence[str], what: str) -> None: ...

        def _blob_prefix(self, thread_id: str) -> str: ...

        def _list_sized(self, prefix: str, start_after: str = "") -> Iterator[tuple[str, int]]: ...

        def _map(self, fn: Any, items: Sequence[Any]) -> builtins.list[Any]: ...

    def prune_rows(self, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> int:
        self._check_open()
        wanted = set(checkpoint_ids)
        if not wanted:
            return 0
        head, refs, off_chain = self._chain_refs(thread_id, namespace)
        if head is None:
            return 0
        chain = self._resolved(refs)[::-1]  # oldest first
        head_id = head.checkpoint_id

        def goes(ref: _RowRef) -> bool:
            cid = ref.checkpoint_id
            return not ref.pruned and cid is not None and cid in wanted and cid < head_id

        bottom = 0
        while bottom < len(chain) and (chain[bottom].pruned or goes(chain[bottom])):
            bottom += 1
        # (the head's row is never below the head's id, so the bottom stops before it)
        deleted = 0
        for ref in [r for r in chain[bottom:] if goes(r)][::-1]:
            deleted += self._mark_pruned(ref)
        block = chain[:bottom][::-1]
        what = f"pruning checkpoints of {thread_id!r}"
        if block:
            self._delete_keys([block[0].key], what)  # the walk now ends above the rest
        oldest_kept = chain[bottom].checkpoint_id if bottom < len(chain) else None
        left_over = [  # an interrupted prune's rows, already off the chain
            r.key for r in off_chain
            if oldest_kept is not None and r.checkpoint_id is not None and r.checkpoint_id < oldest_kept
        ]
        self._delete_keys([r.key for r in block[1:]] + left_over, what)
        return deleted + sum(not r.pruned for r in block)

    def _mark_pruned(self, ref: _RowRef) -> bool:
        """Replace the row object at ``ref`` by an empty marker; False if it changed or went since listed."""
        try:
            self._client.put_object(Bucket=self._bucket, Key=ref.key, Body=b"", IfMatch=ref.etag)
        except Exception as exc:
            if _is_client_error(exc, _CONFLICT_CODES):
                return False  # deleted (delete_thread, another prune) or rewritten meanwhile
            raise _map_error(exc, f"pruning checkpoint object {ref.key!r}") from exc
        return True

    def delete_blobs(self, thread_id: str, keys: Sequence[str]) -> int:
        self._check_open()
        wanted = set(keys)
        if not wanted:
            return 0
        prefix = self._blob_prefix(thread_id)
        found = [key for key, _ in self._list_sized(prefix) if key[len(prefix) :] in wanted]
        self._delete_keys(found, f"deleting blobs of {thread_id!r}")
        return len(found)

    def blob_sizes(self, thread_id: str) -> dict[str, int]:
        self._check_open()
        prefix = self._blob_prefix(thread_id)
        return {key[len(prefix) :]: size for key, size in self._list_sized(prefix)}
