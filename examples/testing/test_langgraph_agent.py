"""A LangGraph agent (a model node and a tool node in a loop), crashed at every step by the
crash matrix.

    pytest examples/testing/test_langgraph_agent.py      # needs persistkit[langgraph]; offline

The graph runs inside ``pk.resume`` and its model and tool calls are ``@pk.checkpointed``
steps (the persistkit context follows LangGraph into its nodes and its ``ToolNode``), so the matrix crashes
before, inside and after each call, resumes, and checks that no finished model call or
tool call ran again and that the answer and the thread's state are the uncrashed ones.

A graph whose only durability is ``PersistkitSaver`` (or ``durable_invoke``) has no
persistkit step for the matrix to crash: it reports that (``no-steps``) instead of passing.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import persistkit as pk

CITIES = ["Paris", "Lisbon"]


@pk.checkpointed
def fake_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A deterministic stand-in for the model: asks for the weather of each city, then answers.
    Its answer follows from the conversation only, as the matrix needs."""
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if len(results) < len(CITIES):
        return {"role": "assistant", "content": "", "city": CITIES[len(results)]}
    return {"role": "assistant", "content": "Weather: " + "; ".join(results)}


@pk.checkpointed
def get_weather(city: str) -> str:
    """The tool's work (imagine a paid API call: it must not run twice)."""
    return f"{city} sunny, {len(city) + 15} C"


@tool
def weather(city: str) -> str:
    """The weather in ``city`` now."""
    return get_weather(city)


def _plain(message: AnyMessage) -> dict[str, Any]:
    """A message as step arguments: plain data, so its digest is stable between runs."""
    role = {"human": "user", "ai": "assistant", "tool": "tool"}[message.type]
    return {"role": role, "content": message.content}


def model(state: MessagesState) -> dict[str, Any]:
    reply = fake_model([_plain(m) for m in state["messages"]])
    city = reply.get("city")
    calls = [{"name": "weather", "args": {"city": city}, "id": f"call-{city}"}] if city else []
    return {"messages": [AIMessage(reply["content"], tool_calls=calls)]}


graph = (
    StateGraph(MessagesState)
    .add_node("model", model)
    .add_node("tools", ToolNode([weather]))
    .add_edge(START, "model")
    .add_conditional_edges("model", tools_condition)
    .add_edge("tools", "model")
    .compile()
)


def answer(thread_id: str, question: str) -> str:
    """The agent under test: one turn of ``thread_id``; the transcript is kept in the run's state."""
    with pk.resume(thread_id) as run:
        out = graph.invoke({"messages": [HumanMessage(question)]})
        run.state["transcript"] = [_plain(m) for m in out["messages"]]
        return str(out["messages"][-1].content)


@pytest.mark.parametrize("mode", ["process", "inline"])  # process first: its children fork from this process
def test_the_graph_survives_a_crash_at_every_step(crash_matrix: Any, mode: str) -> None:
    question = "Weather in Paris and Lisbon?"
    result = crash_matrix(lambda: answer("weather-42", question), mode=mode)
    # 3 model calls and 2 tool calls, each crashed before, inside and after its body
    assert len(result.points) == 5 * 3, str(result)
    result.assert_exactly_once()  # no finished model or tool call ran again
    result.assert_same_outcome()  # the same answer and transcript as the uncrashed run
    (transcript,) = result.reference.states.values()
    assert (
        transcript["transcript"][-1]["content"] == "Weather: Paris sunny, 20 C; Lisbon sunny, 21 C"
    )
