"""A deterministic, offline agent for the OpenAI Agents SDK adapter tests.

``ScriptedModel`` implements the SDK's ``Model`` interface and never touches
the network. It is stateless: the turn it plays is derived from the number of
tool outputs already in its input, so a resumed process (whose replayed turns
never reach the model) still plays the right turn. Each real model call and
each real tool call appends one line to a log file — side effects persistkit
does not know about, counted by the tests.

Run as a script it is the subprocess of the crash test:

    python openai_agents_fake.py crash URL THREAD LOG_DIR KILL_WHERE KILL_AT [session]
    python openai_agents_fake.py approval URL THREAD LOG_DIR

    python openai_agents_fake.py deliver URL THREAD LOG_DIR MESSAGE_ID

``deliver``: one delivery of a queue message (two tool calls), with
``run_id=MESSAGE_ID`` (``-``: no run_id).
``crash``: five sequential tool calls; KILL_WHERE is ``tool`` or ``model`` (or
``none``): the process SIGKILLs itself inside the KILL_AT-th real call of that
kind (1-based), after its side effect; with ``session`` the run also keeps its
conversation in a ``PersistkitSession``. ``approval``: a run whose tool needs
approval; it stops (its RunState stored on the thread) and the process exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-offline")

import agents
from agents import Agent, Model, ModelResponse, RunContextWrapper, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

agents.set_tracing_disabled(True)

Turn = list[tuple[str, dict[str, Any]]]  # the tool calls of one model turn; [] = final answer


def log_line(path: Path, line: str) -> int:
    """Append ``line`` to ``path`` durably; return the number of lines now in it."""
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return len(path.read_text().splitlines())


def _type(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


class ScriptedModel(Model):
    def __init__(self, plan: list[Turn], log: Path | None = None, kill_at: int = -1) -> None:
        self.plan, self.log, self.kill_at = plan, log, kill_at

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        done = sum(1 for it in input if _type(it) == "function_call_output") if isinstance(input, list) else 0
        turn, seen = 0, 0
        while turn < len(self.plan) and seen + len(self.plan[turn]) <= done and self.plan[turn]:
            seen += len(self.plan[turn])
            turn += 1
        if self.log is not None and log_line(self.log, f"model {turn}") == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        calls = self.plan[turn] if turn < len(self.plan) else []
        output: list[Any]
        if calls:
            output = [
                ResponseFunctionToolCall(
                    type="function_call", id=f"fc_{turn}_{i}", call_id=f"call_{turn}_{i}",
                    name=name, arguments=json.dumps(args),
                )
                for i, (name, args) in enumerate(calls)
            ]
        else:
            text = f"done after {done} tool calls"
            output = [
                ResponseOutputMessage(
                    type="message", id=f"msg_{turn}", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                )
            ]
        return ModelResponse(output=output, usage=Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def make_agent(plan: list[Turn], log_dir: Path, *, kill_where: str = "none", kill_at: int = -1,
               approval: bool = False) -> Agent[Any]:
    tool_log = log_dir / "tools.log"

    @function_tool(needs_approval=approval)
    def work(ctx: RunContextWrapper[Any], n: int) -> str:
        """Do unit of work ``n`` (a side effect)."""
        if log_line(tool_log, f"work {n}") == kill_at and kill_where == "tool":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"work {n} ok"

    model = ScriptedModel(plan, log_dir / "model.log", kill_at if kill_where == "model" else -1)
    return Agent(name="worker", instructions="Do the work.", model=model, tools=[work])


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


SEQUENTIAL: list[Turn] = [[("work", {"n": i})] for i in range(1, 6)] + [[]]


APPROVAL_PLAN: list[Turn] = [[("work", {"n": 1})], [("work", {"n": 2})], []]


def main() -> None:
    import persistkit as pk
    from persistkit_openai_agents import PersistkitSession, durable_run

    mode, url, thread, log_dir = sys.argv[1:5]
    kwargs: dict[str, Any] = {}
    with pk.connect(url) as store:
        if mode == "crash":
            kill_where, kill_at = sys.argv[5], int(sys.argv[6])
            agent = make_agent(SEQUENTIAL, Path(log_dir), kill_where=kill_where, kill_at=kill_at)
            prompt = "do five units of work"
            if sys.argv[7:] == ["session"]:
                kwargs["session"] = PersistkitSession(thread + "-session", store)
        elif mode == "deliver":  # one delivery of a queue message: its id is the run id
            message_id = sys.argv[5]
            agent = make_agent([[("work", {"n": 1})], [("work", {"n": 2})], []], Path(log_dir))
            prompt = "handle message"
            if message_id != "-":
                kwargs["run_id"] = message_id
        else:  # "approval": start a run that stops for approval, then exit
            agent = make_agent(APPROVAL_PLAN, Path(log_dir), approval=True)
            prompt = "do two approved units of work"
        result = asyncio.run(durable_run(agent, prompt, thread_id=thread, store=store, **kwargs))
    print(json.dumps({"final_output": result.final_output, "interruptions": len(result.interruptions)}))


if __name__ == "__main__":
    main()
