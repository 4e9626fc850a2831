"""Secrets planted through the Pydantic AI adapter never reach storage, in any encoding.

Fresh keys of many formats (``planted.fresh_keys``) go in the user's prompt, in the
arguments of the model's tool call, in the tool's output and in the model's answer; the
turn runs twice with one ``run_id`` (the second replays) and the conversation is kept on
the thread (``durable_run``). Then the raw bytes of the store (SQLite file, PostgreSQL
rows, Redis values, S3 objects) are searched for each key as it is, base64 and hex.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim is not installed")

from conftest import make_url, uid
from planted import connect, fresh_keys, leaks, raw_bytes, text
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import persistkit as pk
from persistkit_pydantic_ai import MESSAGES_CHANNEL, PersistkitDurability, durable_run, load_history


@pytest.fixture(params=["sqlite", "postgres", "redis", "s3"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def test_pydantic_ai_run_and_history_store_no_secret(url: str) -> None:
    keys = fresh_keys()
    said = text(keys)
    ran: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        ran.append("model")
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        "lookup", {"token": keys["openai"], "query": said}, tool_call_id="t1"
                    )
                ]
            )
        return ModelResponse(parts=[TextPart(f"answer: {said}")])

    agent = Agent(FunctionModel(model), name="leaky", capabilities=[PersistkitDurability()])

    @agent.tool_plain
    def lookup(token: str, query: str) -> str:
        ran.append("tool")
        assert token == keys["openai"]  # a live tool is handed the key, never its handle
        return f"tool output: {said}"

    thread = uid("pyd")

    async def scenario() -> None:
        async with connect(url) as store:
            for _ in range(2):  # the second call replays the recorded turn
                result = await durable_run(
                    agent, f"my keys: {said}", thread_id=thread, store=store, run_id="r1"
                )
                assert result is not None and result.output == f"answer: {said}"
            assert ran == ["model", "tool", "model"]
            async with pk.resume(
                thread, store=store
            ) as run:  # the next turn reads its history back
                history = load_history(run)
            assert said in str(history[0].parts[0].content)  # resolved in this process
            assert len(store.get_state(thread, plain=True)[MESSAGES_CHANNEL]) == 4

    asyncio.run(scenario())
    data = raw_bytes(url)
    assert b"$CRED{openai-" in data
    assert leaks(data, keys) == []
