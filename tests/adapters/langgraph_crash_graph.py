"""A LangGraph graph on a persistkit store that kills its own process mid-superstep.

usage: python langgraph_crash_graph.py URL THREAD_ID LOG

``plan`` runs, then ``fast`` and ``slow`` run in parallel. On the first run
``slow`` waits until ``fast``'s writes are committed to the store, then the
process SIGKILLs itself. A second run resumes from the store: ``plan`` and
``fast`` must not run again; ``slow`` (in flight at the crash) and ``finish``
run. Every node execution is appended to LOG; the final items are printed.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from persistkit_langgraph import PersistkitSaver

URL, THREAD, LOG = sys.argv[1:4]
fast_committed = threading.Event()


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def record(name: str) -> None:
    with open(LOG, "a") as f:
        f.write(name + "\n")


def plan(state: State) -> dict[str, Any]:
    record("plan")
    return {"items": ["plan"]}


def fast(state: State) -> dict[str, Any]:
    record("fast")
    return {"items": ["fast"]}


def slow(state: State) -> dict[str, Any]:
    record("slow")
    marker = LOG + ".crashed"
    if not os.path.exists(marker):
        if not fast_committed.wait(20):
            sys.exit(3)  # the scenario did not happen: fail loudly rather than kill
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"items": ["slow"]}


def finish(state: State) -> dict[str, Any]:
    record("finish")
    return {"items": ["finish"]}


class Saver(PersistkitSaver):
    """Signals once ``fast``'s writes are durable (so the kill lands after them)."""

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        super().put_writes(config, writes, task_id, task_path)
        if ("items", ["fast"]) in writes:
            fast_committed.set()


builder = StateGraph(State)
builder.add_node("plan", plan)
builder.add_node("fast", fast)
builder.add_node("slow", slow)
builder.add_node("finish", finish)
builder.add_edge(START, "plan")
builder.add_edge("plan", "fast")
builder.add_edge("plan", "slow")
builder.add_edge(["fast", "slow"], "finish")
builder.add_edge("finish", END)

with Saver.from_url(URL) as saver:
    graph = builder.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": THREAD}}
    resuming = saver.get_tuple(config) is not None
    out = graph.invoke(None if resuming else {"items": []}, config, durability="sync")
    print(json.dumps(out["items"]))
