"""A LangGraph agent (a model node and a tool node in a loop), crashed at every step by the
crash matrix.

    pytest examples/testing/test_langgraph_agent.py      # needs persistkit[langgraph]; offline

The graph runs inside ``pk.resume`` and its model and tool calls are ``@pk.checkpointed``
steps (the persistkit context follows LangGraph into its nodes), so the matrix crashes
before, inside and after each call, resumes, and checks that no finished model call or
tool call ran again and that the answer and the thread's state are the uncrashed ones.

A graph whose only durability is ``PersistkitSaver`` (or ``durable_invoke``) has no
persistkit step for the matrix to crash: it reports that (``no-steps``) instead of passing.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph

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
def weather(city: str) -> str:
    """The tool (imagine a paid API call: it must not run twice)."""
    return f"{city} sunny, {len(city) + 15} C"


def _plain(message: AnyMessage) -> dict[str, Any]:
    """A message as step arguments: plain data, so its digest is stable between runs."""
    role = {"human": "user", "ai": "assistant", "tool": "tool"}[message.type]
    return {"role": role, "content": message.content}


def model(state: MessagesState) -> dict[str, Any]:
    reply = fake_model([_plain(m) for m in state["messages"]])
    if "city" in reply:
        call = {"name": "weather", "args": {"city": reply["city"]}, "id": f"call-{reply['city']}"}
        return {"messages": [AIMessage("", tool_calls=[call])]}
    return {"messages": [AIMessage(reply["content"])]}


def tools(state: MessagesState) -> dict[str, Any]:
    request = state["messages"][-1]
    assert isinstance(request, AIMessage)
    return {"messages": [ToolMessage(weather(**c["args"]), tool_call_id=c["id"]) for c in request.tool_calls]}


def route(state: MessagesState) -> str:
    return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END


builder = StateGraph(MessagesState)
builder.add_node("model", model)
builder.add_node("tools", tools)
builder.add_edge(START, "model")
builder.add_conditional_edges("model", route, ["tools", END])
builder.add_edge("tools", "model")
graph = builder.compile()


def answer(thread_id: str, question: str) -> str:
    """The agent under test: one turn of ``thread_id``; the transcript is kept in the run's state."""
    with pk.resume(thread_id) as run:
        out = graph.invoke({"messages": [HumanMessage(question)]})
        run.state["transcript"] = [_plain(m) for m in out["messages"]]
        return str(out["messages"][-1].content)


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_the_graph_survives_a_crash_at_every_step(crash_matrix: Any, mode: str) -> None:
    result = crash_matrix(lambda: answer("weather-42", "Weather in Paris and Lisbon?"), mode=mode)
    result.assert_exactly_once()
    result.assert_same_outcome()
    assert result.reference.value == "Weather: Paris sunny, 20 C; Lisbon sunny, 21 C"
    assert len(result.points) == 5 * 3  # 3 model calls and 2 tool calls, each crashed 3 ways
