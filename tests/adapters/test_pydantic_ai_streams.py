"""``PersistkitDurability(stream=)`` / ``durable_run(..., stream=)``: a durable agent's events
go into a persistkit stream from inside the steps that produce them
(docs/adapters-pydantic-ai.md, Streaming). Offline: Pydantic AI's ``FunctionModel`` with a
stream function; no network."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed")

from conftest import make_url, uid
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from stream_checks import check_offsets, final, records, rewinds, shown

import persistkit as pk
from persistkit_pydantic_ai import PersistkitDurability, durable_run

TOKENS = ["Durable ", "answers ", "survive ", "a ", "crash."]
TOOL_CALL = {"type": "tool_call", "name": "work", "call_id": "call_1", "args": '{"n": 1}'}
TOOL_OUTPUT = {"type": "tool_output", "name": "work", "call_id": "call_1", "output": "work 1 ok"}
EXPECTED = [TOOL_CALL, TOOL_OUTPUT, *({"type": "text", "delta": t} for t in TOKENS)]


class Script:
    """A model that calls ``work(n=1)``, then streams ``TOKENS``; ``fail_at``: its answer's
    stream breaks after that many tokens, once."""

    def __init__(self, fail_at: int = -1) -> None:
        self.fail_at = fail_at
        self.tools: list[int] = []

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> Any:
        if not any(
            isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])
        ):
            yield {0: DeltaToolCall(name="work", json_args='{"n": 1}', tool_call_id="call_1")}
            return
        for i, token in enumerate(TOKENS):
            if i == self.fail_at:
                self.fail_at = -1
                raise RuntimeError("the model's connection dropped mid-answer")
            yield token

    def agent(self, **capability: Any) -> Agent[None, str]:
        agent = Agent(
            FunctionModel(stream_function=self.stream),
            name="writer",
            capabilities=[PersistkitDurability(**capability)],
        )

        @agent.tool_plain
        def work(n: int) -> str:
            self.tools.append(n)
            return f"work {n} ok"

        return agent


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def test_durable_run_forwards_the_agents_events_in_order(url: str) -> None:
    script, thread = Script(), uid("pai-stream")
    with pk.connect(url) as store:
        result = asyncio.run(
            durable_run(script.agent(), "hi", thread_id=thread, store=store, stream="answer")
        )
        assert result is not None and result.output == "".join(TOKENS)
        recs = records(store, thread)
        check_offsets(recs)
        assert [r.data for r in recs if r.kind == "event"] == EXPECTED
        assert not rewinds(recs) and recs[-1].kind == "end"
        assert final(store, thread) == EXPECTED
        # each emitted inside a step: the deltas inside the answer's model request
        assert all(r.step for r in recs if r.kind == "event")


def test_the_capabilitys_stream_in_your_own_block_and_your_handler_still_sees_every_event(
    url: str,
) -> None:
    script, thread, seen = Script(), uid("pai-stream"), []

    async def mine(ctx: Any, events: Any) -> None:
        async for ev in events:
            seen.append(type(ev).__name__)

    async def scenario(store: pk.Store) -> None:
        agent = script.agent(stream="tokens", event_stream_handler=mine)
        async with pk.resume(thread, store=store):
            result = await agent.run("hi")
        assert result.output == "".join(TOKENS)

    with pk.connect(url) as store:
        asyncio.run(scenario(store))
        assert [r.data for r in records(store, thread, "tokens") if r.kind == "event"] == EXPECTED
        assert "FunctionToolCallEvent" in seen and "PartDeltaEvent" in seen
        # outside a run the capability is transparent: nothing is emitted (there is no thread)
        assert asyncio.run(outside(script.agent(stream="tokens"))) == "".join(TOKENS)


async def outside(agent: Agent[None, str]) -> str:
    async with agent.run_stream("hi") as result:
        return await result.get_output()


def test_a_request_that_fails_mid_answer_is_rewound_and_its_rerun_streams_once(url: str) -> None:
    script, thread = Script(fail_at=2), uid("pai-stream")
    with pk.connect(url) as store:
        with pytest.raises(RuntimeError, match="dropped mid-answer"):
            asyncio.run(
                durable_run(
                    script.agent(),
                    "hi",
                    thread_id=thread,
                    store=store,
                    run_id="m-1",
                    stream="answer",
                )
            )
        partial = [r.data for r in records(store, thread) if r.kind == "event"]
        assert partial == EXPECTED[:4]  # the tool call and output, two deltas
        result = asyncio.run(
            durable_run(
                script.agent(), "hi", thread_id=thread, store=store, run_id="m-1", stream="answer"
            )
        )
        assert result is not None and result.output == "".join(TOKENS)
        assert script.tools == [1]  # the tool's step committed: not run again, nor emitted again
        recs = records(store, thread)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        assert [r.data for r in recs if r.kind == "event" and r.offset <= (rewind.to or 0)] == [
            TOOL_CALL,
            TOOL_OUTPUT,
        ]
        assert shown(recs) == EXPECTED
        assert final(store, thread) == EXPECTED


def test_a_bad_stream_name_is_refused_before_the_run(url: str) -> None:
    with pytest.raises(pk.ConfigurationError, match="stream name"):
        PersistkitDurability(stream="a/b")
    with pk.connect(url) as store, pytest.raises(pk.ConfigurationError, match="stream name"):
        asyncio.run(
            durable_run(Script().agent(), "hi", thread_id=uid("pai"), store=store, stream="")
        )


@pytest.mark.slow
# one store per framework, dealt over SQLite and PostgreSQL across the four adapters (#35):
# the stream's rewind across a crash is checked on every store by the stream conformance suite
@pytest.mark.parametrize("kind", ["postgres"])
def test_a_worker_sigkilled_mid_answer_is_rewound_and_the_next_worker_streams_the_answer(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("pydantic_ai_stream_worker.py")
    paths = [str(Path(__file__).parents[2] / "adapters"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    url, thread = make_url(kind, request, tmp_path_factory), uid("pai-kill")

    def worker_run(kill_at: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(worker), url, thread, "m-1", str(kill_at)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    first = worker_run(3)  # dies once three of the answer's tokens are in the store
    assert first.returncode == -signal.SIGKILL, first.stderr
    with pk.connect(url) as store:
        died = records(store, thread)
        assert [r.data for r in died if r.kind == "event"][:2] == [TOOL_CALL, TOOL_OUTPUT]
        assert sum(1 for r in died if r.kind == "event" and r.data["type"] == "text") == 3
    second = worker_run(-1)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "".join(TOKENS)
    with pk.connect(url) as store:
        recs = records(store, thread)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        assert rewind.offset == len(died) + 1
        assert shown(recs) == EXPECTED
        assert final(store, thread) == EXPECTED
