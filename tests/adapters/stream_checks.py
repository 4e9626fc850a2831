"""What the adapters' stream tests check of a stream (docs/streams.md): the records in
order, what a UI shows after applying the rewinds, and what a ``final_only`` reader gets."""

from __future__ import annotations

from typing import Any

import persistkit as pk
from persistkit.testing.stream_suite import view


def records(
    store: pk.Store, thread: str, stream: str = "answer", **kwargs: Any
) -> list[pk.StreamEvent]:
    """Every record of the stream, now (no following)."""
    return list(store.read_stream(thread, stream, follow=False, **kwargs))


def check_offsets(recs: list[pk.StreamEvent]) -> None:
    assert [r.offset for r in recs] == list(range(1, len(recs) + 1)), "offsets are dense, in order"


def shown(recs: list[pk.StreamEvent]) -> list[Any]:
    """The events a UI shows once it applied every rewind."""
    return view(recs)


def final(store: pk.Store, thread: str, stream: str = "answer", **kwargs: Any) -> list[Any]:
    """The events a ``final_only`` reader receives (never a superseded one, never a rewind)."""
    recs = records(store, thread, stream, final_only=True, **kwargs)
    assert all(r.kind in ("event", "end") for r in recs)
    assert recs and recs[-1].kind == "end" and recs[-1].data == "completed"
    return [r.data for r in recs if r.kind == "event"]


def rewinds(recs: list[pk.StreamEvent]) -> list[pk.StreamEvent]:
    return [r for r in recs if r.kind == "rewind"]
