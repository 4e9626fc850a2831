"""What a stream stores: its scope and keys, the batch value, and ``StreamEvent``.

A stream of ``(thread_id, namespace, name)`` is the kv scope ``__pk_s.<hash>``. Its keys:

* ``b<12-digit offset>``: a batch, created once (compare-and-swap on "absent") and never
  changed, holding the records from that offset on: ``{"r": run id, "a": attempt,
  "f": fence token, "e": [[kind, time, step, started, data], ...]}``, codec-packed (secrets
  redacted, then the store's wrappers seal it as any kv value).
* ``m``: a hint of the tail, ``{"t": offset of a recent batch, "s": settled up to,
  "id": [thread, namespace, name]}``, rewritten now and then; never trusted for more than
  where to start listing.

The scope ``__pk_streams`` holds, per ``(thread_id, namespace)``, the names of its streams.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError, SerializationError

__all__ = [
    "INDEX",
    "MAX_BATCH",
    "META",
    "StreamEvent",
    "batch_key",
    "check_stream",
    "index_key",
    "offset_of",
    "scope_of",
]

#: records per batch at most (a reader looking for offset n lists from n - MAX_BATCH + 1)
MAX_BATCH = 256
INDEX = "__pk_streams"
META = "m"
_DIGITS = 12
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

#: stored kind -> the kind readers see
KINDS = {"e": "event", "w": "rewind", "f": "final", "x": "end"}


def check_stream(name: object) -> str:
    """``name`` if it is a valid stream name (1 to 64 of ``A-Z a-z 0-9 _ . : -``), else a
    ``ConfigurationError`` saying what a name may be: what an adapter's ``stream=`` checks
    before its run starts (``pk.emit`` checks it too, at its first use)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"a stream name must be 1 to 64 of A-Z a-z 0-9 _ . : - (e.g. 'default', 'tokens', 'research-2'), got {name!r}"
        )
    return name


def check_offset(after: object) -> int:
    if isinstance(after, str) and after.isdigit():  # a Last-Event-ID header
        after = int(after)
    if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after < 10**_DIGITS:
        raise ConfigurationError(f"after must be an offset (an int >= 0; 0 reads from the start), got {after!r}")
    return after


def _digest(*parts: str) -> str:
    return hashlib.blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def scope_of(thread_id: str, namespace: str, stream: str) -> str:
    return "__pk_s." + _digest(thread_id, namespace, stream)


def index_key(thread_id: str, namespace: str) -> str:
    return _digest(thread_id, namespace)


def batch_key(offset: int) -> str:
    return "b" + str(offset).zfill(_DIGITS)


def offset_of(key: str) -> int:
    return int(key[1:])


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One record of a stream (docs/streams.md).

    ``kind``: ``"event"`` (``data`` is the emitted value), ``"rewind"`` (events after
    ``to`` and before this record are superseded), ``"final"`` (events up to ``to`` are
    final), ``"end"`` (``data`` is the run's status), ``"pruned"`` (a reader's marker, not
    stored: the records up to ``to`` that it asked for were trimmed by ``store.prune``). ``step`` is the position of the step
    that emitted it (``""``: the block), ``attempt`` the run's attempt at this stream,
    ``at`` the unix time it was emitted, ``copy_of`` the offset of the event this one
    re-sends (see docs/streams.md, concurrent emitters).
    """

    offset: int
    kind: str
    data: Any
    run_id: str
    step: str
    attempt: int
    at: float
    to: int | None = None
    copy_of: int | None = None


@dataclass(slots=True)
class Batch:
    """A stored batch, decoded as far as the stream layer needs (data trees stay encoded)."""

    start: int
    run_id: str
    attempt: int
    fence: int
    records: list[list[Any]]

    @property
    def end(self) -> int:
        """The offset after its last record."""
        return self.start + len(self.records)


def load_batch(codec: Any, key: str, data: bytes | None, where: str) -> Batch:
    path = f"{where} batch {key}"
    if data is None:
        raise SerializationError("a stream batch was deleted in place: written by something else?", path=path)
    tree = codec.unpack_tree(bytes(data), path)
    if type(tree) is not dict or type(tree.get("e")) is not list or not isinstance(tree.get("r"), str):
        raise SerializationError("not a stream batch: written by something else?", path=path)
    for rec in tree["e"]:
        if type(rec) is not list or len(rec) < 5 or rec[0] not in KINDS:
            raise SerializationError(f"a record of the batch is not [kind, time, step, started, data]: {rec!r:.80}", path=path)
    return Batch(offset_of(key), tree["r"], int(tree.get("a") or 1), int(tree.get("f") or 0), tree["e"])


def pack_batch(codec: Any, run_id: str, attempt: int, fence: int, records: list[list[Any]]) -> bytes:
    return bytes(codec.pack_tree({"r": run_id, "a": attempt, "f": fence, "e": records}))


def event_of(codec: Any, batch: Batch, i: int, where: str) -> StreamEvent:
    kind, at, step, _started, data = batch.records[i][:5]
    offset = batch.start + i
    copy = batch.records[i][5] if len(batch.records[i]) > 5 else None
    if kind == "e":
        value = codec.decode(data, f"{where} event {offset}")
        return StreamEvent(offset, "event", value, batch.run_id, step, batch.attempt, at, None, copy)
    if kind == "x":
        return StreamEvent(offset, "end", data, batch.run_id, step, batch.attempt, at)
    return StreamEvent(offset, KINDS[kind], None, batch.run_id, step, batch.attempt, at, int(data))
