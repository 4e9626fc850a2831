"""The Slack example's correction (#39): a second message handled with ``busy="interrupt"``
while the thread's first turn is stuck in a tool call stops that turn at its next step
(it posts nothing, its event is acked as ``interrupted``) and runs next. Two threads of one
process on SQLite: the interrupted turn is told at once (another process would be told at
its lease's next renewal, which tests/test_messages_conformance.py checks for cancel)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from examples import slack_thread as example  # noqa: E402


def test_a_correction_interrupts_the_turn_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    monkeypatch.setenv("SLACK_FAKE_DIR", str(fake))
    (fake / "stall-lookup").touch()  # the first turn's order lookup hangs, as a stuck API call does
    store = pk.connect(f"sqlite:///{tmp_path}/slack.db")
    ts = f"{time.time():.6f}"
    first = example.envelope_for("C0X", ts, ts, "EvFIRST", "Please refund $80 on order #1042, it arrived broken.")
    fix = example.envelope_for("C0X", ts, f"{float(ts) + 1:.6f}", "EvFIX", "Sorry, I meant: where is order #1043?")
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(example.handle(store, first)))
    worker.start()
    deadline = time.monotonic() + 60
    while not list(fake.glob("stalled-lookup.*")):  # the first turn is in its lookup step
        assert time.monotonic() < deadline and worker.is_alive(), "the first turn never reached its lookup"
        time.sleep(0.01)
    assert example.handle(store, fix, busy="interrupt") == "completed"
    worker.join(60)
    assert outcome == ["interrupted"]
    posts = example.FakeSlack.posts()
    assert [p["metadata"]["event_payload"]["event_id"] for p in posts] == ["EvFIX"]  # the first turn posted nothing
    assert "1043" in posts[0]["text"] and not example.Shop.refunds()
    assert example.handle(store, first) == "interrupted"  # Slack redelivers the first event: acked, nothing runs
    thread = example.thread_of("C0X", ts)
    assert {c.run_id: c.run_status for c in store.history(thread) if c.step is None} == {
        "EvFIRST": "interrupted", "EvFIX": "completed",
    }
    store.close()
