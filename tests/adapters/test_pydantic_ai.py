"""Pydantic AI on persistkit: the scenarios of Pydantic AI's own ``tests/test_dbos.py``
(``DBOSDurability``) ported to ``PersistkitDurability`` on SQLite and PostgreSQL, offline
with ``TestModel`` / ``FunctionModel``.

Ported: a simple and a complex agent run in and outside a durable run; sequential and
parallel tools; ``run``, ``run_sync``, ``run_stream``, ``run_stream_events``, ``iter``;
an event stream handler; several agents in one run and an agent calling another from a
tool; dependency, tool and model overrides; deferred tools (approval required) suspended
and answered from another process; plus what DBOS does not have: conversation memory
(``durable_run``) and a replay of every step from the store.

Not applicable, and why:

* MCP tools: the pinned release's ``MCPToolset`` needs ``fastmcp``, whose 4.x needs
  ``mcp>=2``, while ``crewai`` (same environment) pins ``mcp<2``. They are ported in
  ``test_pydantic_ai_mcp.py``, which runs them in subprocesses under a separate
  ``pip install --target`` directory of fastmcp and mcp>=2 (``python3 dev.py test`` makes it).
* Recorded VCR cassettes and ``OpenAIChatModel``: the tests run offline with
  ``TestModel`` / ``FunctionModel`` instead (the cassettes need network-shaped models).
* DBOS-specific cases: ``DBOSAgent`` (the deprecated wrapper), legacy workflows,
  child workflows, step configs, ``DBOS.reserve_step``, workflow cancellation,
  enqueue guards: persistkit has no counterpart (a step is a step; no registration).
* Realtime sessions: make no model requests to record (as for DBOS).
* Runtime MCP / dynamic toolsets passed to ``agent.run(toolsets=...)`` inside a run are
  refused, as DBOS refuses them (``unsupported_runtime_toolset_kinds``).
"""

from __future__ import annotations

import asyncio
import json
import pickle
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim is not installed")

from conftest import make_url, uid
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.exceptions import CallDeferred, UserError
from pydantic_ai.messages import (
    AgentStreamEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

import persistkit as pk
from persistkit_pydantic_ai import (
    MESSAGES_CHANNEL,
    DeferredAnswerError,
    PersistkitDurability,
    deferred_results,
    durable_run,
    pending_requests,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = pk.connect(make_url(request.param, request, tmp_path_factory, isolated=True))
    yield s
    s.close()


class Calls(Counter[str]):
    """What really ran: model requests and tool bodies, by name."""


def _plan(messages: list[ModelMessage], parallel: bool) -> list[Any]:
    """Ask for ``get_country`` and ``get_weather`` (together, or one after the other), then
    answer with what they returned."""
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        first = [ToolCallPart("get_country", {}, tool_call_id="c1")]
        weather = [ToolCallPart("get_weather", {"city": "Mexico City"}, tool_call_id="c2")]
        return first + weather if parallel else first
    if not parallel and len(returns) == 1:
        return [ToolCallPart("get_weather", {"city": returns[0].content}, tool_call_id="c2")]
    return [TextPart(" | ".join(str(r.content) for r in returns))]


def tool_agent(
    calls: Calls, name: str = "complex", *, parallel: bool = True, **kwargs: Any
) -> Agent[None, str]:
    """An agent with two tools whose model (requests and streams) follows ``_plan``."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls["model"] += 1
        return ModelResponse(parts=_plan(messages, parallel))

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        calls["model"] += 1
        for i, part in enumerate(_plan(messages, parallel)):
            if isinstance(part, TextPart):
                yield part.content
            else:
                yield {
                    i: DeltaToolCall(
                        part.tool_name, json.dumps(part.args), tool_call_id=part.tool_call_id
                    )
                }

    kwargs.setdefault("capabilities", [PersistkitDurability()])
    agent = Agent(FunctionModel(model, stream_function=stream), name=name, **kwargs)

    @agent.tool_plain
    async def get_country() -> str:
        calls["get_country"] += 1
        await asyncio.sleep(0.02)  # finishes after get_weather when they run in parallel
        return "Mexico City"

    @agent.tool_plain
    async def get_weather(city: str) -> str:
        calls["get_weather"] += 1
        return f"sunny in {city}"

    return agent


def steps(store: Any, thread: str) -> list[str]:
    return [cp.step for cp in reversed(store.history(thread)) if cp.kind == "step"]


# -- simple and complex agents, in and outside a run ---------------------------------------


@pytest.mark.asyncio
async def test_simple_agent_outside_a_run_writes_nothing(store: Any) -> None:
    agent = Agent(
        TestModel(custom_output_text="plain"), name="simple", capabilities=[PersistkitDurability()]
    )
    assert (await agent.run("hi")).output == "plain"
    assert list(store.threads()) == []


def test_simple_agent_run_sync_outside_a_run_writes_nothing(store: Any) -> None:
    agent = Agent(
        TestModel(custom_output_text="plain"), name="simple", capabilities=[PersistkitDurability()]
    )
    assert agent.run_sync("hi").output == "plain"
    assert list(store.threads()) == []


@pytest.mark.asyncio
async def test_simple_agent_in_a_run_is_one_step(store: Any) -> None:
    agent = Agent(
        TestModel(custom_output_text="durable"),
        name="simple",
        capabilities=[PersistkitDurability()],
    )
    thread = uid("simple")
    async with pk.resume(thread, store=store) as run:
        assert (await agent.run("hi")).output == "durable"
    assert run.status == "completed"
    assert steps(store, thread) == ["simple__model.request"]


@pk.checkpointed(name="pydantic-ai-test.earlier")
def earlier_turn_step() -> str:
    return "done"


@pytest.mark.asyncio
async def test_a_turn_behind_an_unfinished_one_gives_its_worker_back_after_unfinished_timeout(tmp_path: Path) -> None:
    """``durable_run(unfinished_timeout=)`` reaches ``pk.resume``: past it the turn raises
    ThreadBusyError with ``retry_after`` before calling the model."""
    calls: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append("model")
        return ModelResponse(parts=[TextPart("answered")])

    agent = Agent(FunctionModel(model), name="turns", capabilities=[PersistkitDurability()])
    store, thread = pk.connect(f"sqlite:///{tmp_path}/pai.db"), uid("pai-turns")
    with pytest.raises(pk.BackendUnavailableError), pk.resume(thread, store=store, run_id="m0"):
        earlier_turn_step()
        raise pk.BackendUnavailableError("the store went away (simulated)")  # m0 stays unfinished
    with pytest.raises(pk.ThreadBusyError) as gave:
        await durable_run(agent, "hi", thread_id=thread, store=store, run_id="m1", unfinished_timeout=0)
    assert gave.value.unfinished_run == "m0" and gave.value.retry_after is not None
    assert calls == []  # it gave its place back before the model
    with pk.resume(thread, store=store, run_id="m0"):  # m0's redelivery goes first
        earlier_turn_step()
    result = await durable_run(agent, "hi", thread_id=thread, store=store, run_id="m1", unfinished_timeout=0)
    assert result is not None and result.output == "answered" and calls == ["model"]
    store.close()


@pytest.mark.asyncio
async def test_concurrency_reaches_resume_two_turns_of_one_key_never_overlap() -> None:
    """``durable_run(concurrency=)`` reaches ``pk.resume``: two turns of two threads under one
    key with limit 1 run one after the other (their model calls sleep, so without the slot they
    overlap), and the key's slot is free afterwards."""
    running, peak = 0, 0

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return ModelResponse(parts=[TextPart("answered")])

    agent = Agent(FunctionModel(model), name="slots", capabilities=[PersistkitDurability()])
    store, key = pk.connect(f"memory://{uid('pai-slot')}"), uid("tenant")
    results = await asyncio.gather(*(
        durable_run(agent, "hi", thread_id=uid(f"pai-slot-{i}"), store=store, run_id="m1",
                    concurrency=("tenant", key, 1))
        for i in range(2)
    ))
    assert [r.output for r in results if r is not None] == ["answered", "answered"]
    assert peak == 1
    info = pk.Concurrency("tenant", key, 1).info(store)
    assert info is not None and info.holders == () and info.waiting == ()
    store.close()


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
@pytest.mark.asyncio
async def test_complex_agent_replays_every_step_without_running_it(
    store: Any, parallel: bool
) -> None:
    calls = Calls()
    agent = tool_agent(calls, parallel=parallel)
    thread = uid("complex")
    async with pk.resume(thread, store=store) as run:
        first = await agent.run("weather?")
    assert first.output == "Mexico City | sunny in Mexico City"
    assert calls == {"model": 3 - parallel, "get_country": 1, "get_weather": 1}
    names = steps(store, thread)
    assert names.count("complex__function_toolset__<agent>.call_tool:get_country") == 1
    assert names.count("complex__function_toolset__<agent>.call_tool:get_weather") == 1
    # The same run again (a redelivery): everything replays from the store.
    async with pk.resume(thread, store=store, run_id=run.run_id):
        again = await agent.run("weather?")
    assert again.output == first.output
    assert calls == {"model": 3 - parallel, "get_country": 1, "get_weather": 1}
    assert [type(m).__name__ for m in again.all_messages()] == [
        type(m).__name__ for m in first.all_messages()
    ]


@pytest.mark.asyncio
async def test_a_changed_prompt_on_replay_is_a_nondeterminism_error(store: Any) -> None:
    calls = Calls()
    agent = tool_agent(calls)
    thread = uid("changed")
    async with pk.resume(thread, store=store) as run:
        await agent.run("weather?")
    with pytest.raises(pk.NonDeterminismError, match="recorded for"):
        async with pk.resume(thread, store=store, run_id=run.run_id):
            await agent.run("something else")


def test_run_sync_in_a_run(store: Any) -> None:
    calls = Calls()
    agent = tool_agent(calls, "sync")
    thread = uid("sync")
    with pk.resume(thread, store=store) as run:
        assert agent.run_sync("weather?").output == "Mexico City | sunny in Mexico City"
    with pk.resume(thread, store=store, run_id=run.run_id):
        assert agent.run_sync("weather?").output == "Mexico City | sunny in Mexico City"
    assert calls == {"model": 2, "get_country": 1, "get_weather": 1}


# -- streaming, iter, event stream handlers --------------------------------------------------


@pytest.mark.asyncio
async def test_run_stream_in_a_run_replays(store: Any) -> None:
    calls = Calls()
    agent = tool_agent(calls, "stream")
    thread = uid("stream")
    async with pk.resume(thread, store=store) as run, agent.run_stream("weather?") as result:
        text = await result.get_output()
    assert text == "Mexico City | sunny in Mexico City"
    async with (
        pk.resume(thread, store=store, run_id=run.run_id),
        agent.run_stream("weather?") as result,
    ):
        assert await result.get_output() == text
    assert calls == {"model": 2, "get_country": 1, "get_weather": 1}
    assert "stream__model.request_stream" in steps(store, thread)


@pytest.mark.asyncio
async def test_run_stream_events_and_iter_in_a_run(store: Any) -> None:
    calls = Calls()
    agent = tool_agent(calls, "iter")
    thread = uid("iter")
    async with pk.resume(thread, store=store) as run:
        async with agent.run_stream_events("weather?") as stream:
            events = [e async for e in stream]
        async with agent.iter("weather?") as agent_run:
            nodes = [type(n).__name__ async for n in agent_run]
        assert agent_run.result is not None
        output = agent_run.result.output
    assert output == "Mexico City | sunny in Mexico City"
    assert "CallToolsNode" in nodes and "End" in nodes
    assert sum(isinstance(e, FunctionToolResultEvent) for e in events) == 2
    assert calls == {"model": 4, "get_country": 2, "get_weather": 2}  # two agent runs, each once
    async with pk.resume(thread, store=store, run_id=run.run_id):
        async with agent.run_stream_events("weather?") as stream:
            replayed = [e async for e in stream]
        async with agent.iter("weather?") as agent_run:
            async for _ in agent_run:
                pass
    assert calls == {"model": 4, "get_country": 2, "get_weather": 2}
    assert [type(e).__name__ for e in replayed] == [type(e).__name__ for e in events]


@pytest.mark.asyncio
async def test_event_stream_handler_tool_events_are_steps(store: Any) -> None:
    seen: list[str] = []

    async def handler(ctx: RunContext[Any], stream: Any) -> None:
        async for event in stream:
            if isinstance(event, FunctionToolCallEvent | FunctionToolResultEvent):
                seen.append(type(event).__name__)

    calls = Calls()
    agent = tool_agent(
        calls, "events", capabilities=[PersistkitDurability(event_stream_handler=handler)]
    )
    thread = uid("events")
    async with pk.resume(thread, store=store) as run:
        await agent.run("weather?")
    assert sorted(seen) == ["FunctionToolCallEvent"] * 2 + ["FunctionToolResultEvent"] * 2
    assert steps(store, thread).count("events__event_stream_handler") == 4
    async with pk.resume(thread, store=store, run_id=run.run_id):
        await agent.run("weather?")
    assert len(seen) == 4  # the handler's recorded calls are not made again
    # Outside a run the handler is called live, as without the capability.
    await agent.run("weather?")
    assert len(seen) == 8


@pytest.mark.asyncio
async def test_an_unrecorded_event_stream_handler_passed_to_run_outside_a_run(store: Any) -> None:
    got: list[AgentStreamEvent] = []

    async def handler(ctx: RunContext[Any], stream: Any) -> None:
        got.extend([e async for e in stream])

    agent = tool_agent(Calls(), "runtime_handler")
    await agent.run("weather?", event_stream_handler=handler)
    assert any(isinstance(e, FunctionToolResultEvent) for e in got)


# -- several agents, overrides -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_several_agents_and_an_agent_called_from_a_tool(store: Any) -> None:
    calls = Calls()
    inner = tool_agent(calls, "inner")
    outer_calls = Calls()

    def outer_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        outer_calls["model"] += 1
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(
                parts=[ToolCallPart("delegate", {"q": "weather?"}, tool_call_id="d1")]
            )
        return ModelResponse(parts=[TextPart("outer done")])

    outer = Agent(FunctionModel(outer_model), name="outer", capabilities=[PersistkitDurability()])

    @outer.tool_plain
    async def delegate(q: str) -> str:
        return (await inner.run(q)).output

    thread = uid("agents")
    async with pk.resume(thread, store=store) as run:
        a = await inner.run("weather?")
        b = await outer.run("go")
    assert (a.output, b.output) == ("Mexico City | sunny in Mexico City", "outer done")
    async with pk.resume(thread, store=store, run_id=run.run_id):
        await inner.run("weather?")
        await outer.run("go")
    assert calls == {"model": 4, "get_country": 2, "get_weather": 2}
    assert outer_calls == {"model": 2}
    # Each agent run has its own stable run id inside the persistkit run.
    assert a.run_id == f"{run.run_id}:0" and b.run_id == f"{run.run_id}:1"


@dataclass
class Deps:
    user: str


@pytest.mark.asyncio
async def test_dependency_tool_and_model_overrides_in_a_run(store: Any) -> None:
    other = TestModel(custom_output_text="overridden")
    durability = PersistkitDurability[Deps](models={"other": other})  # as for DBOS: registered
    agent = Agent(TestModel(), name="deps", deps_type=Deps, capabilities=[durability])

    @agent.tool
    def whoami(ctx: RunContext[Deps]) -> str:
        return ctx.deps.user

    thread = uid("deps")
    async with pk.resume(thread, store=store):
        assert (await agent.run("who", deps=Deps("ada"))).output == '{"whoami":"ada"}'
        with agent.override(deps=Deps("grace")):
            assert (await agent.run("who", deps=Deps("ada"))).output == '{"whoami":"grace"}'

        def shout() -> str:
            return "LOUD"

        # Unlike DBOS (which leaves function tools unwrapped), every function tool is a step:
        # tools swapped in at run time would run unrecorded, so they are refused in a run.
        with (
            pytest.raises(UserError, match="registered for durable execution"),
            agent.override(tools=[shout]),
        ):
            await agent.run("who", deps=Deps("ada"))
        with pytest.raises(UserError, match="registered for durable execution"):
            await agent.run(
                "who", deps=Deps("ada"), toolsets=[FunctionToolset([shout], id="extra")]
            )
    with agent.override(tools=[shout]):  # outside a run: as without the capability
        assert (await agent.run("who", deps=Deps("ada"))).output == '{"shout":"LOUD"}'
    async with pk.resume(thread, store=store):
        with agent.override(model=other):
            assert (await agent.run("who", deps=Deps("ada"))).output == "overridden"
        with pytest.raises(UserError, match="not registered"), agent.override(model=TestModel()):
            await agent.run("who", deps=Deps("ada"))


# -- deferred tools: suspended, answered from another process ---------------------------------


def approval_agent(
    calls: Calls, durability: PersistkitDurability[None] | None = None, *, external: bool = False
) -> Agent[None, Any]:
    """Asks for ``lookup`` (runs), ``refund`` (needs approval) and, with ``external``, ``ship``
    (its result is supplied from outside: ``CallDeferred``); then answers with what came back."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls["model"] += 1
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            ship = [ToolCallPart("ship", {"to": "Oslo"}, tool_call_id="s1")] if external else []
            return ModelResponse(
                parts=[
                    ToolCallPart("lookup", {"q": "order 7"}, tool_call_id="l1"),
                    ToolCallPart("refund", {"amount": 120}, tool_call_id="r1"),
                    *ship,
                ]
            )
        return ModelResponse(parts=[TextPart(" / ".join(str(r.content) for r in returns))])

    agent = Agent(
        FunctionModel(model),
        name="hitl",
        output_type=[str, DeferredToolRequests],
        capabilities=[durability or PersistkitDurability()],
    )

    @agent.tool_plain
    def lookup(q: str) -> str:
        calls["lookup"] += 1
        return f"found {q}"

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        calls["refund"] += 1
        return f"refunded {amount}"

    @agent.tool_plain
    def ship(to: str) -> str:
        calls["ship"] += 1
        raise CallDeferred()

    return agent


# The answering process does not import the adapter: it allows its module instead.
ANSWER = """
import json, sys, persistkit as pk
store = pk.connect(sys.argv[1], allow_modules=["persistkit_pydantic_ai"])
try:
    store.answer(sys.argv[2], json.loads(sys.argv[3]))
except pk.PersistkitError as exc:
    print(type(exc).__name__, exc)
store.close()
"""


def answer_elsewhere(store: Any, thread: str, value: Any) -> str:
    done = subprocess.run(
        [sys.executable, "-c", ANSWER, store.url, thread, json.dumps(value)],
        check=True,
        cwd=ROOT,
        timeout=120,
        capture_output=True,
        text=True,
    )
    return done.stdout


async def suspended_turn(agent: Agent[None, Any], store: Any, thread: str) -> DeferredToolRequests:
    assert await durable_run(agent, "refund", thread_id=thread, store=store, run_id="m1") is None
    [question] = [q for q in store.pending() if q.thread_id == thread]
    requests = pending_requests(question)
    assert requests is not None
    return requests


@pytest.mark.asyncio
async def test_deferred_tool_suspends_and_an_answer_from_another_process_resumes(
    store: Any,
) -> None:
    calls = Calls()
    agent = approval_agent(calls)
    thread = uid("hitl")
    requests = await suspended_turn(agent, store, thread)
    assert [c.tool_name for c in requests.approvals] == ["refund"]
    assert calls == {"model": 1, "lookup": 1}
    out = answer_elsewhere(store, thread, {"approvals": {"nope": True}})
    assert out.startswith("DeferredAnswerError") and "'r1' (refund)" in out and "'nope'" in out
    assert answer_elsewhere(store, thread, {"approvals": {"r1": True}}) == ""
    result = await durable_run(agent, "refund", thread_id=thread, store=store, run_id="m1")
    assert result is not None and result.output == "found order 7 / refunded 120"
    assert calls == {"model": 2, "lookup": 1, "refund": 1}  # nothing before the question ran again
    state = store.get_state(thread, plain=True)
    assert len(state[MESSAGES_CHANNEL]) == len(result.new_messages())


#: Answers to ``refund`` (approval, r1) + ``ship`` (external, s1) that store.answer refuses,
#: and what the error must say.
BAD_ANSWERS = [
    ({"approvals": {"nope": True}, "calls": {"s1": "x"}}, [r"'r1' \(refund\)", r"\['nope'\]"]),
    ({"foo": 1}, [r"keys \['foo'\]"]),
    (
        {"approvals": {}, "calls": {}},
        [r"'r1' \(refund\) in 'approvals'", r"'s1' \(ship\) in 'calls'"],
    ),
    ({"approvals": {"r1": True}}, [r"'s1' \(ship\) in 'calls'"]),
    (
        {"approvals": {"r1": True, "s1": True}, "calls": {}},
        [r"\['s1'\] in 'approvals', but they belong in 'calls'"],
    ),
    (
        {"approvals": {"r1": True}, "calls": {"s1": 1, "zz": 2}},
        [r"\['zz'\] in 'calls' that are not pending"],
    ),
    (
        {"approvals": {"r1": True}, "calls": {"s1": 1}, "metadata": {"q": {}}},
        [r"\['q'\] in 'metadata'"],
    ),
    ("yes", ["got str"]),
    ({"approvals": "yes please"}, ["approvals .*valid dictionary"]),
    (
        {"approvals": {"r1": "maybe"}, "calls": {"s1": 1}},
        [r"approvals\['r1'\] must be True, False"],
    ),
    ({"approvals": {"r1": 1}, "calls": {"s1": 1}}, [r"approvals\['r1'\].*\(got 1\)"]),
    (
        {"approvals": {"r1": {"kind": "tool-denied", "message": 5}}, "calls": {"s1": 1}},
        ["tool-denied.message"],
    ),
    ({"approvals": {"r1": {"kind": "tool-maybe"}}, "calls": {"s1": 1}}, ["tool-maybe"]),
]


@pytest.mark.asyncio
async def test_a_bad_answer_is_refused_by_answer_and_the_question_stays_open(store: Any) -> None:
    calls = Calls()
    agent = approval_agent(calls, external=True)
    thread = uid("hitl-bad")
    requests = await suspended_turn(agent, store, thread)
    assert [c.tool_call_id for c in requests.approvals] == ["r1"]
    assert [c.tool_call_id for c in requests.calls] == ["s1"]
    [question] = [q for q in store.pending() if q.thread_id == thread]
    for value, says in BAD_ANSWERS:
        with pytest.raises(DeferredAnswerError) as bad:
            store.answer(thread, value)
        assert isinstance(bad.value, pk.AnswerError)
        assert (bad.value.thread_id, bad.value.question) == (thread, question.question_id)
        for pattern in [*says, "Nothing was stored; the question is still open"]:
            assert re.search(pattern, str(bad.value)), (value, pattern, str(bad.value))
        assert pickle.loads(pickle.dumps(bad.value)).question == question.question_id
    assert [q.question_id for q in store.pending() if q.thread_id == thread] == [
        question.question_id
    ]
    assert calls == {"model": 1, "lookup": 1, "ship": 1}
    store.answer(thread, {"approvals": {"r1": True}, "calls": {"s1": "shipped to Oslo"}})
    result = await durable_run(agent, "refund", thread_id=thread, store=store, run_id="m1")
    assert result is not None
    assert result.output == "found order 7 / refunded 120 / shipped to Oslo"
    assert calls == {"model": 2, "lookup": 1, "ship": 1, "refund": 1}


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"approvals": {"r1": False}}, "The tool call was denied."),
        ({"approvals": {"r1": {"kind": "tool-denied", "message": "no refunds"}}}, "no refunds"),
        (DeferredToolResults(approvals={"r1": ToolDenied("not today")}), "not today"),
        (
            DeferredToolResults(approvals={"r1": ToolApproved(override_args={"amount": 5})}),
            "refunded 5",
        ),
        ({"approvals": {"r1": {"kind": "tool-approved"}}}, "refunded 120"),
    ],
)
@pytest.mark.asyncio
async def test_denials_and_approval_objects_answer(store: Any, answer: Any, says: str) -> None:
    calls = Calls()
    agent = approval_agent(calls)
    thread = uid("hitl-deny")
    await suspended_turn(agent, store, thread)
    store.answer(thread, answer)
    result = await durable_run(agent, "refund", thread_id=thread, store=store, run_id="m1")
    assert result is not None and says in result.output
    assert calls["refund"] == ("refunded" in says)
    replayed = await durable_run(agent, "refund", thread_id=thread, store=store, run_id="m1")
    assert replayed is not None and replayed.output == result.output
    assert calls["model"] == 2


@pytest.mark.asyncio
async def test_an_answer_a_resume_refuses_keeps_the_run_suspended(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question asked without the answer type (by a release before the check) takes any
    answer; the resume refuses a bad one and asks again, saying why, instead of failing."""
    from persistkit_pydantic_ai import _durability

    calls = Calls()
    agent = approval_agent(calls)
    thread = uid("hitl-old")
    with monkeypatch.context() as m:
        m.setattr(_durability, "DeferredAnswer", None)
        await suspended_turn(agent, store, thread)
    [old] = [q for q in store.pending() if q.thread_id == thread]
    assert old.answer_type is None
    store.answer(thread, {"approvals": {}})  # not checked: the question has no answer type
    assert await durable_run(agent, "refund", thread_id=thread, store=store, run_id="m1") is None
    [again] = [q for q in store.pending() if q.thread_id == thread]
    assert again.question_id != old.question_id and again.answer_type is not None
    assert "'r1' (refund) in 'approvals'" in again.payload["rejected"]
    assert pending_requests(again) == pending_requests(old)
    with pytest.raises(DeferredAnswerError, match="nope"):
        store.answer(thread, {"approvals": {"nope": True}})
    store.answer(thread, {"approvals": {"r1": True}})
    result = await durable_run(agent, "refund", thread_id=thread, store=store, run_id="m1")
    assert result is not None and result.output == "found order 7 / refunded 120"
    assert calls == {"model": 2, "lookup": 1, "refund": 1}


@pytest.mark.asyncio
async def test_answering_needs_the_adapters_answer_type(store: Any) -> None:
    thread = uid("hitl-type")
    await suspended_turn(approval_agent(Calls()), store, thread)
    out = answer_elsewhere(store, thread, {"approvals": {"r1": True}}).strip()
    assert out == ""  # allow_modules=["persistkit_pydantic_ai"] resolves it
    script = ANSWER.replace(', allow_modules=["persistkit_pydantic_ai"]', "")
    other = uid("hitl-type2")
    await suspended_turn(approval_agent(Calls()), store, other)
    done = subprocess.run(
        [sys.executable, "-c", script, store.url, other, json.dumps({"approvals": {"r1": True}})],
        check=True,
        cwd=ROOT,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert done.stdout.startswith("ConfigurationError")
    assert "allow_modules=['persistkit_pydantic_ai']" in done.stdout
    assert [q.thread_id for q in store.pending() if q.thread_id == other] == [other]


def test_deferred_results_checks_against_the_requests() -> None:
    requests = DeferredToolRequests(
        approvals=[ToolCallPart("refund", {}, tool_call_id="r1")],
        calls=[ToolCallPart("ship", {}, tool_call_id="s1")],
    )
    ok = deferred_results({"approvals": {"r1": True}, "calls": {"s1": 3}}, requests)
    assert ok.approvals == {"r1": True} and ok.calls == {"s1": 3}
    with pytest.raises(DeferredAnswerError, match=r"'s1' \(ship\)"):
        deferred_results({"approvals": {"r1": True}}, requests)
    assert deferred_results({"approvals": {"x": True}}).approvals == {
        "x": True
    }  # no requests: types only


@pytest.mark.asyncio
async def test_suspend_deferred_off_returns_the_requests_as_output(store: Any) -> None:
    calls = Calls()
    quiet = approval_agent(calls, PersistkitDurability(suspend_deferred=False))
    async with pk.resume(uid("hitl-off"), store=store):
        result = await quiet.run("refund")
    assert isinstance(result.output, DeferredToolRequests)


# -- conversation memory ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_durable_run_keeps_the_conversation_as_appends(store: Any) -> None:
    seen: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(len(messages))
        return ModelResponse(parts=[TextPart(f"answer {len(messages)}")])

    agent = Agent(FunctionModel(model), name="chat", capabilities=[PersistkitDurability()])
    thread = uid("chat")
    for i in range(3):
        await durable_run(agent, f"turn {i}", thread_id=thread, store=store, run_id=f"t{i}")
    assert seen == [1, 3, 5]  # each turn saw the whole history before it
    assert len(store.get_state(thread, plain=True)[MESSAGES_CHANNEL]) == 6
    # A redelivered turn replays: no model request, the history is not appended twice.
    result = await durable_run(agent, "turn 1", thread_id=thread, store=store, run_id="t1")
    assert result is not None and result.output == "answer 3"
    assert seen == [1, 3, 5]
    assert len(store.get_state(thread, plain=True)[MESSAGES_CHANNEL]) == 6


@pytest.mark.asyncio
async def test_durable_run_refuses_a_message_history(store: Any) -> None:
    agent = Agent(TestModel(), name="chat", capabilities=[PersistkitDurability()])
    with pytest.raises(pk.ConfigurationError, match="message_history"):
        await durable_run(
            agent, "x", thread_id=uid("t"), store=store, message_history=[ModelResponse(parts=[])]
        )


def test_a_recorded_model_retry_replays_as_itself() -> None:
    """A tool's ModelRetry recorded as its step's error comes back as a ModelRetry in a
    resumed process (the agent loop catches it), not as pk.StepFailedError: the adapter
    registers the framework's exceptions (a class with its own constructor revives only
    when registered: docs/security.md)."""
    from pydantic_ai.exceptions import ModelRetry

    from persistkit.codec._serde import Serializer

    ser = Serializer()
    back = ser.decode_exception(ser.encode_exception(ModelRetry("ask again with a date")))
    assert type(back) is ModelRetry and back.message == "ask again with a date"
