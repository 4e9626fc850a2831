"""One turn of a Slack-like thread on the CrewAI adapter, as its own process.

    python turns_crewai.py URL THREAD DIR MESSAGE_ID [--hold-tool] [--kill-tool] [--async]

The turn answers message ``MESSAGE_ID`` with a two-task crew:
``durable_kickoff(crew, {"message": id}, thread_id=THREAD, run_id=id)`` (or
``adurable_kickoff`` with ``--async``), busy policy "queue" (the default).
Task ``answer`` asks the fake model, which asks for tool ``lookup`` (ReAct
text), then answers; task ``reply`` answers at once. Every model call and tool
body appends ``begin`` and ``done`` lines to ``DIR/effects.log`` (side effects
persistkit does not know about): a body that finished wrote ``done`` once.

``--hold-tool``: before the tool starts, wait until ``DIR/go-<id>`` exists.
``--kill-tool``: SIGKILL this process inside the tool, after ``begin``.
Prints ``RESULT <json>`` on success. Offline: any non-loopback connection aborts.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import argparse
import asyncio
import json
import signal
import socket
import time
from pathlib import Path
from typing import Any

_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: Any) -> Any:
    if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
        os.write(2, f"NETWORK ATTEMPT {address!r}\n".encode())
        os._exit(3)
    return _connect(self, address)


socket.socket.connect = _loopback_only  # type: ignore[method-assign]

from crewai import Agent, Crew, Process, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402

import persistkit as pk  # noqa: E402
from persistkit_crewai import adurable_kickoff, durable_kickoff  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("thread")
parser.add_argument("dir", type=Path)
parser.add_argument("message")
parser.add_argument("--hold-tool", action="store_true")
parser.add_argument("--kill-tool", action="store_true")
parser.add_argument("--async", dest="use_async", action="store_true")
ARGS = parser.parse_args()
EFFECTS = ARGS.dir / "effects.log"


def effect(line: str) -> None:
    with open(EFFECTS, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool("lookup")
def lookup(message: str) -> str:
    """Look up what message ``message`` is about (a side effect)."""
    if ARGS.hold_tool:
        while not (ARGS.dir / f"go-{message}").exists():
            time.sleep(0.02)
    effect(f"tool {message} lookup begin")
    if ARGS.kill_tool:
        os.kill(os.getpid(), signal.SIGKILL)
    effect(f"tool {message} lookup done")
    return f"LOOKED-UP {message}"


class FakeLLM(BaseLLM):
    """Task ``answer``: asks for ``lookup`` until its result is in the conversation, then answers;
    task ``reply``: answers at once. Deterministic; no network."""

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> Any:
        task = from_task.name if from_task is not None else "?"
        seen = json.dumps(messages, default=str)
        k = seen.count("LOOKED-UP")
        effect(f"model {ARGS.message} {task} {k} begin")
        if task == "answer" and k == 0:
            text = f'Thought: I need the lookup\nAction: lookup\nAction Input: {{"message": "{ARGS.message}"}}'
        else:
            text = f"Thought: done\nFinal Answer: {task} for {ARGS.message}"
        effect(f"model {ARGS.message} {task} {k} done")
        return text

    def supports_function_calling(self) -> bool:
        return False


def main() -> None:
    agent = Agent(role="slack bot", goal="answer", backstory="offline", llm=FakeLLM(model="fake"), tools=[lookup])
    tasks = [
        Task(name="answer", description="answer message {message}", expected_output="text", agent=agent),
        Task(name="reply", description="write the reply to {message}", expected_output="text", agent=agent),
    ]
    crew = Crew(agents=[agent], tasks=tasks, process=Process.sequential)
    inputs = {"message": ARGS.message}
    options: dict[str, Any] = {"thread_id": ARGS.thread, "run_id": ARGS.message, "busy": "queue", "busy_timeout": 90}
    with pk.connect(ARGS.url) as store:
        if ARGS.use_async:
            out = asyncio.run(adurable_kickoff(crew, inputs, store=store, **options))
        else:
            out = durable_kickoff(crew, inputs, store=store, **options)
    print("RESULT " + json.dumps({"tasks": [t.raw for t in out.tasks_output]}), flush=True)


if __name__ == "__main__":
    main()
