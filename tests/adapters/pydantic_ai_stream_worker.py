"""A worker process for the Pydantic AI stream kill test (no network: ``FunctionModel``).

    python pydantic_ai_stream_worker.py URL THREAD RUN_ID KILL_AT

One turn, ``durable_run(..., stream="answer")``: the model calls ``work(n=1)``, then streams
``TOKENS``. ``KILL_AT`` >= 0: once that many answer tokens are in the store (it reads its own
stream), the process SIGKILLs itself. Prints the answer on success.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

import persistkit as pk
from persistkit_pydantic_ai import PersistkitDurability, durable_run

TOKENS = ["Durable ", "answers ", "survive ", "a ", "crash."]


async def _in_store(store: pk.Store, thread: str, n: int) -> None:
    seen = 0
    async for ev in store.read_stream(thread, "answer", timeout=10):
        if ev.kind == "event" and ev.data.get("type") == "text":
            seen += 1
            if seen >= n:
                return
    raise AssertionError(f"only {seen} of {n} tokens reached the store")


def agent(store: pk.Store, thread: str, kill_at: int) -> Agent[None, str]:
    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        if not any(
            isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])
        ):
            yield {0: DeltaToolCall(name="work", json_args='{"n": 1}', tool_call_id="call_1")}
            return
        for i, token in enumerate(TOKENS):
            if i == kill_at:
                await _in_store(store, thread, i)
                os.kill(os.getpid(), signal.SIGKILL)
            yield token

    out: Agent[None, str] = Agent(
        FunctionModel(stream_function=stream), name="writer", capabilities=[PersistkitDurability()]
    )

    @out.tool_plain
    def work(n: int) -> str:
        return f"work {n} ok"

    return out


def main() -> None:
    url, thread, run_id, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with pk.connect(url) as store:
        result = asyncio.run(
            durable_run(
                agent(store, thread, kill_at),
                "hi",
                thread_id=thread,
                store=store,
                run_id=run_id,
                stream="answer",
            )
        )
    assert result is not None
    print(result.output)


if __name__ == "__main__":
    main()
