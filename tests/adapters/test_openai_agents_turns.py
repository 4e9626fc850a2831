"""Turns of one thread through ``durable_run``, in real processes on PostgreSQL (#19).

The seeds' Slack case on the OpenAI Agents SDK: one ``durable_run`` per message,
``run_id=<message id>``, the conversation kept in a ``PersistkitSession`` of the
thread. Three cases: two turns of one thread at once, a redelivered turn, a
worker SIGKILLed mid-turn while the next turn waits. Each model call and tool
body writes ``begin``/``done`` to an effects file (``turns_openai_agents.py``);
the thread's stored conversation is the session's items.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed")

from conftest import make_url, uid
from turn_cases import Turns, contiguous

from persistkit_openai_agents import SESSION_NAMESPACE

SCRIPT = Path(__file__).with_name("turns_openai_agents.py")
ITEMS_PER_TURN = 6  # the message, two tool calls and their outputs, the reply


def finished(message: str) -> set[str]:
    """What a whole turn of ``message`` runs: three model calls, two tool bodies."""
    return {f"model {message} {k}" for k in range(3)} | {f"tool {message} {n}" for n in (1, 2)}


@pytest.fixture
def turns(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[Turns]:
    t = Turns(SCRIPT, make_url("postgres", request, tmp_path_factory), uid("slack-thread"), tmp_path)
    yield t
    t.close()


def _owner(item: dict[str, Any]) -> str:
    if item.get("role") == "user":
        return str(item["content"]).removeprefix("message ")
    if "call_id" in item:
        return str(item["call_id"]).removeprefix("call_").rsplit("_", 1)[0]
    return str(item["id"]).removeprefix("msg_")


def conversation(turns: Turns) -> list[str]:
    """Whose turn each item of the thread's stored conversation belongs to, in order."""
    items = turns.store.get_state(turns.thread, namespace=SESSION_NAMESPACE, plain=True)["items"]
    return [_owner(item) for item in items]


def test_two_turns_of_one_thread_at_once_both_land_in_arrival_order(turns: Turns) -> None:
    first = turns.start("evA", "--hold-tool", "1")
    turns.until_holding(first)
    second = turns.start("evB")  # arrives while the first turn runs
    turns.until_waiting(second)
    turns.release("evA")
    assert turns.finish(first) == {"final_output": "reply to evA"}
    assert turns.finish(second) == {"final_output": "reply to evB"}
    assert contiguous(conversation(turns)) == [("evA", ITEMS_PER_TURN), ("evB", ITEMS_PER_TURN)]
    begun = turns.assert_done_once(finished("evA") | finished("evB"))
    assert set(begun.values()) == {1}  # nothing ran twice, not even partly
    assert [run for run, _ in contiguous(turns.runs_in_history())] == ["evA", "evB"]


def test_a_redelivered_turn_that_finished_returns_without_running(turns: Turns) -> None:
    assert turns.finish(turns.start("evA")) == {"final_output": "reply to evA"}
    assert turns.finish(turns.start("evB")) == {"final_output": "reply to evB"}
    before = turns.effects()
    # The queue redelivers evA (its worker died before the ack) after evB was answered.
    assert turns.finish(turns.start("evA")) == {"final_output": "reply to evA"}
    assert turns.effects() == before  # no model call, no tool
    assert contiguous(conversation(turns)) == [("evA", ITEMS_PER_TURN), ("evB", ITEMS_PER_TURN)]


def test_a_redelivered_turn_whose_worker_died_continues(turns: Turns) -> None:
    turns.killed(turns.start("evA", "--kill-tool", "2"))
    assert turns.finish(turns.start("evA")) == {"final_output": "reply to evA"}
    begun = turns.assert_done_once(finished("evA"))
    assert begun["tool evA 2"] == 2  # the body in flight at the crash ran again; nothing else
    assert {k for k, n in begun.items() if n > 1} == {"tool evA 2"}
    assert contiguous(conversation(turns)) == [("evA", ITEMS_PER_TURN)]


def test_a_worker_killed_mid_turn_while_the_next_turn_waits(turns: Turns) -> None:
    first = turns.start("evA", "--hold-tool", "2", "--kill-tool", "2")
    turns.until_holding(first)
    second = turns.start("evB")
    turns.until_waiting(second)
    turns.release("evA")
    turns.killed(first)  # died inside its second tool call; evB is queued behind it
    redelivered = turns.start("evA")  # the queue redelivers the dead worker's message
    assert turns.finish(redelivered) == {"final_output": "reply to evA"}
    assert turns.finish(second) == {"final_output": "reply to evB"}
    begun = turns.assert_done_once(finished("evA") | finished("evB"))
    assert {k for k, n in begun.items() if n > 1} == {"tool evA 2"}
    assert contiguous(conversation(turns)) == [("evA", ITEMS_PER_TURN), ("evB", ITEMS_PER_TURN)]
