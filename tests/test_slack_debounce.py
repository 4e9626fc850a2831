"""The Slack example's debounce (#40): three messages typed in a burst, handled with
``busy="debounce"``, become one turn that answers them together; the other two events are
acked as ``merged``; one reply is posted; redeliveries change nothing; an answer continues a
debounced turn that asked a person. Threads of one process on SQLite; the burst queues behind
a turn that holds the thread, so which event leads does not depend on timing."""

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

WINDOW = (0.05, 5.0)


def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _burst(store: pk.Store, ts: str, texts: list[str], tag: str) -> dict[str, str]:
    thread = example.thread_of("C0X", ts)
    hold, inside = threading.Event(), threading.Event()

    def busy_turn() -> None:  # another turn of the thread holds it while the burst arrives
        with pk.resume(thread, store=store, run_id=f"Ev{tag}HOLD"):
            inside.set()
            hold.wait(60)

    blocker = threading.Thread(target=busy_turn)
    blocker.start()
    assert inside.wait(60)
    outcome: dict[str, str] = {}
    workers = []
    for i, text in enumerate(texts):
        env = example.envelope_for("C0X", ts, f"{float(ts) + i + 1:.6f}", f"Ev{tag}{i}", text)
        w = threading.Thread(target=lambda e=env: outcome.update(
            {e["event_id"]: example.handle(store, e, busy="debounce", debounce=WINDOW)}))
        w.start()
        workers.append(w)
        want = i + 1
        _until(lambda: len(store.leases(prefix=thread)[0].waiting) == want, f"event {i} queued")  # noqa: B023
    hold.set()
    for w in [blocker, *workers]:
        w.join(60)
    return outcome


def test_a_burst_becomes_one_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    monkeypatch.setenv("SLACK_FAKE_DIR", str(fake))
    store = pk.connect(f"sqlite:///{tmp_path}/slack.db")
    ts = f"{time.time():.6f}"
    outcome = _burst(store, ts, ["hi", "where is my order?", "it's #1043"], "B")
    assert outcome == {"EvB0": "completed", "EvB1": "merged", "EvB2": "merged"}
    posts = example.FakeSlack.posts()
    assert [p["metadata"]["event_payload"]["event_id"] for p in posts] == ["EvB0"]
    assert "1043" in posts[0]["text"]  # the order number came in the burst's last message
    state = store.get_state(example.thread_of("C0X", ts))
    users = [m for m in state["messages"] if m["role"] == "user"]
    assert [(m["content"], m["burst"]) for m in users] == [("hi\nwhere is my order?\nit's #1043", ["EvB0", "EvB1", "EvB2"])]
    for i, text in enumerate(["hi", "where is my order?", "it's #1043"]):  # Slack redelivers every event
        env = example.envelope_for("C0X", ts, f"{float(ts) + i + 1:.6f}", f"EvB{i}", text)
        assert example.handle(store, env, busy="debounce", debounce=WINDOW) == outcome[f"EvB{i}"]
    assert len(example.FakeSlack.posts()) == 1
    store.close()


def test_an_answer_continues_a_debounced_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    monkeypatch.setenv("SLACK_FAKE_DIR", str(fake))
    store = pk.connect(f"sqlite:///{tmp_path}/slack.db")
    ts = f"{time.time():.6f}"
    outcome = _burst(store, ts, ["order #1042 arrived broken", "please refund $80"], "R")
    assert outcome == {"EvR0": "suspended", "EvR1": "merged"}  # a refund waits for a person
    assert example.answer(store, example.thread_of("C0X", ts), True, "ops") == "completed"
    assert [r["amount"] for r in example.Shop.refunds()] == [80.0]
    assert [p["metadata"]["event_payload"]["event_id"] for p in example.FakeSlack.posts()] == ["EvR0"]
    store.close()
