"""An OpenAI Agents SDK agent wrapped by ``durable()``, crashed at every step by the crash matrix.

    pytest examples/testing/test_openai_agents_agent.py   # needs persistkit[openai-agents]; offline

Copy it next to your own agent: keep the ``pk.resume`` block and ``durable(agent)``, and give
the matrix a fake model (a ``Model`` whose answer follows from its input only). Every model
turn and every function-tool call is a step, so the matrix crashes before, inside and after
each of them, resumes, and checks that no finished booking or model turn ran again (the
three bookings of one turn run side by side: the SDK gathers them).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("agents")
os.environ.setdefault("OPENAI_API_KEY", "sk-offline")  # never used: the model is fake

import agents
from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import persistkit as pk
from persistkit_openai_agents import durable

agents.set_tracing_disabled(True)
CITIES = ["Lisbon", "Porto", "Madrid"]


class FakeModel(Model):
    """Asks for every booking at once (parallel tool calls), then, with their results in its
    input, answers: its answer follows from the input only, as the matrix needs."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        done = [
            item["output"]
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if done:
            text = ResponseOutputText(type="output_text", text="; ".join(done), annotations=[])
            answer = ResponseOutputMessage(
                type="message", id="msg", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[answer], usage=usage, response_id=None)
        calls = [
            ResponseFunctionToolCall(
                type="function_call",
                id=f"fc_{i}",
                call_id=f"call_{i}",
                name="book_hotel",
                arguments=json.dumps({"city": city}),
            )
            for i, city in enumerate(CITIES)
        ]
        return ModelResponse(output=list(calls), usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@function_tool
def book_hotel(city: str) -> str:
    """Book a hotel in ``city`` (a side effect that must not happen twice)."""
    return f"confirmed: {city}"


travel = Agent(name="travel", instructions="Book the trip.", model=FakeModel(), tools=[book_hotel])


async def plan_trip(thread_id: str, request: str) -> str:
    """The agent under test: one turn of the conversation ``thread_id``."""
    async with pk.resume(thread_id) as run:
        result = await Runner.run(durable(travel), request)
        run.state["answer"] = str(result.final_output)
        return str(result.final_output)


@pytest.mark.parametrize("mode", ["process", "inline"])  # process first: its children fork from this process
def test_the_agent_survives_a_crash_at_every_step(crash_matrix: Any, mode: str) -> None:
    result = crash_matrix(lambda: plan_trip("trip-42", "Book my trip."), mode=mode)
    # 2 model turns and 3 bookings (run side by side by the SDK), each crashed 3 ways
    assert len(result.points) == 5 * 3, str(result)
    for check in (result.assert_exactly_once, result.assert_same_outcome):
        check()  # no booking or paid model turn ran again; the same answer and state
    assert result.reference.value == "; ".join(f"confirmed: {city}" for city in CITIES)
