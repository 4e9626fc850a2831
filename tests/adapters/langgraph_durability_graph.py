"""A four-node LangGraph graph (a -> b -> c -> d, instant nodes) that SIGKILLs itself in one node.

usage: python langgraph_durability_graph.py SAVER URL THREAD LOG DURABILITY KILL

SAVER is ``persistkit`` (``PersistkitSaver.from_url(URL)``) or ``sqlite``
(LangGraph's own ``SqliteSaver`` on the file of a ``sqlite:///`` URL). The
first run in a LOG directory kills its process inside node KILL after logging
it, or with KILL ``put:X`` inside the saver's ``put`` of the checkpoint after
node X (X's writes are committed, the checkpoint after them is not); later
runs finish. A run continues the thread with ``durable_invoke`` and
the same input (``durable_invoke`` works with any checkpointer). Every node
execution is appended to LOG; the final items (or the error) are printed.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from persistkit_langgraph import PersistkitSaver, durable_invoke

NODES = "abcd"


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def build(log: str, kill: str) -> StateGraph[Any]:
    def node(name: str) -> Any:
        def run(state: State) -> dict[str, Any]:
            with open(log, "a") as f:
                f.write(name + "\n")
            if name == kill and not os.path.exists(log + ".killed"):
                open(log + ".killed", "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return {"items": [name]}

        return run

    builder: StateGraph[Any] = StateGraph(State)
    prev = START
    for name in NODES:
        builder.add_node(name, node(name))
        builder.add_edge(prev, name)
        prev = name
    builder.add_edge(prev, END)
    return builder


def main() -> None:
    saver_kind, url, thread, log, durability, kill = sys.argv[1:7]
    saver: Any
    if saver_kind == "persistkit":
        saver = PersistkitSaver.from_url(url)
    else:
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        saver = SqliteSaver(sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False))
    if kill.startswith("put:"):
        step = NODES.index(kill[4:]) + 1  # the checkpoint after node X has step index(X) + 1
        put = saver.put

        def dying_put(config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            if metadata.get("step") == step and not os.path.exists(log + ".killed"):
                # LangGraph saves a task's writes in the background: wait until X's are in.
                deadline = time.monotonic() + 20
                while not any(w[1] == "items" for w in saver.get_tuple(config).pending_writes):
                    if time.monotonic() > deadline:
                        sys.exit(3)  # the scenario did not happen: fail loudly rather than kill
                    time.sleep(0.01)
                open(log + ".killed", "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return put(config, checkpoint, metadata, new_versions)

        saver.put = dying_put
    graph = build(log, kill).compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": thread}}
    try:
        out = durable_invoke(graph, {"items": []}, config, durability=durability)
        print(json.dumps({"items": out["items"]}))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))


if __name__ == "__main__":
    main()
