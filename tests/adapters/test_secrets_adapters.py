"""Secrets planted through every adapter never reach storage, in any encoding.

Each test plants fresh keys of many formats (``planted.fresh_keys``) where a
framework's user would hold them — a user message, a model's tool-call
arguments, a tool's output, a plain state channel, run metadata — then reads
the raw bytes of the store back (SQLite file, PostgreSQL rows, Redis values,
S3 objects) and looks for each key as it is, base64 and hex.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import asyncio
import json
from typing import Annotated, Any, ClassVar, TypedDict

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("agents")
pytest.importorskip("crewai")

from agents import Agent, Model, ModelResponse, Usage, function_tool
from conftest import make_url, uid
from crewai import Agent as CrewAgent
from crewai import Crew, Process, Task
from crewai.flow.flow import Flow, listen, start
from crewai.flow.persistence import persist
from crewai.llms.base_llm import BaseLLM
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from planted import connect, fresh_keys, leaks, raw_bytes, text
from pydantic import BaseModel, SecretStr

import persistkit as pk
from persistkit_crewai import PersistkitFlowPersistence, durable_kickoff
from persistkit_langgraph import PersistkitSaver
from persistkit_openai_agents import PersistkitSession, durable_run

STORES = ["sqlite", "postgres", "redis", "s3"]


@pytest.fixture(params=STORES)
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


# -- LangGraph ------------------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: str
    settings: dict[str, Any]
    login: SecretStr | None


def test_langgraph_saver_stores_no_secret(url: str) -> None:
    keys = fresh_keys()
    said = text(keys)
    password = "no-known-format-" + uid("pw")  # marked by type only: no detector knows it

    def model(state: Chat) -> dict[str, Any]:
        call = {"name": "lookup", "args": {"token": keys["openai"], "query": said}, "id": "call-1"}
        return {"messages": [AIMessage(content=f"calling with {said}", tool_calls=[call])]}

    def tool(state: Chat) -> dict[str, Any]:
        return {"messages": [ToolMessage(content=f"tool output: {said}", tool_call_id="call-1")]}

    def remember(state: Chat) -> dict[str, Any]:
        settings = {"nested": [{kind: k} for kind, k in keys.items()], said: 1}
        return {"notes": said, "settings": settings, "login": SecretStr(password)}

    builder: StateGraph[Any] = StateGraph(Chat)
    for name, fn in (("model", model), ("tool", tool), ("remember", remember)):
        builder.add_node(name, fn)
    builder.add_edge(START, "model")
    builder.add_edge("model", "tool")
    builder.add_edge("tool", "remember")
    builder.add_edge("remember", END)
    config: Any = {"configurable": {"thread_id": uid("lg")}, "metadata": {"note": said}}
    first = {"messages": [HumanMessage(content=f"my keys: {said}")], "notes": "", "settings": {}, "login": None}
    for durability in ("sync", "async", "exit"):
        with PersistkitSaver(connect(url)) as saver:
            saver._owns_store = True
            graph = builder.compile(checkpointer=saver)
            out = graph.invoke(first, config, durability=durability)
            assert out["notes"] == said
            # Inspection shows handles (it never needs a value) ...
            shown = graph.get_state(config).values
            assert "$CRED{openai-" in shown["notes"] and keys["openai"] not in shown["notes"]
            # ... and resolving them in this process gives the values back.
            values = pk.secrets.resolve(dict(shown))
            assert values["notes"] == said and values["settings"]["nested"][0]["openai"] == keys["openai"]
            assert values["messages"][2].content == f"tool output: {said}"
            assert values["messages"][1].tool_calls[0]["args"]["token"] == keys["openai"]
            assert values["login"].get_secret_value() == password
        config = {**config, "configurable": {"thread_id": uid("lg")}}
    data = raw_bytes(url)
    assert b"$CRED{openai-" in data  # the store holds handles where the keys were
    assert leaks(data, {**keys, "SecretStr": password}) == []


# -- OpenAI Agents SDK ------------------------------------------------------------------------------


class LeakyModel(Model):
    """Turn 1 calls ``lookup`` with a key in its arguments; turn 2 answers with every key."""

    def __init__(self, keys: dict[str, str]) -> None:
        self.keys, self.said = keys, text(keys)

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        answered = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in input)
        output: list[Any]
        if not answered:
            arguments = json.dumps({"token": self.keys["openai"], "query": self.said})
            output = [ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1", name="lookup", arguments=arguments)]
        else:
            content = [ResponseOutputText(type="output_text", text=f"answer: {self.said}", annotations=[])]
            output = [ResponseOutputMessage(type="message", id="msg_1", role="assistant", status="completed", content=content)]
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_openai_agents_run_and_session_store_no_secret(url: str) -> None:
    keys = fresh_keys()
    said = text(keys)

    @function_tool
    def lookup(token: str, query: str) -> str:
        """Look something up."""
        return f"tool output: {said}"

    agent = Agent(name="leaky", instructions="help", model=LeakyModel(keys), tools=[lookup])
    thread = uid("oa")

    async def scenario() -> None:
        async with connect(url) as store:
            session = PersistkitSession(thread + "-session", store)
            for run_id in ("r1", "r1"):  # the second call replays the recorded run
                result = await durable_run(
                    agent, f"my keys: {said}", thread_id=thread, store=store, run_id=run_id, session=session
                )
                assert result.final_output == f"answer: {said}"
            items = await session.get_items()
            assert items[0]["content"] == f"my keys: {said}"  # read back in this process: resolved

    asyncio.run(scenario())
    data = raw_bytes(url)
    assert b"$CRED{openai-" in data
    assert leaks(data, keys) == []


# -- CrewAI -------------------------------------------------------------------------------------------


class EchoLLM(BaseLLM):
    """Answers every task with the keys."""

    said: str = ""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        return f"Thought: done\nFinal Answer: found {self.said}"

    def supports_function_calling(self) -> bool:
        return False


class Notes(BaseModel):
    id: str = ""
    notes: list[str] = []
    config: dict[str, str] = {}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_crewai_crew_and_flow_store_no_secret(url: str) -> None:
    keys = fresh_keys()
    said = text(keys)
    thread, flow_id = uid("crew"), uid("flow")
    with connect(url) as store:
        agent = CrewAgent(role="r", goal="g", backstory="b", llm=EchoLLM(model="fake", said=said))
        tasks = [
            Task(name=f"t{i}", description=f"part {i}: use {{topic}}", expected_output="text", agent=agent)
            for i in range(2)
        ]
        crew = Crew(agents=[agent], tasks=tasks, process=Process.sequential)
        out = durable_kickoff(crew, {"topic": said}, thread_id=thread, store=store)
        assert out.tasks_output[1].raw == f"found {said}"

        persistence = PersistkitFlowPersistence(store)

        @persist(persistence)
        class Remember(Flow[Notes]):
            _skip_auto_memory: ClassVar[bool] = True

            @start()
            def note(self) -> None:
                self.state.notes.append(said)

            @listen(note)
            def configure(self) -> None:
                self.state.config = dict(keys)

        flow = Remember(suppress_flow_events=True)
        flow.kickoff(inputs={"id": flow_id})
        assert persistence.load_state(flow_id)["notes"] == [said]  # type: ignore[index]
    data = raw_bytes(url)
    assert b"$CRED{openai-" in data
    assert leaks(data, keys) == []
