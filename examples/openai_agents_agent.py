"""An OpenAI Agents SDK agent that dies mid-run and resumes, offline.

    python examples/openai_agents_agent.py       # needs persistkit[openai-agents]

The agent books four hotels, one tool call per model turn, with a scripted
stand-in for the LLM (no network, no API key). The first process is killed
for real (SIGKILL) inside the third booking. The second process calls
``durable_run`` again with the same input: the two finished bookings and the
three paid model turns replay from the store; only the booking in flight at
the kill runs again (at-least-once), and the rest run for real. A third
process gets the same queue message again (a redelivery): with the message id
as ``run_id`` it replays the finished run, with no booking and no model call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENAI_API_KEY", "sk-offline-example")  # never used: the model is fake

import agents
from agents import Agent, Model, ModelResponse, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import persistkit as pk
from persistkit_openai_agents import durable_run

agents.set_tracing_disabled(True)
CITIES = ["Lisbon", "Porto", "Madrid", "Seville"]


def log(path: Path, line: str) -> int:
    with open(path, "a") as f:
        f.write(line + "\n")
    return len(path.read_text().splitlines())


class ScriptedModel(Model):
    """Books the next city (one tool call per turn), then answers. Stateless: the turn is
    derived from the tool outputs already in the input, like a real model's would be."""

    def __init__(self, calls_log: Path) -> None:
        self.calls_log = calls_log

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        done = sum(1 for item in input if isinstance(item, dict) and item.get("type") == "function_call_output")
        log(self.calls_log, f"model turn {done}")
        usage = Usage(requests=1, input_tokens=100, output_tokens=20, total_tokens=120)
        if done < len(CITIES):
            call = ResponseFunctionToolCall(
                type="function_call", id=f"fc_{done}", call_id=f"call_{done}",
                name="book_hotel", arguments=json.dumps({"city": CITIES[done]}),
            )
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(type="output_text", text=f"Booked {done} hotels.", annotations=[])
        message = ResponseOutputMessage(
            type="message", id="msg_final", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def make_agent(workdir: Path, crash: bool) -> Agent[Any]:
    @function_tool
    def book_hotel(city: str) -> str:
        """Book a hotel in ``city`` (a side effect we must not repeat)."""
        n = log(workdir / "bookings.log", city)
        print(f"  booking a hotel in {city}", flush=True)
        if crash and n == 3:
            print("  -- SIGKILL in the middle of booking #3 --", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return f"confirmed: {city}"

    return Agent(name="travel", instructions="Book the trip.", model=ScriptedModel(workdir / "model.log"), tools=[book_hotel])


#: The queue message every process handles: process 3 is a redelivery of the finished turn.
MESSAGE = {"id": "msg-7f3a", "conversation_id": "trip-42", "text": "Book my four-city trip."}


async def handle(message: dict[str, str], agent: Agent[Any], store: pk.Store) -> str:
    """One delivery of ``message``: its id is the run id, so a redelivery never re-runs the turn."""
    result = await durable_run(
        agent, message["text"], thread_id=message["conversation_id"], store=store,
        run_id=message["id"],
        # The thread's lease (pk.resume's defaults): turns of one conversation run one at a
        # time, in arrival order; a turn whose worker died keeps its place until redelivered.
        busy="queue", lease_ttl=30, busy_timeout=300,
    )
    return str(result.final_output)


async def agent_process(workdir: Path, crash: bool) -> None:
    async with pk.connect(f"sqlite:///{workdir}/agent.db") as store:
        print(f"  final answer: {await handle(MESSAGE, make_agent(workdir, crash), store)}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--agent":
        asyncio.run(agent_process(Path(sys.argv[2]), crash=sys.argv[3] == "crash"))
        return
    workdir = Path(tempfile.mkdtemp(prefix="pk-openai-agents-"))
    for attempt, mode in enumerate(["crash", "resume", "redelivery"], 1):
        print(f"process {attempt} ({mode}):", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--agent", str(workdir), mode])
        print(f"  exit code {proc.returncode}\n", flush=True)
    bookings = (workdir / "bookings.log").read_text().splitlines()
    turns = (workdir / "model.log").read_text().splitlines()
    print(f"bookings made: {bookings}")
    print(f"model turns paid: {len(turns)} (5 needed; the turns before the kill were not re-paid, "
          "and the redelivered message replayed its finished run)")
    assert bookings == ["Lisbon", "Porto", "Madrid", "Madrid", "Seville"], bookings
    assert len(turns) == 5, turns


if __name__ == "__main__":
    main()
