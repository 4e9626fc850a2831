"""What a step's commit does not do again (#37): a value unchanged since the last commit is
neither redacted, hashed nor stored again; a secret registered since then still reaches it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.codec._pipeline import Codec


@pk.checkpointed(name="work.noop")
def noop(i: int) -> int:
    return i


@pytest.fixture
def store(tmp_path: Path) -> Iterator[pk.Store]:
    s = pk.connect(f"sqlite:///{tmp_path}/work.db")
    yield s
    s.close()


@pytest.fixture
def redacted(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The trees the codec redacts (``Codec.dump_tree``), in order."""
    seen: list[Any] = []
    real = Codec.dump_tree

    def counting(self: Codec, tree: Any, **kw: Any) -> bytes:
        seen.append(tree)
        return real(self, tree, **kw)

    monkeypatch.setattr(Codec, "dump_tree", counting)
    return seen


def plans(trees: list[Any]) -> int:
    return sum(1 for t in trees if isinstance(t, dict) and t.get("goal") == "book a flight")


def test_an_unchanged_value_is_redacted_once_and_a_changed_one_again(store: pk.Store, redacted: list[Any]) -> None:
    thread = uid("work")
    plan: dict[str, Any] = {"goal": "book a flight", "todo": ["search", "compare", "book"], "budget": 400}
    with pk.resume(thread, store=store) as run:
        run.state["plan"] = plan
        for i in range(4):
            noop(i)
        assert plans(redacted) == 1  # its first commit only: the next three found the same JSON
        plan["todo"].pop(0)  # edited in place, the same object
        noop(4)
        noop(5)
        assert plans(redacted) == 2
        run.state["plan"] = {**plan, "budget": 350}
        noop(6)
        assert plans(redacted) == 3
    assert store.get_state(thread)["plan"] == {"goal": "book a flight", "todo": ["compare", "book"], "budget": 350}
    states = [store.get_state(thread, c.checkpoint_id) for c in reversed(store.history(thread))]
    stored = [(len(s["plan"]["todo"]), s["plan"]["budget"]) for s in states if "plan" in s]
    assert stored == [(3, 400)] * 4 + [(2, 400)] * 2 + [(2, 350)] * 2  # steps 0-6, then the end record


def test_a_secret_registered_after_a_value_was_committed_is_redacted_from_it_at_the_next_commit(
    store: pk.Store,
) -> None:
    thread = uid("work")
    try:
        with pk.resume(thread, store=store) as run:
            run.state["cfg"] = {"note": "token zz-later-secret-991", "pad": "x" * 120}  # a blob, not inline
            noop(0)
            pk.secrets.register("later", "zz-later-secret-991")
            noop(1)
        assert store.get_state(thread)["cfg"]["note"] == "token $CRED{later}"
    finally:
        pk.secrets.unregister("later")


def test_records_from_512_bytes_are_compressed_and_smaller_ones_go_raw(store: pk.Store) -> None:
    """The default threshold (docs/performance.md, "Where compression pays")."""
    words = "Jordan booked a flight to Zurich for 1,250 EUR, then waited for the invoice. "
    thread = uid("work")
    with pk.resume(thread, store=store, busy=None):
        noop_text("short")
        noop_text((words * 10)[:600])  # a ~700-byte record: raw under the old 1024 threshold
    envelopes = {
        row.payload[:1] for row in store.backend.list(thread, "") if b"short" in store.codec.open(row.payload)
    }
    sized = sorted((len(store.codec.open(row.payload)), row.payload[:1]) for row in store.backend.list(thread, ""))
    assert envelopes == {b"\x01"}
    assert all(kind == (b"\x04" if size >= 512 else b"\x01") for size, kind in sized), sized
    assert any(size >= 512 for size, _ in sized) and any(size < 512 for size, _ in sized), sized


@pk.checkpointed(name="work.text")
def noop_text(text: str) -> str:
    return text
