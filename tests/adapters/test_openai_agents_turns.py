"""Turns of one thread through ``durable_run``, in real processes on PostgreSQL (#19).

The seeds' Slack case on the OpenAI Agents SDK: one ``durable_run`` per message,
``run_id=<message id>``, the conversation kept in a ``PersistkitSession`` of the
thread. Three cases: two turns of one thread at once, a redelivered turn, a
worker SIGKILLed mid-turn while the next turn waits. Each model call and tool
body writes ``begin``/``done`` to an effects file (``turns_openai_agents.py``);
the thread's stored conversation is the session's items.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed")

from conftest import make_url, uid
from turn_cases import Turns, contiguous
from turns_openai_agents import make_agent

import persistkit as pk
from persistkit_openai_agents import SESSION_NAMESPACE, durable_run

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


# -- the busy options, in one process -------------------------------------------------------


def _agent_and_store(tmp_path: Path) -> tuple[Any, pk.Store]:
    return make_agent(tmp_path, 0, 0), pk.connect(f"sqlite:///{tmp_path}/turns.db")


def test_busy_reject_raises_while_another_turn_holds_the_thread(tmp_path: Path) -> None:
    agent, store = _agent_and_store(tmp_path)
    holding, done = threading.Event(), threading.Event()

    def other_turn() -> None:
        with pk.resume("t", store=store, run_id="other"):
            holding.set()
            done.wait(30)

    worker = threading.Thread(target=other_turn)
    worker.start()
    try:
        assert holding.wait(30)
        with pytest.raises(pk.ThreadBusyError) as info:
            asyncio.run(durable_run(agent, "message evA", thread_id="t", store=store, run_id="evA", busy="reject"))
        assert info.value.retryable
    finally:
        done.set()
        worker.join()
    assert not (tmp_path / "effects.log").exists()  # no model call, no tool
    result = asyncio.run(durable_run(agent, "message evA", thread_id="t", store=store, run_id="evA", busy="reject"))
    assert result.final_output == "reply to evA"
    store.close()


@pytest.mark.parametrize(("option", "value"), [("busy", "sometimes"), ("lease_ttl", 0), ("busy_timeout", -1)])
def test_a_bad_busy_option_is_a_configuration_error(option: str, value: Any, tmp_path: Path) -> None:
    agent, store = _agent_and_store(tmp_path)
    with pytest.raises(pk.ConfigurationError, match=option):
        asyncio.run(durable_run(agent, "message evA", thread_id="t", store=store, **{option: value}))
    assert not (tmp_path / "effects.log").exists()
    store.close()
