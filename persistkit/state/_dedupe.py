"""A list item that is a copy of the previous step's result is stored once.

The commonest agent loop: a step returns a message and the caller appends it
to a state list (``msg = call_llm(...); run.state.messages.append(msg)``).
The step's checkpoint records the message as its result (``r``); the item is
appended after that checkpoint, so it travels in the segment of the *next*
checkpoint (the next step's, or the run's end). Stored as is, every message
would be in the store twice.

Instead that segment holds a reference: the item's tree becomes
``{"__pk__": "rr", "v": <checkpoint id>}`` and the segment lists the item's
index under ``ri``; a reader puts the result recorded in that checkpoint back
in its place (``Loader._raw``). The referenced checkpoint is always the parent
of the row holding the segment (the head when it was written), so a reader
walking the chain back usually has it already, and otherwise reads it by id.
A result over ``RESULT_INLINE_LIMIT`` is not in its row but in the blob the
row names (``rb``, content-addressed, in the same thread): the reader reads
that blob too, as a replay of the step does.

Only exact copies are referenced: the item's JSON bytes equal the result's
(``1``, ``1.0`` and ``True`` are equal in Python, not in storage), and only
results larger than ``MIN_BYTES`` bytes (a smaller one costs less than its
reference). The result is the tree the row (or its blob) stores, so
redaction, encryption, integrity tags and offload treat it as before. A persistkit from before this
format stops at the unknown tag with a SerializationError that says the data
is from a newer persistkit: it never reads a wrong value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import IntegrityError, SerializationError
from ..codec._pipeline import _dump
from ..codec._stdtypes import TAG

__all__ = ["Result", "refer", "resolve", "result", "result_blob", "wanted"]

#: A serialized result up to this size is not worth a reference (the reference is ~45 bytes).
MIN_BYTES = 96
_MARK = "rr"


@dataclass(slots=True)
class Result:
    """The result of the thread's head (inline or in a blob), as this run wrote it."""

    checkpoint_id: str
    tree: Any
    raw: bytes  # its JSON bytes, unredacted (as sized by Run._step_body)


def result(checkpoint_id: str, tree: Any, raw: bytes | None) -> Result | None:
    """What a later segment may refer to, or None for a result too small to be worth it."""
    return Result(checkpoint_id, tree, raw) if raw is not None and len(raw) > MIN_BYTES else None


def refer(segments: dict[str, dict[str, Any]], res: Result) -> None:
    """Replace the items of these inline segments that are copies of ``res`` by references to it."""
    tree, kind = res.tree, type(res.tree)
    for seg in segments.values():
        items = seg["i"]
        hits = [
            k
            for k, t in enumerate(items)
            if type(t) is kind and (t is tree or (t == tree and (kind is str or _dump(t) == res.raw)))
        ]
        if hits:
            ref = {TAG: _MARK, "v": res.checkpoint_id}
            seg["i"] = [ref if k in hits else t for k, t in enumerate(items)]
            seg["ri"] = hits


def wanted(body: Mapping[str, Any] | None, name: str, rows: Mapping[str, Any]) -> list[str]:
    """Checkpoint ids whose results the segment of ``name`` in ``body`` refers to, not yet in ``rows``
    (for those in ``rows`` with a result in a blob, ``result_blob`` names the blob to read)."""
    seg = (body.get("sg") or {}).get(name) if body is not None else None
    if type(seg) is not dict or "ri" not in seg or type(seg.get("i")) is not list:
        return []
    items = seg["i"]
    out = []
    for k in seg["ri"] if type(seg["ri"]) is list else ():
        if type(k) is int and 0 <= k < len(items) and type(items[k]) is dict:
            cid = items[k].get("v")
            if type(cid) is str and cid not in rows:
                out.append(cid)
    return out


def result_blob(body: Mapping[str, Any] | None) -> str | None:
    """The key of the blob holding the result of the row ``body``, if its result is not inline."""
    key = body.get("rb") if body is not None and body.get("k") == "step" and "r" not in body else None
    return key if type(key) is str else None


def resolve(
    seg: dict[str, Any],
    rows: Mapping[str, Mapping[str, Any]],
    thread_id: str,
    name: str,
    key: str,
    load: Callable[[str], Any],
) -> dict[str, Any]:
    """``seg`` (a segment read from checkpoint ``key``) with each reference replaced by the result it
    names; ``load`` gives the tree of a result stored as a blob (``rb``) from the blob's key."""
    where = f"state.{name} (segment {key})"
    refs, items = seg["ri"], seg.get("i")
    if type(refs) is not list or type(items) is not list:
        raise SerializationError("segment is malformed: bad result references", path=where)
    items = list(items)
    for k in refs:
        ref = items[k] if type(k) is int and 0 <= k < len(items) else None
        if type(ref) is not dict or ref.get(TAG) != _MARK or len(ref) != 2 or type(ref.get("v")) is not str:
            raise SerializationError(f"segment is malformed: item {k!r} is not a result reference", path=where)
        body = rows.get(ref["v"])
        big = result_blob(body)
        if body is None or body.get("k") != "step" or ("r" not in body and big is None):
            raise IntegrityError(
                f"thread {thread_id!r}: list channel {name!r} stores an item as the result of "
                f"checkpoint {ref['v']}, which {'has no recorded result' if body else 'is missing'}; "
                "the store lost data or was edited"
            )
        items[k] = body["r"] if big is None else load(big)
    return {**seg, "i": items}
