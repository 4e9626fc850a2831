"""One Slack-style turn of a three-node LangGraph agent, in its own process.

usage: python langgraph_turn_worker.py URL THREAD RUN_ID DIR [sync|async|plain] [OPTIONS...]

The graph appends ``<run>:user`` (the event's message), then ``<run>:think``,
``<run>:act`` and ``<run>:reply`` to ``messages``. Each node body appends
``<run>:<node>`` to ``DIR/effects`` as its last act (a finished node body), and
``think`` touches ``DIR/<run>.running`` first (the turn holds the thread).
``sync``/``async`` run it with ``durable_invoke``/``adurable_invoke`` under
``run_id``; ``plain`` with ``graph.invoke`` (no lease, no identity).

Options: ``kill`` SIGKILLs the process at the start of ``act`` (after ``think``
committed); ``slow`` makes ``think`` take 0.3 s; ``busy=...``, ``timeout=...``;
``id=...`` the turn's run_id when it is not RUN (an event id that looks like a secret).
Prints ``{"ok": result}`` or ``{"error": class name, "message": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import signal
import sys
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, adurable_invoke, durable_invoke

URL, THREAD, RUN, DIR = sys.argv[1:5]
MODE = sys.argv[5] if len(sys.argv) > 5 else "sync"
OPTIONS = dict(o.partition("=")[::2] for o in sys.argv[6:])
RUN_ID = OPTIONS.get("id") or RUN


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def effect(name: str) -> None:
    with open(os.path.join(DIR, "effects"), "a") as f:
        f.write(f"{RUN}:{name}\n")
        f.flush()
        os.fsync(f.fileno())


def think(state: State) -> dict[str, Any]:
    open(os.path.join(DIR, f"{RUN}.running"), "w").close()
    if "slow" in OPTIONS:
        time.sleep(0.3)
    effect("think")
    return {"messages": [f"{RUN}:think"]}


def act(state: State) -> dict[str, Any]:
    if "kill" in OPTIONS:
        os.kill(os.getpid(), signal.SIGKILL)
    effect("act")
    return {"messages": [f"{RUN}:act"]}


def reply(state: State) -> dict[str, Any]:
    effect("reply")
    return {"messages": [f"{RUN}:reply"]}


def build(saver: PersistkitSaver) -> Any:
    builder: StateGraph[Any] = StateGraph(State)
    for name, fn in (("think", think), ("act", act), ("reply", reply)):
        builder.add_node(name, fn)
    builder.add_edge(START, "think")
    builder.add_edge("think", "act")
    builder.add_edge("act", "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def main() -> None:
    options: dict[str, Any] = {}
    if "busy" in OPTIONS:
        options["busy"] = OPTIONS["busy"]
    if "timeout" in OPTIONS:
        options["busy_timeout"] = float(OPTIONS["timeout"])
    config: Any = {"configurable": {"thread_id": THREAD}}
    event = {"messages": [f"{RUN}:user"]}
    with PersistkitSaver.from_url(URL) as saver:
        graph = build(saver)
        try:
            if MODE == "plain":
                out = graph.invoke(event, config, durability="sync")
            elif MODE == "async":
                out = asyncio.run(adurable_invoke(graph, event, config, run_id=RUN_ID, **options))
            else:
                out = durable_invoke(graph, event, config, run_id=RUN_ID, **options)
        except pk.PersistkitError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc), "unfinished_run": getattr(exc, "unfinished_run", None)}))
            return
    print(json.dumps({"ok": out}))


if __name__ == "__main__":
    main()
