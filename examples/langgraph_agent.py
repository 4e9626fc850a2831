"""A LangGraph agent on persistkit that dies mid-run and resumes (offline: a fake model).

    pip install 'persistkit[langgraph]'
    python examples/langgraph_agent.py        # store: $PERSISTKIT_URL, else a temp SQLite file

The script runs the agent in a child process. The fake model asks for a tool,
the tool runs, and on the model's next call the child kills itself with
SIGKILL (a real process death, no cleanup). The script then starts the child
again with the same thread id: LangGraph loads the last checkpoint from the
persistkit store, so the first model call and the tool call are not repeated;
only the model call that was in flight runs again. A third start is the same
event delivered again (Slack retries an event it did not see acknowledged):
the turn finished, so it returns the answer without running a node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph

from persistkit_langgraph import PersistkitSaver, durable_invoke


def agent(workdir: str, thread_id: str, url: str) -> None:
    def log(what: str) -> None:
        with open(os.path.join(workdir, "calls.log"), "a") as f:
            f.write(what + "\n")

    def fake_model(state: MessagesState) -> dict[str, Any]:
        log("model")
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            marker = os.path.join(workdir, "crashed")
            if not os.path.exists(marker):
                open(marker, "w").close()
                print("child: the model process dies now (SIGKILL)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return {"messages": [AIMessage(f"The weather in Paris: {last.content}.")]}
        call = {"name": "weather", "args": {"city": "Paris"}, "id": "call-1"}
        return {"messages": [AIMessage("", tool_calls=[call])]}

    def weather(state: MessagesState) -> dict[str, Any]:
        log("tool")  # imagine a paid API call: it must not run twice
        request = state["messages"][-1]
        assert isinstance(request, AIMessage)
        call = request.tool_calls[0]
        return {"messages": [ToolMessage("sunny, 21 C", tool_call_id=call["id"])]}

    def route(state: MessagesState) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    builder = StateGraph(MessagesState)
    builder.add_node("model", fake_model)
    builder.add_node("tools", weather)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")

    with PersistkitSaver.from_url(url) as saver:
        graph = builder.compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        if graph.get_state(config).next:
            print("child: resuming from the last checkpoint", flush=True)
        # One turn per event: run_id is the event id. The turn holds the thread's lease (turns of
        # one thread run one at a time, in arrival order, across processes; busy="queue" waits
        # up to busy_timeout s). The same call after a crash continues the unfinished turn (the
        # input is not applied again); called again after it finished, it returns its result
        # without running a node. durability="sync" commits each step before the next starts.
        event = {"messages": [HumanMessage("What is the weather in Paris?")]}
        out = durable_invoke(graph, event, config, run_id="evt-1", busy="queue", busy_timeout=300)
        print("answer:", out["messages"][-1].content)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        agent(*sys.argv[2:5])
        return
    workdir = tempfile.mkdtemp(prefix="pk-langgraph-")
    url = os.environ.get("PERSISTKIT_URL") or f"sqlite:///{workdir}/agent.db"
    child = [sys.executable, os.path.abspath(__file__), "--child", workdir, f"demo-{uuid.uuid4().hex[:8]}", url]
    first = subprocess.run(child)
    print(f"first run ended with exit status {first.returncode} (-9: killed)")
    second = subprocess.run(child)
    if second.returncode != 0:
        sys.exit(f"the resumed run failed with status {second.returncode}")
    redelivered = subprocess.run(child)  # the same event again
    if redelivered.returncode != 0:
        sys.exit(f"the redelivered event failed with status {redelivered.returncode}")
    with open(os.path.join(workdir, "calls.log")) as f:
        calls = f.read().split()
    print(f"model calls: {calls.count('model')} (one was in flight at the crash and ran again)")
    print(f"tool calls: {calls.count('tool')}")
    if calls.count("model") != 3 or calls.count("tool") != 1:
        sys.exit(f"a node ran more often than it should have: {calls}")


if __name__ == "__main__":
    main()
