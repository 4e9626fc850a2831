"""``durable_kickoff(..., stream=)``: a durable crew's agent steps and task outputs go into a
persistkit stream from inside each task's step (docs/adapters-crewai.md, Streaming).
Offline: a deterministic ``BaseLLM`` speaking CrewAI's ReAct text format; no network."""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("crewai")

from conftest import make_url, uid
from crewai import Agent, Crew, Process, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import tool
from stream_checks import check_offsets, final, records, rewinds, shown

import persistkit as pk
from persistkit_crewai import adurable_kickoff, durable_kickoff

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai"),
    pytest.mark.filterwarnings("ignore:function callbacks cannot be serialized:UserWarning"),
]


class ScriptLLM(BaseLLM):
    """Each task calls the ``lookup`` tool once, then answers."""

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        name = from_task.name if from_task is not None else "?"
        if f"the {name} fact is 42" not in json.dumps(messages):
            return f'Thought: I need the {name} fact\nAction: lookup\nAction Input: {{"q": "{name} fact"}}'
        return f"Thought: done\nFinal Answer: ANSWER<{name}>"

    async def acall(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        return self.call(messages, from_task=from_task)

    def supports_function_calling(self) -> bool:
        return False


@tool("lookup")
def lookup(q: str) -> str:
    """Look a fact up."""
    return f"the {q} is 42"


def make_crew(fail: set[str], mine: list[str]) -> Crew:
    def step_callback(step: Any) -> None:  # the agent's own, inside the task's step: may fail once
        mine.append(type(step).__name__)
        fact = str(getattr(step, "tool_input", ""))
        for name in list(fail):
            if f"{name} fact" in fact:
                fail.discard(name)
                raise RuntimeError(f"worker lost during {name}")

    agent = Agent(
        role="writer",
        goal="write",
        backstory="offline",
        llm=ScriptLLM(model="fake"),
        tools=[lookup],
        max_retry_limit=0,
        step_callback=step_callback,
    )
    tasks = [
        Task(name=f"t{i}", description=f"part {i}", expected_output="text", agent=agent)
        for i in range(3)
    ]
    return Crew(agents=[agent], tasks=tasks, process=Process.sequential)


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def kinds(events: list[Any]) -> list[str]:
    return [
        f"{e['type']}:{e.get('task') or e.get('tool') or e.get('output', '')[:12]}" for e in events
    ]


#: per task: the tool's output, the step that called it (CrewAI's order), the task's output
EXPECTED = [
    k
    for i in range(3)
    for k in (f"tool_output:the t{i} fact ", "action:lookup", f"task_output:t{i}")
]


def test_a_kickoff_streams_its_agents_steps_and_task_outputs_in_order(url: str) -> None:
    thread, mine = uid("crew-stream"), []
    with pk.connect(url) as store:
        crew = make_crew(set(), mine)
        out = durable_kickoff(crew, thread_id=thread, store=store, stream="answer")
        assert out.raw == "ANSWER<t2>"
        recs = records(store, thread)
        check_offsets(recs)
        events = [r.data for r in recs if r.kind == "event"]
        assert kinds(events) == EXPECTED
        assert events[0] == {
            "type": "tool_output",
            "agent": "writer",
            "output": "the t0 fact is 42",
        }
        assert events[1]["tool_input"] == '{"q": "t0 fact"}' and events[1]["thought"].endswith(
            "I need the t0 fact"
        )
        assert events[2] == {"type": "task_output", "task": "t0", "output": "ANSWER<t0>"}
        assert not rewinds(recs) and kinds(final(store, thread)) == EXPECTED
        assert all(r.step for r in recs if r.kind == "event")  # inside the tasks' steps
        assert (
            mine == ["ToolResult", "AgentAction"] * 3
        )  # the agent's own step callback is still called
        assert all(
            a.step_callback is not None and not hasattr(a.step_callback, "_pk_stream")
            for a in crew.agents
        )


def test_a_task_that_dies_after_its_steps_is_rewound_and_its_rerun_streams_once(url: str) -> None:
    thread, mine = uid("crew-stream"), []
    with pk.connect(url) as store:
        fail = {"t1"}
        with pytest.raises(RuntimeError, match="worker lost during t1"):
            durable_kickoff(
                make_crew(fail, mine), thread_id=thread, store=store, run_id="m-1", stream="answer"
            )
        partial = [r.data for r in records(store, thread) if r.kind == "event"]
        assert (
            kinds(partial) == EXPECTED[:5]
        )  # t0 whole, t1's tool output and action (then its callback raised)
        durable_kickoff(
            make_crew(fail, mine), thread_id=thread, store=store, run_id="m-1", stream="answer"
        )
        recs = records(store, thread)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        assert (
            kinds([r.data for r in recs if r.kind == "event" and r.offset <= (rewind.to or 0)])
            == EXPECTED[:3]
        )
        assert (
            mine.count("AgentAction") == 4
        )  # t1's tool step replayed (not run again); its callback ran again
        assert kinds(shown(recs)) == EXPECTED
        assert kinds(final(store, thread)) == EXPECTED


def test_the_async_kickoff_streams_too(url: str) -> None:
    thread = uid("crew-stream")
    with pk.connect(url) as store:
        asyncio.run(
            adurable_kickoff(make_crew(set(), []), thread_id=thread, store=store, stream="answer")
        )
        assert kinds(final(store, thread)) == EXPECTED


def test_a_bad_stream_name_is_refused_before_the_kickoff(url: str) -> None:
    with pk.connect(url) as store, pytest.raises(pk.ConfigurationError, match="stream name"):
        durable_kickoff(make_crew(set(), []), thread_id=uid("crew"), store=store, stream="x" * 65)


@pytest.mark.slow
# one store per framework, dealt over SQLite and PostgreSQL across the four adapters (#35):
# the stream's rewind across a crash is checked on every store by the stream conformance suite
@pytest.mark.parametrize("kind", ["sqlite"])
def test_a_worker_sigkilled_mid_task_is_rewound_and_the_next_worker_streams_each_task_once(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("crewai_stream_worker.py")
    paths = [str(Path(__file__).parents[2] / "adapters"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    url, thread = make_url(kind, request, tmp_path_factory), uid("crew-kill")

    def worker_run(kill: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(worker), url, thread, "m-1", kill],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )

    first = worker_run("t1")  # dies in task t1, once its action is in the store
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    with pk.connect(url) as store:
        died = records(store, thread)
        assert kinds([r.data for r in died if r.kind == "event"]) == EXPECTED[:5]
    second = worker_run("-")
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip().endswith("ANSWER<t2>")
    with pk.connect(url) as store:
        recs = records(store, thread)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        assert rewind.offset == len(died) + 1  # right after what the dead worker wrote
        assert kinds(shown(recs)) == EXPECTED
        assert kinds(final(store, thread)) == EXPECTED
