"""The stream writer's fencing, without a real lease takeover: a writer that holds an older
lease token than the one that wrote the stream's next batch stops (a zombie), and its later
events never reach a reader; the newer holder's rewind takes back what the zombie left."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import persistkit as pk
from persistkit.streams._writer import RunStreams
from persistkit.testing.stream_suite import view


def _run(store: pk.Store, thread: str, run_id: str, token: int) -> Any:
    """What a RunStreams reads of a run (the engine's Run has these)."""
    return SimpleNamespace(
        store=store, codec=store.codec, thread_id=thread, namespace="", run_id=run_id,
        lease=SimpleNamespace(token=token), _index={}, _max_child={}, _marks={}, _attach={},
    )


def _frame(run: Any) -> Any:
    return SimpleNamespace(run=run, path="", seq=None)


def test_a_writer_overtaken_by_a_newer_lease_holder_stops(local_store: pk.Store) -> None:
    thread = f"zombie-{uuid.uuid4().hex[:8]}"
    old = _run(local_store, thread, "r1", token=1)
    zombie = RunStreams(old, None)
    zombie.add(_frame(old), "default", "a")
    zombie.flush()
    new = _run(local_store, thread, "r1", token=2)  # the run continued elsewhere under a newer lease
    holder = RunStreams(new, None)
    holder.add(_frame(new), "default", "b")
    holder.flush()
    zombie.add(_frame(old), "default", "c")  # the zombie goes on: it meets the holder's batch
    zombie.flush()
    assert zombie.streams["default"].lost is not None and "lease token 2" in zombie.streams["default"].lost
    records = list(local_store.read_stream(thread, follow=False))
    assert [r.kind for r in records] == ["event", "rewind", "event"]
    assert view(records) == ["b"] and records[1].to == 0
    assert records[2].attempt == 2  # the same run's next attempt at this stream
