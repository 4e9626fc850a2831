"""A streaming, offline ``Model`` for the OpenAI Agents SDK stream tests (no network).

``StreamingModel`` plays two turns: a function call ``work(n=1)``, then an answer streamed
as text deltas (``TOKENS``). Its ``stream_response`` yields the Responses API events the SDK's
``Runner.run_streamed`` consumes (deltas, ``response.output_item.done``,
``response.completed``). ``fail_at``: the answer's stream raises after that many deltas
(once per model object); ``kill_at``: the process SIGKILLs itself after that many deltas,
once they are in the store (it reads its own stream until it sees them).

Run as a script it is the subprocess of the kill test:

    python openai_agents_stream_fake.py URL THREAD RUN_ID KILL_AT
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-offline")

import agents
from agents import Agent, Model, ModelResponse, RunContextWrapper, function_tool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)

agents.set_tracing_disabled(True)

TOKENS = ["Durable ", "answers ", "survive ", "a ", "crash."]
ANSWER = "".join(TOKENS)


def _response(output: list[Any], n: int) -> Response:
    return Response(
        id=f"resp_{n}",
        created_at=0,
        model="fake",
        object="response",
        output=output,
        parallel_tool_calls=False,
        tool_choice="auto",
        tools=[],
    )


class StreamingModel(Model):
    def __init__(
        self, *, fail_at: int = -1, kill_at: int = -1, store: Any = None, thread: str = ""
    ) -> None:
        self.fail_at, self.kill_at, self.store, self.thread = fail_at, kill_at, store, thread
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise AssertionError("a streaming durable run calls stream_response")

    async def stream_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        self.calls += 1
        done = sum(
            1 for it in input if isinstance(it, dict) and it.get("type") == "function_call_output"
        )
        seq = iter(range(1000))
        if not done:
            call = ResponseFunctionToolCall(
                type="function_call", id="fc_1", call_id="call_1", name="work", arguments='{"n": 1}'
            )
            yield ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                item=call,
                output_index=0,
                sequence_number=next(seq),
            )
            yield ResponseCompletedEvent(
                type="response.completed", response=_response([call], 0), sequence_number=next(seq)
            )
            return
        for i, token in enumerate(TOKENS):
            if i == self.fail_at:
                self.fail_at = -1
                raise RuntimeError("the model's connection dropped mid-answer")
            if i == self.kill_at:
                await _seen_in_store(self.store, self.thread, i)
                os.kill(os.getpid(), signal.SIGKILL)
            yield ResponseTextDeltaEvent(
                type="response.output_text.delta",
                item_id="msg_1",
                output_index=0,
                content_index=0,
                delta=token,
                logprobs=[],
                sequence_number=next(seq),
            )
        msg = ResponseOutputMessage(
            type="message",
            id="msg_1",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=ANSWER, annotations=[])],
        )
        yield ResponseOutputItemDoneEvent(
            type="response.output_item.done", item=msg, output_index=0, sequence_number=next(seq)
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=_response([msg], 1), sequence_number=next(seq)
        )


async def _seen_in_store(store: Any, thread: str, n: int) -> None:
    """Wait until ``n`` text deltas of this process are in the stream (what a killed worker
    had written before it died)."""
    seen = 0
    async for ev in store.read_stream(thread, "answer", timeout=10):
        if ev.kind == "event" and ev.data.get("type") == "text":
            seen += 1
            if seen >= n:
                return
    raise AssertionError(f"only {seen} of {n} deltas reached the store")


def make_agent(model: Model, log: list[int] | None = None) -> Agent[Any]:
    @function_tool
    def work(ctx: RunContextWrapper[Any], n: int) -> str:
        """Do unit of work ``n`` (a side effect)."""
        if log is not None:
            log.append(n)
        return f"work {n} ok"

    return Agent(name="writer", instructions="Answer.", model=model, tools=[work])


def main() -> None:
    import persistkit as pk
    from persistkit_openai_agents import durable_run

    url, thread, run_id, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with pk.connect(url) as store:
        model = StreamingModel(kill_at=kill_at, store=store, thread=thread)
        result = asyncio.run(
            durable_run(
                make_agent(model),
                "hi",
                thread_id=thread,
                store=store,
                run_id=run_id,
                stream="answer",
            )
        )
    print(json.dumps({"final_output": result.final_output}))


if __name__ == "__main__":
    main()
