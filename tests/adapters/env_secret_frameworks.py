"""A key from the environment in each framework's own state and tool calls, run as its own process.

    python env_secret_frameworks.py FRAMEWORK URL THREAD KILL_AT [inspect]

FRAMEWORK: ``langgraph`` (a real graph: model node -> tool node -> model node, on
``PersistkitSaver``, run with ``durable_invoke``), ``crewai`` (a ``Flow`` with
``@persist(PersistkitFlowPersistence)``: begin -> draft -> send, resumed with
``restore`` + ``kickoff``) or ``openai`` (``durable_run`` of an SDK ``Agent`` whose
offline model calls tool ``send`` with the key inside the email body).

The key is read from ``$PK_AGENT_OPENAI_API_KEY``; nothing is registered or
configured. Every model call, node, flow method and tool appends what it was handed
to ``$PK_AGENT_OUTBOX`` (JSON lines ``{"step", "texts"}``) and SIGKILLs the process
when its name is KILL_AT (``none``: never). ``inspect``: read the thread only
(LangGraph ``get_state`` / ``get_state_history``, CrewAI ``inspect_state``, the
store's ``get_state``) and print what it shows. Prints one JSON line.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypedDict

import persistkit as pk

if sys.argv[1] == "langgraph":  # module globals: LangGraph reads the state class's annotations
    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

VARIABLE = "PK_AGENT_OPENAI_API_KEY"
FRAMEWORK, URL, THREAD, KILL_AT = sys.argv[1:5]
INSPECT = sys.argv[5:] == ["inspect"]
OUTBOX = Path(os.environ["PK_AGENT_OUTBOX"])
#: the steps of each framework's agent in the order they run (KILL_AT names one)
STEPS = {
    "langgraph": ("model", "tool", "model2"),
    "crewai": ("begin", "draft", "send"),
    "openai": ("model", "send", "model2"),
}


def key() -> str:
    return os.environ.get(VARIABLE, "")


def log(step: str, *texts: Any) -> None:
    with OUTBOX.open("a") as f:
        f.write(json.dumps({"step": step, "texts": [t if isinstance(t, str) else json.dumps(t, default=str) for t in texts]}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    if step == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def body_for(api_key: str) -> str:
    return f"Hello ops,\nthe deploy key is {api_key} (rotate it monthly).\n"


# -- LangGraph -------------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    api_key: str


def langgraph() -> dict[str, Any]:
    from persistkit_langgraph import PersistkitSaver, durable_invoke

    def model(state: Chat) -> dict[str, Any]:
        done = any(isinstance(m, ToolMessage) for m in state["messages"])
        log("model2" if done else "model", state["api_key"], *[str(m.content) for m in state["messages"]])
        if done:
            return {"messages": [AIMessage("sent it")]}
        call = {"name": "send", "args": {"body": body_for(state["api_key"])}, "id": "call-1"}
        return {"messages": [AIMessage("", tool_calls=[call])]}

    def tool(state: Chat) -> dict[str, Any]:
        args = state["messages"][-1].tool_calls[0]["args"]  # type: ignore[union-attr]
        log("tool", args["body"], state["api_key"])
        return {"messages": [ToolMessage(f"sent: {args['body']}", tool_call_id="call-1")]}

    builder: StateGraph[Any] = StateGraph(Chat)
    builder.add_node("model", model)
    builder.add_node("tool", tool)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: "tool" if s["messages"][-1].tool_calls else END)
    builder.add_edge("tool", "model")
    with PersistkitSaver.from_url(URL) as saver:
        graph = builder.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": THREAD}}
        if INSPECT:
            values = graph.get_state(config).values
            history = list(graph.get_state_history(config))
            return {"api_key": values["api_key"], "texts": [str(m.content) for m in values["messages"]],
                    "tool_args": [m.tool_calls[0]["args"] for m in values["messages"] if getattr(m, "tool_calls", None)],
                    "history": len(history)}
        out = durable_invoke(graph, {"messages": [HumanMessage(f"deploy with key {key()}")], "api_key": key()}, config)
        return {"done": True, "last": str(out["messages"][-1].content)}


# -- CrewAI ------------------------------------------------------------------------------------


def crewai() -> dict[str, Any]:
    from crewai.flow.flow import Flow, listen, start
    from crewai.flow.persistence import persist
    from pydantic import BaseModel

    from persistkit_crewai import PersistkitFlowPersistence

    store = pk.connect(URL)
    persistence = PersistkitFlowPersistence(store)

    class Deploy(BaseModel):
        id: str = ""
        api_key: str = ""
        body: str = ""

    @persist(persistence)
    class DeployFlow(Flow[Deploy]):
        _skip_auto_memory: ClassVar[bool] = True

        @start()
        def begin(self) -> None:
            self.state.api_key = key()  # the key enters the flow's state from the environment
            log("begin", self.state.api_key)

        @listen(begin)
        def draft(self) -> None:
            self.state.body = body_for(self.state.api_key)
            log("draft", self.state.api_key)

        @listen(draft)
        def send(self) -> None:
            log("send", self.state.body, self.state.api_key)

    if INSPECT:
        shown = persistence.inspect_state(THREAD, model=Deploy)  # a new process names the model
        assert shown is not None
        return {"api_key": shown["api_key"], "texts": [shown["body"]], "methods": persistence.completed_methods(THREAD)}
    flow = DeployFlow(suppress_flow_events=True)
    persistence.restore(flow, THREAD)  # False on the first run
    flow.kickoff(inputs={"id": THREAD})
    return {"done": True, "last": flow.state.body}


# -- OpenAI Agents SDK ---------------------------------------------------------------------------


def openai() -> dict[str, Any]:
    os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-offline")
    import agents
    from agents import Agent, Model, ModelResponse, Usage, function_tool
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from persistkit_openai_agents import SESSION_NAMESPACE, PersistkitSession, durable_run

    agents.set_tracing_disabled(True)

    class Offline(Model):
        """Turn 1 calls ``send`` with the key inside the email body; turn 2 answers."""

        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
            texts = [json.dumps(input, default=str)]
            done = "function_call_output" in texts[0]
            log("model2" if done else "model", *texts)
            output: list[Any]
            if not done:
                output = [ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1", name="send",
                                                   arguments=json.dumps({"body": body_for(key())}))]
            else:
                output = [ResponseOutputMessage(type="message", id="msg_2", role="assistant", status="completed",
                                                content=[ResponseOutputText(type="output_text", text="sent it", annotations=[])])]
            return ModelResponse(output=output, usage=Usage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def send(body: str) -> str:
        """Send an email to ops."""
        log("send", body)
        return f"sent: {body}"

    agent = Agent(name="ops", instructions="Send the deploy key.", model=Offline(), tools=[send])
    with pk.connect(URL) as store:
        if INSPECT:
            state = store.get_state(THREAD + "-session", namespace=SESSION_NAMESPACE)
            return {"texts": [json.dumps(state["items"], default=str)], "history": len(store.history(THREAD))}
        session = PersistkitSession(THREAD + "-session", store)
        result = asyncio.run(durable_run(agent, "send ops the deploy key", thread_id=THREAD, store=store, session=session))
    return {"done": True, "last": str(result.final_output)}


def main() -> None:
    try:
        result = {"langgraph": langgraph, "crewai": crewai, "openai": openai}[FRAMEWORK]()
    except Exception as exc:
        cause: BaseException | None = exc
        # LangGraph and CrewAI may wrap it; durable_run raises it as itself (it unwraps the
        # SDK's UserError around a refused tool call), as the OpenAI Agents page promises.
        while FRAMEWORK != "openai" and cause is not None and not isinstance(cause, pk.PersistkitError):
            cause = cause.__cause__
        if not isinstance(cause, pk.PersistkitError):
            cause = None
        if cause is None:
            raise
        result = {"error": type(cause).__name__, "message": str(cause)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
