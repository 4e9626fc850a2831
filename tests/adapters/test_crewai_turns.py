"""Turns of one thread through ``durable_kickoff`` / ``adurable_kickoff``, in real processes
on PostgreSQL (#19).

One kickoff per message, ``run_id=<message id>``: two turns of one thread at once,
a redelivered turn, a worker SIGKILLed mid-turn while the next turn waits. Each
model call and tool body writes ``begin``/``done`` to an effects file
(``turns_crewai.py``); the thread's stored conversation is its history: each
turn's checkpoints (its tasks, tool calls and model calls, its end) in order.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("crewai")

from conftest import make_url, uid
from crewai import Agent, Crew, Process, Task
from crewai.llms.base_llm import BaseLLM
from turn_cases import Turns, contiguous

import persistkit as pk
from persistkit_crewai import adurable_kickoff, durable_kickoff

SCRIPT = Path(__file__).with_name("turns_crewai.py")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")  # crewai's own, on every Crew


def finished(message: str) -> set[str]:
    """What a whole turn of ``message`` runs: three model calls, one tool body."""
    return {f"model {message} answer 0", f"model {message} answer 1", f"model {message} reply 0",
            f"tool {message} lookup"}


def reply(message: str) -> dict[str, list[str]]:
    return {"tasks": [f"answer for {message}", f"reply for {message}"]}


@pytest.fixture
def turns(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[Turns]:
    t = Turns(SCRIPT, make_url("postgres", request, tmp_path_factory), uid("slack-thread"), tmp_path)
    yield t
    t.close()


def turn_order(turns: Turns) -> list[tuple[str, int]]:
    """The thread's history as runs of one turn's checkpoints, oldest first."""
    return contiguous(turns.runs_in_history())


def test_two_turns_of_one_thread_at_once_both_land_in_arrival_order(turns: Turns) -> None:
    first = turns.start("evA", "--hold-tool")
    turns.until_holding(first)
    second = turns.start("evB", "--async")  # arrives while the first turn runs
    turns.until_waiting(second)
    turns.release("evA")
    assert turns.finish(first) == reply("evA")
    assert turns.finish(second) == reply("evB")
    begun = turns.assert_done_once(finished("evA") | finished("evB"))
    assert set(begun.values()) == {1}
    assert [run for run, _ in turn_order(turns)] == ["evA", "evB"]


def test_a_redelivered_turn_that_finished_returns_without_running(turns: Turns) -> None:
    assert turns.finish(turns.start("evA")) == reply("evA")
    assert turns.finish(turns.start("evB")) == reply("evB")
    before, history = turns.effects(), turn_order(turns)
    assert turns.finish(turns.start("evA")) == reply("evA")  # redelivered after evB was answered
    assert turns.effects() == before  # no model call, no tool
    assert turn_order(turns) == history  # nothing written


def test_a_redelivered_turn_whose_worker_died_continues(turns: Turns) -> None:
    turns.killed(turns.start("evA", "--kill-tool"))
    assert turns.finish(turns.start("evA")) == reply("evA")
    begun = turns.assert_done_once(finished("evA"))
    # The tool in flight at the crash ran again; the model call before it replayed.
    assert {k for k, n in begun.items() if n > 1} == {"tool evA lookup"}
    assert [run for run, _ in turn_order(turns)] == ["evA"]


def test_a_worker_killed_mid_turn_while_the_next_turn_waits(turns: Turns) -> None:
    first = turns.start("evA", "--hold-tool", "--kill-tool")
    turns.until_holding(first)
    second = turns.start("evB")
    turns.until_waiting(second)
    turns.release("evA")
    turns.killed(first)  # died inside its tool call; evB is queued behind it
    redelivered = turns.start("evA", "--async")
    assert turns.finish(redelivered) == reply("evA")
    assert turns.finish(second) == reply("evB")
    begun = turns.assert_done_once(finished("evA") | finished("evB"))
    assert {k for k, n in begun.items() if n > 1} == {"tool evA lookup"}
    assert [run for run, _ in turn_order(turns)] == ["evA", "evB"]


# -- the busy options, in one process -------------------------------------------------------


class Answers(BaseLLM):
    calls: list[str] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        self.calls.append("call")
        return "Thought: done\nFinal Answer: ok"

    def supports_function_calling(self) -> bool:
        return False


def one_task_crew(llm: BaseLLM) -> Crew:
    agent = Agent(role="bot", goal="answer", backstory="offline", llm=llm)
    return Crew(agents=[agent], tasks=[Task(name="t", description="answer", expected_output="x", agent=agent)],
                process=Process.sequential)


@pytest.mark.parametrize("kickoff", ["sync", "async"])
def test_busy_reject_raises_while_another_turn_holds_the_thread(kickoff: str, tmp_path: Path) -> None:
    store, llm = pk.connect(f"sqlite:///{tmp_path}/turns.db"), Answers(model="fake", calls=[])
    holding, done = threading.Event(), threading.Event()

    def go() -> Any:
        options: dict[str, Any] = {"thread_id": "t", "store": store, "run_id": "evA", "busy": "reject"}
        if kickoff == "sync":
            return durable_kickoff(one_task_crew(llm), **options)
        return asyncio.run(adurable_kickoff(one_task_crew(llm), **options))

    def other_turn() -> None:
        with pk.resume("t", store=store, run_id="other"):
            holding.set()
            done.wait(30)

    worker = threading.Thread(target=other_turn)
    worker.start()
    try:
        assert holding.wait(30)
        with pytest.raises(pk.ThreadBusyError) as info:
            go()
        assert info.value.retryable and llm.calls == []  # refused before any task ran
    finally:
        done.set()
        worker.join()
    assert go().raw == "ok" and llm.calls == ["call"]
    store.close()


@pytest.mark.parametrize(("option", "value"), [("busy", "sometimes"), ("lease_ttl", 0), ("busy_timeout", -1)])
def test_a_bad_busy_option_is_a_configuration_error(option: str, value: Any, tmp_path: Path) -> None:
    store, llm = pk.connect(f"sqlite:///{tmp_path}/turns.db"), Answers(model="fake", calls=[])
    with pytest.raises(pk.ConfigurationError, match=option):
        durable_kickoff(one_task_crew(llm), thread_id="t", store=store, **{option: value})
    assert llm.calls == []
    store.close()
