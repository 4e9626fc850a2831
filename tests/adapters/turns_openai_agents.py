"""One turn of a Slack-like thread on the OpenAI Agents SDK adapter, as its own process.

    python turns_openai_agents.py URL THREAD DIR MESSAGE_ID [--hold-tool N] [--kill-tool N]

The turn answers message ``MESSAGE_ID``: ``durable_run(agent, "message <id>",
thread_id=THREAD, run_id=<id>, session=PersistkitSession(THREAD, store))``,
busy policy "queue" (the default). The scripted model asks for tool ``work``
twice (n=1, n=2), then answers ``reply to <id>``. Every model call and tool
body appends ``begin`` and ``done`` lines to ``DIR/effects.log`` (side effects
persistkit does not know about): a body that finished wrote ``done`` once.

``--hold-tool N``: before tool call N starts, wait until ``DIR/go-<id>`` exists
(the test releases it once it saw the next turn queued behind this one).
``--kill-tool N``: SIGKILL this process inside tool call N, after ``begin``.
Prints ``RESULT <json>`` on success. No network: the model is a fake.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-offline")

import agents
from agents import Agent, Model, ModelResponse, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

agents.set_tracing_disabled(True)

TOOL_CALLS = 2


def effect(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


class TurnModel(Model):
    """Plays the turn of the newest user message: the number of tool outputs after it says
    which model call this is. Deterministic, stateless (a resumed process plays the same)."""

    def __init__(self, effects: Path) -> None:
        self.effects = effects

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        last_user = max(i for i, it in enumerate(items) if _field(it, "role") == "user")
        message = str(_field(items[last_user], "content")).removeprefix("message ")
        k = sum(1 for it in items[last_user:] if _field(it, "type") == "function_call_output")
        effect(self.effects, f"model {message} {k} begin")
        output: list[Any]
        if k < TOOL_CALLS:
            output = [
                ResponseFunctionToolCall(
                    type="function_call", id=f"fc_{message}_{k}", call_id=f"call_{message}_{k}",
                    name="work", arguments=json.dumps({"message": message, "n": k + 1}),
                )
            ]
        else:
            output = [
                ResponseOutputMessage(
                    type="message", id=f"msg_{message}", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text=f"reply to {message}", annotations=[])],
                )
            ]
        effect(self.effects, f"model {message} {k} done")
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def make_agent(work_dir: Path, hold_tool: int, kill_tool: int) -> Agent[Any]:
    effects = work_dir / "effects.log"

    @function_tool
    def work(message: str, n: int) -> str:
        """Do unit of work ``n`` for ``message`` (a side effect)."""
        if n == hold_tool:
            while not (work_dir / f"go-{message}").exists():
                time.sleep(0.02)
        effect(effects, f"tool {message} {n} begin")
        if n == kill_tool:
            os.kill(os.getpid(), signal.SIGKILL)
        effect(effects, f"tool {message} {n} done")
        return f"work {n} for {message} ok"

    return Agent(name="slack-bot", instructions="Answer the thread.", model=TurnModel(effects), tools=[work])


def main() -> None:
    import persistkit as pk
    from persistkit_openai_agents import PersistkitSession, durable_run

    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("thread")
    parser.add_argument("dir", type=Path)
    parser.add_argument("message")
    parser.add_argument("--hold-tool", type=int, default=0)
    parser.add_argument("--kill-tool", type=int, default=0)
    a = parser.parse_args()
    agent = make_agent(a.dir, a.hold_tool, a.kill_tool)

    async def turn() -> Any:
        async with pk.connect(a.url) as store:
            session = PersistkitSession(a.thread, store)
            return await durable_run(
                agent, f"message {a.message}", thread_id=a.thread, store=store, session=session,
                run_id=a.message, busy="queue", busy_timeout=90,
            )

    result = asyncio.run(turn())
    print("RESULT " + json.dumps({"final_output": result.final_output}), flush=True)


if __name__ == "__main__":
    main()
