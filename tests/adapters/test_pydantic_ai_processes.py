"""The Pydantic AI adapter in real worker processes: a SIGKILL at every step of a tool-using
agent, and the turns of one thread (two at once, a redelivered one, a worker killed mid-turn
while the next turn waits), on SQLite and PostgreSQL.

Each turn is ``pydantic_ai_worker.py``: three model requests, the first with two parallel
tool calls. Each model request and tool body writes ``begin``/``done`` to an effects file;
the thread's conversation is the ``pydantic_ai_messages`` channel (Pydantic AI's own
message JSON).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim is not installed")

from conftest import make_url, uid
from pydantic_ai_worker import STEPS
from turn_cases import Turns, contiguous

from persistkit_pydantic_ai import MESSAGES_CHANNEL

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("pydantic_ai_worker.py")
MESSAGES_PER_TURN = 6  # prompt, 2 calls, 2 returns, call, return, reply: 6 messages


def finished(message: str) -> set[str]:
    """What a whole turn of ``message`` runs: three model requests, three tool bodies."""
    return {f"model {message} {k}" for k in range(3)} | {f"tool {message} {n}" for n in (1, 2, 3)}


@pytest.fixture(params=["sqlite", "postgres"])
def turns(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> Iterator[Turns]:
    t = Turns(
        SCRIPT, make_url(request.param, request, tmp_path_factory), uid("pyd-thread"), tmp_path
    )
    yield t
    t.close()


def conversation(turns: Turns) -> list[str]:
    """Whose turn each stored message belongs to, in order (by the message id in its parts)."""
    items = turns.store.get_state(turns.thread, plain=True)[MESSAGES_CHANNEL]
    owners = []
    for item in items:
        for part in item["parts"]:
            if part.get("part_kind") == "user-prompt":
                owners.append(str(part["content"]).removeprefix("message "))
                break
            if "tool_call_id" in part:
                owners.append(part["tool_call_id"].removeprefix("call_").rsplit("_", 1)[0])
                break
            if part.get("part_kind") == "text":
                owners.append(part["content"].removeprefix("reply to "))
                break
    return owners


@pytest.mark.parametrize("step", STEPS)
def test_sigkill_at_every_step_runs_each_finished_step_once(turns: Turns, step: str) -> None:
    turns.killed(turns.start("evA", "--kill", step))
    assert turns.finish(turns.start("evA")) == {"final_output": "reply to evA"}
    begun = turns.assert_done_once(finished("evA"))
    in_flight = step.replace(":", " evA ")
    # At-least-once for the body in flight at the kill; every other step ran exactly once
    # (the parallel sibling of a killed tool call may have begun too: it had not finished).
    again = {k for k, n in begun.items() if n > 1}
    assert in_flight in again
    assert again <= {in_flight, "tool evA 1", "tool evA 2"}
    assert contiguous(conversation(turns)) == [("evA", MESSAGES_PER_TURN)]


def test_two_turns_of_one_thread_at_once_both_land_in_arrival_order(turns: Turns) -> None:
    first = turns.start("evA", "--hold-tool", "1")
    turns.until_holding(first)
    second = turns.start("evB")
    turns.until_waiting(second)
    turns.release("evA")
    assert turns.finish(first) == {"final_output": "reply to evA"}
    assert turns.finish(second) == {"final_output": "reply to evB"}
    assert contiguous(conversation(turns)) == [
        ("evA", MESSAGES_PER_TURN),
        ("evB", MESSAGES_PER_TURN),
    ]
    begun = turns.assert_done_once(finished("evA") | finished("evB"))
    assert set(begun.values()) == {1}
    assert [run for run, _ in contiguous(turns.runs_in_history())] == ["evA", "evB"]


def test_a_redelivered_turn_that_finished_returns_without_running(turns: Turns) -> None:
    assert turns.finish(turns.start("evA")) == {"final_output": "reply to evA"}
    assert turns.finish(turns.start("evB")) == {"final_output": "reply to evB"}
    before = turns.effects()
    assert turns.finish(turns.start("evA")) == {"final_output": "reply to evA"}
    assert turns.effects() == before  # no model request, no tool
    assert contiguous(conversation(turns)) == [
        ("evA", MESSAGES_PER_TURN),
        ("evB", MESSAGES_PER_TURN),
    ]


def test_a_worker_killed_mid_turn_while_the_next_turn_waits(turns: Turns) -> None:
    first = turns.start("evA", "--hold-tool", "3", "--kill", "tool:3")
    turns.until_holding(first)
    second = turns.start("evB")
    turns.until_waiting(second)
    turns.release("evA")
    turns.killed(first)
    redelivered = turns.start("evA")
    assert turns.finish(redelivered) == {"final_output": "reply to evA"}
    assert turns.finish(second) == {"final_output": "reply to evB"}
    begun = turns.assert_done_once(finished("evA") | finished("evB"))
    assert {k for k, n in begun.items() if n > 1} == {"tool evA 3"}
    assert contiguous(conversation(turns)) == [
        ("evA", MESSAGES_PER_TURN),
        ("evB", MESSAGES_PER_TURN),
    ]
