"""A CrewAI crew whose first task calls two tools, run as its own process by the crash tests.

    python crewai_tool_crash_agent.py URL THREAD LOG MODE KILL

Task ``email`` asks the model, which asks for ``send_email`` then ``open_ticket``
(each a side effect: one line appended to LOG), then answers; task ``report``
answers at once. MODE is ``react`` (the model writes ``Action:`` text) or
``native`` (the model returns function calls, CrewAI's native tool calling).
KILL is ``none``, ``llm:N`` (SIGKILL inside the N-th model call, after its log
line: with N=2 the first tool has returned, with N=3 both have) or
``tool:NAME`` (SIGKILL inside tool NAME after its side effect, before it
returns). Offline: the model is a deterministic fake, any connection to a
non-loopback address aborts. On success it prints ``RESULT <json>``.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import json
import signal
import socket
import sys
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
from persistkit_crewai import durable_kickoff  # noqa: E402

URL, THREAD, LOG, MODE, KILL = sys.argv[1:6]


def side_effect(line: str) -> int:
    """Append ``line`` to LOG durably; return how many lines of its kind LOG holds now."""
    with open(LOG, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    with open(LOG) as f:
        return sum(1 for seen in f.read().splitlines() if seen.split(" ", 1)[0] == line.split(" ", 1)[0])


@tool("send_email")
def send_email(to: str, body: str) -> str:
    """Send an email to ``to``."""
    side_effect(f"send_email {to}: {body}")
    if KILL == "tool:send_email":
        os.kill(os.getpid(), signal.SIGKILL)
    return f"EMAIL-SENT to {to}"


@tool("open_ticket")
def open_ticket(title: str) -> str:
    """Open a support ticket."""
    side_effect(f"open_ticket {title}")
    if KILL == "tool:open_ticket":
        os.kill(os.getpid(), signal.SIGKILL)
    return f"TICKET-OPENED {title}"


class FakeLLM(BaseLLM):
    """Asks for the tool whose result is not in the conversation yet, then answers."""

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> Any:
        n = side_effect(f"llm {from_task.name if from_task is not None else '?'}")
        if f"llm:{n}" == KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        seen = json.dumps(messages, default=str)
        if from_task is not None and from_task.name == "email":
            if "EMAIL-SENT" not in seen:
                return self._ask("send_email", {"to": "bob@example.com", "body": "your order shipped"})
            if "TICKET-OPENED" not in seen:
                return self._ask("open_ticket", {"title": "order 42"})
        return "Thought: done\nFinal Answer: done"

    def _ask(self, name: str, args: dict[str, Any]) -> Any:
        if MODE == "native":
            return [{"id": f"call_{name}", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(args)}}]
        return f"Thought: I need {name}\nAction: {name}\nAction Input: {json.dumps(args)}"

    def supports_function_calling(self) -> bool:
        return MODE == "native"


def main() -> None:
    agent = Agent(role="clerk", goal="serve", backstory="offline", llm=FakeLLM(model="fake"),
                  tools=[send_email, open_ticket])
    tasks = [
        Task(name="email", description="tell bob his order shipped and open a ticket",
             expected_output="text", agent=agent),
        Task(name="report", description="report", expected_output="text", agent=agent),
    ]
    crew = Crew(agents=[agent], tasks=tasks, process=Process.sequential)
    with pk.connect(URL) as store:
        out = durable_kickoff(crew, thread_id=THREAD, store=store)
    print("RESULT " + json.dumps({"tasks": [t.raw for t in out.tasks_output]}))


if __name__ == "__main__":
    main()
