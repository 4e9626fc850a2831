"""One turn of a thread on the Pydantic AI adapter, as its own process.

    python pydantic_ai_worker.py URL THREAD DIR MESSAGE_ID [--hold-tool N] [--kill STEP]

The turn answers message ``MESSAGE_ID``: ``durable_run(agent, "message <id>",
thread_id=THREAD, run_id=<id>)``, busy policy "queue". The model (a
``FunctionModel``, no network) plays three requests: the first asks for tools
``work(n=1)`` and ``work(n=2)`` in parallel, the second for ``work(n=3)``, the
third answers ``reply to <id>``. Every model request and tool body appends
``begin`` and ``done`` lines to ``DIR/effects.log`` (side effects persistkit
does not know about): a body that finished wrote ``done`` once.

``--hold-tool N``: before tool call N starts, wait until ``DIR/go-<id>`` exists.
``--kill STEP`` (``model:K`` or ``tool:N``): SIGKILL this process inside that
model request or tool body, after ``begin``. Prints ``RESULT <json>`` on success.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from persistkit_pydantic_ai import PersistkitDurability

#: Every step of one turn, in order: what --kill accepts.
STEPS = ["model:0", "tool:1", "tool:2", "model:1", "tool:3", "model:2"]


def effect(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _turn(messages: list[ModelMessage]) -> tuple[str, int]:
    """The message this request answers and how many tool results came after it."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, ModelRequest):
            prompts = [p for p in m.parts if isinstance(p, UserPromptPart)]
            if prompts:
                returns = sum(
                    isinstance(p, ToolReturnPart)
                    for later in messages[i:]
                    if isinstance(later, ModelRequest)
                    for p in later.parts
                )
                return str(prompts[-1].content).removeprefix("message "), returns
    raise AssertionError("no user prompt")


def make_agent(work_dir: Path, hold_tool: int = 0, kill: str = "") -> Agent[None, str]:
    effects = work_dir / "effects.log"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        message, returns = _turn(messages)
        k = {0: 0, 2: 1, 3: 2}[returns]
        effect(effects, f"model {message} {k} begin")
        if kill == f"model:{k}":
            os.kill(os.getpid(), signal.SIGKILL)
        parts: list[Any]
        if k == 0:
            parts = [
                ToolCallPart(
                    "work", {"message": message, "n": n}, tool_call_id=f"call_{message}_{n}"
                )
                for n in (1, 2)
            ]
        elif k == 1:
            parts = [
                ToolCallPart("work", {"message": message, "n": 3}, tool_call_id=f"call_{message}_3")
            ]
        else:
            parts = [TextPart(f"reply to {message}")]
        effect(effects, f"model {message} {k} done")
        return ModelResponse(parts=parts)

    agent = Agent(FunctionModel(model), name="worker", capabilities=[PersistkitDurability()])

    @agent.tool_plain
    async def work(message: str, n: int) -> str:
        """Do unit of work ``n`` for ``message`` (a side effect)."""
        if n == hold_tool:
            while not (work_dir / f"go-{message}").exists():
                await asyncio.sleep(0.02)
        effect(effects, f"tool {message} {n} begin")
        if kill == f"tool:{n}":
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(0.01 * (3 - n))  # the parallel calls finish in reverse order
        effect(effects, f"tool {message} {n} done")
        return f"work {n} for {message} ok"

    return agent


def main() -> None:
    import persistkit as pk
    from persistkit_pydantic_ai import durable_run

    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("thread")
    parser.add_argument("dir", type=Path)
    parser.add_argument("message")
    parser.add_argument("--hold-tool", type=int, default=0)
    parser.add_argument("--kill", default="")
    a = parser.parse_args()
    agent = make_agent(a.dir, a.hold_tool, a.kill)

    async def turn() -> Any:
        async with pk.connect(a.url) as store:
            return await durable_run(
                agent,
                f"message {a.message}",
                thread_id=a.thread,
                store=store,
                run_id=a.message,
                busy="queue",
                busy_timeout=90,
            )

    result = asyncio.run(turn())
    print("RESULT " + json.dumps({"final_output": result.output}), flush=True)


if __name__ == "__main__":
    main()
