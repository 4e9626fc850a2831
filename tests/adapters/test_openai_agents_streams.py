"""``durable_run(..., stream=...)``: a durable run's model turns stream into a persistkit
stream (docs/adapters-openai-agents.md, Streaming). Offline: ``StreamingModel`` yields the
Responses API events the SDK streams; no network."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed")

from conftest import make_url, uid
from openai_agents_stream_fake import ANSWER, TOKENS, StreamingModel, make_agent
from stream_checks import check_offsets, final, records, rewinds, shown

import persistkit as pk
from persistkit_openai_agents import durable_run

SCRIPT = Path(__file__).with_name("openai_agents_stream_fake.py")
ADAPTERS = str(Path(__file__).parents[2] / "adapters")
TOOL_CALL = {"type": "tool_call", "name": "work", "call_id": "call_1", "arguments": '{"n": 1}'}
TOOL_OUTPUT = {"type": "tool_output", "name": "work", "call_id": "call_1", "output": "work 1 ok"}
EXPECTED = [TOOL_CALL, TOOL_OUTPUT, *({"type": "text", "delta": t} for t in TOKENS)]


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def test_a_streamed_turn_forwards_the_models_events_in_order(url: str) -> None:
    thread, log = uid("oa-stream"), []
    with pk.connect(url) as store:
        result = asyncio.run(
            durable_run(
                make_agent(StreamingModel(), log),
                "hi",
                thread_id=thread,
                store=store,
                stream="answer",
            )
        )
        assert result.final_output == ANSWER and log == [1]
        recs = records(store, thread)
        check_offsets(recs)
        assert [r.data for r in recs if r.kind == "event"] == EXPECTED
        assert recs[-1].kind == "end" and not rewinds(recs)
        assert final(store, thread) == EXPECTED
        assert all(r.run_id == recs[0].run_id and r.attempt == 1 for r in recs)
        # the model turn emitted inside its step: the text deltas carry the second turn's position
        steps = {r.step for r in recs if r.kind == "event" and r.data["type"] == "text"}
        assert len(steps) == 1 and steps != {""}


def test_a_turn_that_fails_mid_answer_is_rewound_and_its_retry_streams_once(url: str) -> None:
    thread, log = uid("oa-stream"), []
    model = StreamingModel(fail_at=2)  # the answer's stream breaks after two deltas
    with pk.connect(url) as store:
        with pytest.raises(RuntimeError, match="dropped mid-answer"):
            asyncio.run(
                durable_run(
                    make_agent(model, log),
                    "hi",
                    thread_id=thread,
                    store=store,
                    run_id="m-1",
                    stream="answer",
                )
            )
        partial = records(store, thread)
        assert [
            r.data["delta"] for r in partial if r.kind == "event" and r.data["type"] == "text"
        ] == TOKENS[:2]
        result = asyncio.run(
            durable_run(
                make_agent(model, log),
                "hi",
                thread_id=thread,
                store=store,
                run_id="m-1",
                stream="answer",
            )
        )
        assert result.final_output == ANSWER
        assert log == [1]  # the tool's step committed: not run again
        recs = records(store, thread)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        # the rewind keeps the committed tool call and output, takes back the two deltas
        kept = [r for r in recs if r.kind == "event" and r.offset <= (rewind.to or 0)]
        assert [r.data for r in kept] == [TOOL_CALL, TOOL_OUTPUT]
        assert shown(recs) == EXPECTED  # the UI's view after the rewind: the uncrashed answer
        assert final(store, thread) == EXPECTED
        after = [r for r in recs if r.offset > rewind.offset and r.kind == "event"]
        assert all(r.attempt > 1 for r in after)


def _child(url: str, thread: str, run_id: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([ADAPTERS, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, str(SCRIPT), url, thread, run_id, str(kill_at)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.slow
# one store per framework, dealt over SQLite and PostgreSQL across the four adapters (#35):
# the stream's rewind across a crash is checked on every store by the stream conformance suite
@pytest.mark.parametrize("kind", ["sqlite"])
def test_a_worker_sigkilled_mid_answer_is_rewound_and_the_new_worker_streams_the_answer(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url, thread = make_url(kind, request, tmp_path_factory), uid("oa-kill")
    first = _child(url, thread, "m-1", 3)  # dies after three deltas reached the store
    assert first.returncode == -signal.SIGKILL, first.stderr
    with pk.connect(url) as store:
        died = records(store, thread)
        assert [
            r.data["delta"] for r in died if r.kind == "event" and r.data["type"] == "text"
        ] == TOKENS[:3]
        assert died[-1].kind == "event"  # no end: the worker died
    second = _child(url, thread, "m-1", -1)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["final_output"] == ANSWER
    with pk.connect(url) as store:
        recs = records(store, thread)
        check_offsets(recs)
        [rewind] = rewinds(recs)
        assert rewind.offset == len(died) + 1
        assert shown(recs) == EXPECTED
        assert final(store, thread) == EXPECTED


def test_a_bad_stream_name_is_refused_before_the_run(url: str) -> None:
    with pk.connect(url) as store, pytest.raises(pk.ConfigurationError, match="stream name"):
        asyncio.run(
            durable_run(
                make_agent(StreamingModel()),
                "hi",
                thread_id=uid("oa"),
                store=store,
                stream="no spaces",
            )
        )


def test_run_streamed_inside_a_run_points_to_stream(url: str) -> None:
    from agents import Runner

    from persistkit_openai_agents import durable

    async def scenario(store: Any) -> None:
        async with pk.resume(uid("oa"), store=store):
            result = Runner.run_streamed(durable(make_agent(StreamingModel())), "hi")
            with pytest.raises(pk.ConfigurationError, match="stream='answer'"):
                async for _ in result.stream_events():
                    pass
                if (
                    result._stored_exception is not None
                ):  # the SDK keeps the model's error for its caller
                    raise result._stored_exception

    with pk.connect(url) as store:
        asyncio.run(scenario(store))
