"""An OpenAI Agents SDK agent wrapped by ``durable()``, crashed at every step by the crash matrix.

    pytest examples/testing/test_openai_agents_agent.py   # needs persistkit[openai-agents]; offline

Copy it next to your own agent: keep the ``pk.resume`` block and ``durable(agent)``, and give
the matrix a fake model (a ``Model`` whose answer follows from its input only). Every model
turn and every function-tool call is a step, so the matrix crashes before, inside and after
each of them, resumes, and checks that no finished booking or model turn ran again.
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
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

import persistkit as pk
from persistkit_openai_agents import durable

agents.set_tracing_disabled(True)
CITIES = ["Lisbon", "Porto", "Madrid"]


class FakeModel(Model):
    """Books the next city (one tool call per turn), then answers. Stateless: the turn is the
    number of tool outputs already in the input, as a real model's answer follows from it."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        done = sum(1 for item in input if isinstance(item, dict) and item.get("type") == "function_call_output")
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        if done < len(CITIES):
            call = ResponseFunctionToolCall(
                type="function_call", id=f"fc_{done}", call_id=f"call_{done}",
                name="book_hotel", arguments=json.dumps({"city": CITIES[done]}),
            )
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(type="output_text", text=f"Booked {done} hotels.", annotations=[])
        message = ResponseOutputMessage(type="message", id="msg", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=usage, response_id=None)

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


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_the_agent_survives_a_crash_at_every_step(crash_matrix: Any, mode: str) -> None:
    result = crash_matrix(lambda: plan_trip("trip-42", "Book my trip."), mode=mode)
    result.assert_exactly_once()
    result.assert_same_outcome()
    assert result.reference.value == "Booked 3 hotels."
    assert len(result.points) == 7 * 3  # 4 model turns and 3 tool calls, each crashed 3 ways
