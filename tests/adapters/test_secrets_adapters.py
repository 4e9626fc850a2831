"""Secrets planted through every adapter never reach storage, in any encoding.

Each test plants fresh keys of many formats (``planted.fresh_keys``) where a
framework's user would hold them — a user message, a model's tool-call
arguments, a tool's output, a plain state channel, run metadata — then reads
the raw bytes of the store back (SQLite file, PostgreSQL rows, Redis values,
S3 objects) and looks for each key as it is, base64 and hex.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from conftest import make_url, uid
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from planted import connect, fresh_keys, leaks, raw_bytes, text

from persistkit_langgraph import PersistkitSaver

STORES = ["sqlite", "postgres", "redis", "s3"]


@pytest.fixture(params=STORES)
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


# -- LangGraph ------------------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: str
    settings: dict[str, Any]


def test_langgraph_saver_stores_no_secret(url: str) -> None:
    keys = fresh_keys()
    said = text(keys)

    def model(state: Chat) -> dict[str, Any]:
        call = {"name": "lookup", "args": {"token": keys["openai"], "query": said}, "id": "call-1"}
        return {"messages": [AIMessage(content=f"calling with {said}", tool_calls=[call])]}

    def tool(state: Chat) -> dict[str, Any]:
        return {"messages": [ToolMessage(content=f"tool output: {said}", tool_call_id="call-1")]}

    def remember(state: Chat) -> dict[str, Any]:
        return {"notes": said, "settings": {"nested": [{kind: k} for kind, k in keys.items()], said: 1}}

    builder: StateGraph[Any] = StateGraph(Chat)
    for name, fn in (("model", model), ("tool", tool), ("remember", remember)):
        builder.add_node(name, fn)
    builder.add_edge(START, "model")
    builder.add_edge("model", "tool")
    builder.add_edge("tool", "remember")
    builder.add_edge("remember", END)
    config: Any = {"configurable": {"thread_id": uid("lg")}, "metadata": {"note": said}}
    first = {"messages": [HumanMessage(content=f"my keys: {said}")], "notes": "", "settings": {}}
    for durability in ("sync", "async", "exit"):
        with PersistkitSaver(connect(url)) as saver:
            saver._owns_store = True
            graph = builder.compile(checkpointer=saver)
            out = graph.invoke(first, config, durability=durability)
            assert out["notes"] == said
            # Read back in this process: the handles resolve to the values again.
            values = graph.get_state(config).values
            assert values["notes"] == said and values["settings"]["nested"][0]["openai"] == keys["openai"]
            assert values["messages"][2].content == f"tool output: {said}"
            assert values["messages"][1].tool_calls[0]["args"]["token"] == keys["openai"]
        config = {**config, "configurable": {"thread_id": uid("lg")}}
    data = raw_bytes(url)
    assert b"$CRED{openai-" in data  # the store holds handles where the keys were
    assert leaks(data, keys) == []
