"""A worker process for the LangGraph stream kill test (no network: ``GenericFakeChatModel``).

    python langgraph_stream_worker.py URL THREAD RUN_ID KILL_AT

Runs one turn of a two-node graph (``plan`` answers at once, ``answer`` streams ``ANSWER``)
with ``durable_invoke(..., stream="answer")``. ``KILL_AT`` >= 0: inside the ``answer`` node,
once that many of its chunks are in the store (it reads its own stream), the process
SIGKILLs itself. Prints the answer on success.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, durable_invoke

PLAN = "Plan: look it up."
ANSWER = "Durable answers survive a crash."


def _wait_in_store(store: pk.Store, thread: str, n: int) -> None:
    seen = 0
    for ev in store.read_stream(thread, "answer", namespace="lg:s:", timeout=10):
        if ev.kind == "event" and ev.data.get("node") == "answer":
            seen += 1
            if seen >= n:
                return
    raise AssertionError(f"only {seen} of {n} chunks reached the store")


def graph(store: pk.Store, thread: str, kill_at: int) -> Any:
    def plan(state: MessagesState) -> dict[str, Any]:
        return {
            "messages": [
                GenericFakeChatModel(messages=iter([AIMessage(content=PLAN)])).invoke(
                    state["messages"]
                )
            ]
        }

    def answer(state: MessagesState) -> dict[str, Any]:
        whole = None
        model = GenericFakeChatModel(messages=iter([AIMessage(content=ANSWER)]))
        for i, chunk in enumerate(model.stream(state["messages"])):
            if i == kill_at:
                _wait_in_store(store, thread, i)
                os.kill(os.getpid(), signal.SIGKILL)
            whole = chunk if whole is None else whole + chunk
        return {"messages": [whole]}

    builder: StateGraph[Any] = StateGraph(MessagesState)
    builder.add_node("plan", plan)
    builder.add_node("answer", answer)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=PersistkitSaver(store))


def main() -> None:
    url, thread, run_id, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with pk.connect(url) as store:
        config = {"configurable": {"thread_id": thread}}
        out = durable_invoke(
            graph(store, thread, kill_at),
            {"messages": [HumanMessage("hi")]},
            config,
            run_id=run_id,
            stream="answer",
        )
    print(out["messages"][-1].content)


if __name__ == "__main__":
    main()
