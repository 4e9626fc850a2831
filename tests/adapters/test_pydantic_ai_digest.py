"""The history digest of a model request (``model:<n>:<digest>``, what a recorded request
must have been recorded for) is computed once per message, and equals, byte for byte, the
digest the adapter used to compute over the whole history at every request: a run recorded
by the old code replays. ``old_digest`` below is that code, kept as the reference."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim is not installed")

from conftest import make_url, uid
from planted import fresh_keys, text
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import persistkit as pk
import persistkit_pydantic_ai._durability as durability
from persistkit_pydantic_ai import PersistkitDurability, durable_run
from persistkit_pydantic_ai._digest import HistoryDigests

# -- the reference: the digest as the adapter computed it before (whole history per request) --


def _old_comparable(node: Any) -> Any:
    if isinstance(node, str):
        scrubbed = pk.secrets.scrub(node)
        return scrubbed if "$CRED{" not in scrubbed else _OLD_HANDLE.sub("$CRED{}", scrubbed)
    if isinstance(node, dict):
        return {
            k: _old_comparable(v) for k, v in node.items() if k in _OLD_KEPT or not isinstance(k, str)
        }
    if isinstance(node, list):
        return [_old_comparable(v) for v in node]
    return node


_OLD_HANDLE = re.compile(r"\$CRED\{[^{}\s]{1,200}\}")
_OLD_KEPT = frozenset(
    {"kind", "parts", "part_kind", "content", "tool_name", "args", "tool_call_id", "instructions"}
)


def old_digest(messages: list[ModelMessage]) -> str:
    data = _old_comparable(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))
    dumped = json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.blake2b(dumped.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


# -- a realistic conversation ------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = pk.connect(make_url(request.param, request, tmp_path_factory, isolated=True))
    yield s
    s.close()


def _prompted(message: ModelMessage) -> bool:
    return any(isinstance(p, UserPromptPart) for p in message.parts)


def chatty_agent(ran: list[str], said: str) -> Agent[None, str]:
    """Instructions and a system prompt; parallel then sequential tool calls with nested
    arguments; a tool that asks for a retry once; non-ASCII text; secrets (``said``) in the
    prompt, a tool's arguments, its output and the answer."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        ran.append("model")
        asked = max(i for i, m in enumerate(messages) if _prompted(m))
        turn = messages[asked:]  # this turn's messages, after the thread's history
        returns = [p for m in turn for p in m.parts if isinstance(p, ToolReturnPart)]
        retried = any(isinstance(p, RetryPromptPart) for m in turn for p in m.parts)
        if not returns and not retried:
            return ModelResponse(
                parts=[
                    TextPart("Je regarde… 🌦"),
                    ToolCallPart("lookup", {"query": said, "opts": {"b": [1, 2], "a": None}}, "c1"),
                    ToolCallPart("flaky", {"n": 1}, "c2"),
                ]
            )
        if len(returns) < 5:
            call = ToolCallPart("lookup", {"query": "ß", "opts": {}}, f"c{len(returns) + 3}")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart(f"fini: {said} — «ok»")])

    agent = Agent(
        FunctionModel(model),
        name="chatty",
        instructions="Answer in French; cite the tools.",
        system_prompt="You are a careful assistant.",
        capabilities=[PersistkitDurability()],
    )

    @agent.tool_plain
    def lookup(query: str, opts: dict[str, Any]) -> dict[str, Any]:
        ran.append("lookup")
        return {"found": f"{query} ✓", "opts": opts, "n": len(ran)}

    @agent.tool_plain(retries=2)
    def flaky(n: int) -> str:
        ran.append("flaky")
        if ran.count("flaky") == 1:
            raise ModelRetry("try again, with feeling")
        return f"flaky {n} done"

    return agent


@pytest.mark.asyncio
async def test_a_digest_computed_per_message_equals_the_old_whole_history_digest(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = text(fresh_keys())
    histories: list[tuple[list[ModelMessage], str]] = []
    digest = durability.history_digest

    def spy(run: pk.Run, messages: list[ModelMessage]) -> str:
        histories.append((list(messages), old_digest(messages)))
        return digest(run, messages)

    monkeypatch.setattr(durability, "history_digest", spy)
    ran: list[str] = []
    agent = chatty_agent(ran, said)
    thread = uid("digest")
    for turn in ("first", "second"):  # the second turn sends the first one's messages, loaded
        result = await durable_run(agent, f"{turn}: {said}", thread_id=thread, store=store)
        assert result is not None and result.output.startswith("fini")
    assert len(histories) >= 10 and any(len(h) > 8 for h, _ in histories)
    # Each request's digest as the run computed it (cached per message) was the old one:
    # checked by the recorded ids, which a replay compares (below, and on records of old runs).
    digests = HistoryDigests()
    for messages, old in histories:
        assert digests.digest(messages) == old
    # The same histories, each digested by a fresh cache (no message seen before).
    for messages, old in histories:
        assert HistoryDigests().digest(messages) == old


@pytest.mark.asyncio
async def test_a_run_recorded_with_the_old_digest_replays(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = text(fresh_keys())
    ran: list[str] = []
    agent = chatty_agent(ran, said)
    thread = uid("olddigest")
    monkeypatch.setattr(durability, "history_digest", lambda run, messages: old_digest(messages))
    first = await durable_run(agent, f"hi {said}", thread_id=thread, store=store, run_id="m1")
    assert first is not None
    recorded = list(ran)
    monkeypatch.undo()  # the new code replays what the old code recorded
    again = await durable_run(agent, f"hi {said}", thread_id=thread, store=store, run_id="m1")
    assert again is not None and again.output == first.output
    assert ran == recorded  # nothing ran again: every model request and tool call replayed


def test_a_message_given_new_parts_or_instructions_is_digested_again() -> None:
    request = ModelRequest(parts=[UserPromptPart("hello")], instructions="be brief")
    response = ModelResponse(parts=[TextPart("hi")])
    digests = HistoryDigests()
    assert digests.digest([request, response]) == old_digest([request, response])
    # Pydantic AI adds to a message already in the history by giving it new parts.
    request.parts = [*request.parts, UserPromptPart("and more")]
    assert digests.digest([request, response]) == old_digest([request, response])
    request.instructions = "be long"
    assert digests.digest([request, response]) == old_digest([request, response])
    response.parts = []
    assert digests.digest([request, response]) == old_digest([request, response])
