"""Pruning under integrity: anchors that let a chain skip the records retention removed.

The hash chain links every record to the one before it (``seq - 1``), and a listing
that reaches the oldest record checks it is #1. Retention (``store.prune``) removes
records in the middle and at the start of a chain, so before any record is deleted,
the integrity wrapper writes an **anchor** for each record that is kept and whose
predecessor goes: a blob of the thread, sealed like every blob (keyed MAC over the
thread, the key and the bytes), under the key

    ~pa:<namespace as hex>:<kept checkpoint id>:<seq of the next older kept record, 20 digits>

holding that older record's seq, tag and checkpoint id (seq 0: nothing older is
kept). A reader that finds a gap after a record (or a record other than #1 at the
bottom) reads that record's anchors (one range read, only then: an unpruned thread
costs nothing) and accepts the gap when an anchor says the records between were
pruned: the older record it found must be the one the anchor names (same seq, tag
and id), or lie inside the pruned range (a prune that was interrupted leaves some of
them; each still carries its own tag and links), and a bottom record needs an
anchor that says nothing older was kept. An anchor cannot be forged without the
integrity key; removing one makes its gap an error again. A later prune that
removes more writes a new anchor (a new key: blobs are never overwritten) and
deletes the anchors of the records it removes.
"""

from __future__ import annotations

import builtins
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import IntegrityError
from ..backends._protocol import CheckpointRow

__all__ = ["ANCHOR", "Anchor", "anchor_range", "anchors_in", "gap_allowed", "plan_anchors"]

#: The prefix of every anchor's blob key: the integrity wrapper's own, kept from the layers above.
ANCHOR = "~pa:"

_Req = tuple[str, tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Anchor:
    """Kept record ``checkpoint_id``: the records between it and ``older_seq`` were pruned."""

    checkpoint_id: str
    older_seq: int
    older_tag: bytes | None
    older_cid: str | None


def _ns(namespace: str) -> str:
    return namespace.encode("utf-8", "surrogatepass").hex()


def anchor_range(namespace: str, checkpoint_id: str) -> tuple[str, str]:
    """The blob key range holding the anchors of one kept record."""
    base = f"{ANCHOR}{_ns(namespace)}:{checkpoint_id}:"
    return base, base[:-1] + ";"


def anchor_key(namespace: str, checkpoint_id: str, older_seq: int) -> str:
    return f"{ANCHOR}{_ns(namespace)}:{checkpoint_id}:{older_seq:020d}"


def anchor_bytes(older_seq: int, older_tag: bytes | None, older_cid: str | None) -> bytes:
    tag = older_tag or b""
    return older_seq.to_bytes(8, "big") + bytes((len(tag),)) + tag + (older_cid or "").encode("utf-8")


def anchors_in(
    thread_id: str, namespace: str, checkpoint_id: str, found: Mapping[str, bytes]
) -> builtins.list[Anchor]:
    """The anchors in ``found`` (the record's anchor range, each blob's seal already checked)."""
    out = []
    for key, data in sorted(found.items()):
        try:
            seq = int.from_bytes(data[:8], "big")
            n = data[8]
            tag = data[9 : 9 + n] or None
            cid = data[9 + n :].decode("utf-8") or None
            if key != anchor_key(namespace, checkpoint_id, seq) or (seq == 0) != (cid is None):
                raise ValueError("mismatch")
        except (IndexError, ValueError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"thread {thread_id!r} blob {key!r}: a malformed prune anchor") from exc
        out.append(Anchor(checkpoint_id, seq, tag, cid))
    return out


def gap_allowed(anchors: Sequence[Anchor], older_seq: int | None, older_cid: str | None, older_tag: bytes | None) -> bool:
    """Whether the anchors of a kept record allow its next older stored record to be
    ``older_*`` (None: there is none)."""
    for a in anchors:
        if older_seq is None:
            if a.older_seq == 0:
                return True
        elif older_seq > a.older_seq:
            return True  # inside the pruned range: left by an interrupted prune
        elif older_seq == a.older_seq and older_cid == a.older_cid and older_tag == a.older_tag:
            return True
    return False


def plan_anchors(
    rows: Sequence[Any], doomed: set[str], namespace: str
) -> dict[str, bytes]:
    """The anchors (key -> unsealed bytes) a prune of ``doomed`` needs, from every stored
    record of the chain (``Sealed``, newest first): one for each kept record whose next
    older stored record goes (or that already had a gap below it and whose next older kept
    record changes)."""
    kept = [s for s in rows if s.row.checkpoint_id not in doomed]
    out: dict[str, bytes] = {}
    stored_below: dict[str, Any] = {}
    for newer, older in zip(rows, [*rows[1:], None], strict=True):
        stored_below[newer.row.checkpoint_id] = older
    for i, s in enumerate(kept):
        below_now = stored_below[s.row.checkpoint_id]
        older = kept[i + 1] if i + 1 < len(kept) else None
        contiguous = below_now is not None and below_now.row.checkpoint_id not in doomed and below_now.seq == s.seq - 1
        if s.seq == 1 or contiguous:
            continue
        if older is None:
            out[anchor_key(namespace, s.row.checkpoint_id, 0)] = anchor_bytes(0, None, None)
        else:
            key = anchor_key(namespace, s.row.checkpoint_id, older.seq)
            out[key] = anchor_bytes(older.seq, older.tag, older.row.checkpoint_id)
    return out


def prune_op(ib: Any, thread_id: str, namespace: str, checkpoint_ids: Sequence[str]) -> Generator[_Req, Any, int]:
    """The integrity wrapper's ``prune_rows``: read and check the chain, write the anchors
    the deletion needs (sealed), delete, then drop the anchors of deleted records."""
    rows: list[CheckpointRow] = []
    before = None
    while True:
        page: list[CheckpointRow] = yield ("list", (thread_id, namespace), {"before": before, "limit": 500})
        rows.extend(page)
        if len(page) < 500:
            break
        before = page[-1].checkpoint_id
    if not rows:
        return 0
    sealed = [ib._open(r) for r in rows]
    head_id = sealed[0].row.checkpoint_id
    doomed = {c for c in checkpoint_ids if c < head_id} & {s.row.checkpoint_id for s in sealed}
    if not doomed:
        return 0
    anchors = {k: ib.seal_blob(thread_id, k, v) for k, v in plan_anchors(sealed, doomed, namespace).items()}
    if anchors:
        yield ("put_blobs", (thread_id, anchors), {})
    deleted: int = yield ("prune_rows", (thread_id, namespace, sorted(doomed)), {})
    prefix = f"{ANCHOR}{_ns(namespace)}:"
    stale: dict[str, bytes] = yield ("scan_blobs", (thread_id, prefix, prefix[:-1] + ";"), {})
    gone = [k for k in stale if k[len(prefix) :].split(":", 1)[0] in doomed]
    if gone:
        yield ("delete_blobs", (thread_id, gone), {})
    return deleted


def check_gap(ib: Any, thread_id: str, namespace: str, newer: Any, older: Any | None) -> Generator[_Req, Any, bool]:
    """Whether a gap below ``newer`` (a ``Sealed``; ``older`` the next older stored one, or
    None) is one a prune anchored. One range read of ``newer``'s anchors."""
    start, stop = anchor_range(namespace, newer.row.checkpoint_id)
    found: dict[str, bytes] = yield ("scan_blobs", (thread_id, start, stop), {})
    opened = {k: ib.open_blob(thread_id, k, v) for k, v in found.items()}
    anchors = anchors_in(thread_id, namespace, newer.row.checkpoint_id, opened)
    if older is None:
        return gap_allowed(anchors, None, None, None)
    return gap_allowed(anchors, older.seq, older.row.checkpoint_id, older.tag)
