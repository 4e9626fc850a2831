"""One process of the cross-process secrets test of the LangGraph saver.

usage: python langgraph_secret_process.py write|read|read-bare URL THREAD

``write`` and ``read`` run the documented setup first
(``pk.secrets.from_env("openai", "PK_TEST_OPENAI_KEY")``); ``read-bare`` does
not. ``write`` runs a graph whose tool call and tool output hold the key;
the readers print the tool message and tool-call argument as ``graph.get_state``
shows them (inspection: handles), and as ``pk.secrets.resolve`` gives them back
(or the error, when nothing can resolve them).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, durable_invoke

mode, url, thread = sys.argv[1:4]
if mode != "read-bare":
    pk.secrets.from_env("openai", "PK_TEST_OPENAI_KEY")


def model(state: MessagesState) -> dict[str, Any]:
    import os

    call = {"name": "login", "args": {"api_key": os.environ["PK_TEST_OPENAI_KEY"]}, "id": "call-1"}
    return {"messages": [AIMessage("", tool_calls=[call])]}


def tool(state: MessagesState) -> dict[str, Any]:
    import os

    return {"messages": [ToolMessage(f"logged in with {os.environ['PK_TEST_OPENAI_KEY']} .", tool_call_id="call-1")]}


builder = StateGraph(MessagesState)
builder.add_node("model", model)
builder.add_node("tool", tool)
builder.add_edge(START, "model")
builder.add_edge("model", "tool")
builder.add_edge("tool", END)
with PersistkitSaver.from_url(url) as saver:
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": thread}}
    if mode == "write":
        durable_invoke(graph, {"messages": [HumanMessage("log in")]}, config)
        print(json.dumps({"written": True}))
    else:
        messages = graph.get_state(config).values["messages"]  # never needs the value
        shown = {"arg": messages[1].tool_calls[0]["args"]["api_key"], "content": messages[2].content}
        try:
            messages = pk.secrets.resolve(messages)
            arg: Any = messages[1].tool_calls[0]["args"]["api_key"]
            content = messages[2].content
        except pk.PersistkitError as exc:  # nothing here knows the value
            arg, content = f"{type(exc).__name__}: {exc}", None
        print(json.dumps({"shown": shown, "arg": arg, "content": content}))
