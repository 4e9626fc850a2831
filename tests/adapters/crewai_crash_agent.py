"""A CrewAI flow and a CrewAI crew for the crash tests, run as their own process.

    python crewai_crash_agent.py flow URL FLOW_ID COUNTER_FILE KILL_AT
    python crewai_crash_agent.py crew URL THREAD  COUNTER_FILE KILL_AT

Every flow method, every model call and every task callback appends one line
to COUNTER_FILE (a side effect persistkit does not know about). With KILL_AT
naming a flow method or a task, the process SIGKILLs itself right after that
method's (or that task's model call's) side effect: the work is in flight.
On success the script prints a JSON summary. No model, no network: the LLM is
a deterministic fake, and any connection to a non-loopback address aborts.
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
from typing import Any, ClassVar

_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: Any) -> Any:
    host = address[0] if isinstance(address, tuple) else None
    if host is not None and host not in ("127.0.0.1", "::1", "localhost"):
        os.write(2, f"NETWORK ATTEMPT {address!r}\n".encode())
        os._exit(3)
    return _connect(self, address)


socket.socket.connect = _loopback_only  # type: ignore[method-assign]

from crewai import Agent, Crew, Process, Task  # noqa: E402
from crewai.flow.flow import Flow, listen, router, start  # noqa: E402
from crewai.flow.persistence import persist  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tasks.task_output import TaskOutput  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import persistkit as pk  # noqa: E402
from persistkit_crewai import PersistkitFlowPersistence, durable_kickoff  # noqa: E402

URL, KEY, COUNTER, KILL_AT = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]


def side_effect(line: str) -> None:
    with open(COUNTER, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    if line.split(":", 1)[1] == KILL_AT and not line.startswith("cb:"):
        os.kill(os.getpid(), signal.SIGKILL)


# -- flow ----------------------------------------------------------------------------------

store = pk.connect(URL)
persistence = PersistkitFlowPersistence(store)


class Steps(BaseModel):
    id: str = ""
    steps: list[str] = []


@persist(persistence)
class Pipeline(Flow[Steps]):
    # CrewAI's own switch against auto-creating a (lancedb) Memory: saves seconds per process.
    _skip_auto_memory: ClassVar[bool] = True

    def _step(self, name: str) -> str:
        side_effect(f"flow:{name}")
        self.state.steps.append(name)
        return name

    @start()
    def fetch(self) -> str:
        return self._step("fetch")

    @listen(fetch)
    def clean(self) -> str:
        return self._step("clean")

    @router(clean)
    def route(self) -> str:
        side_effect("flow:route")
        return "ready" if "clean" in self.state.steps else "abort"

    @listen("ready")
    def summarize(self) -> str:
        return self._step("summarize")

    @listen(summarize)
    def publish(self) -> str:
        return self._step("publish")


def run_flow() -> dict[str, Any]:
    flow = Pipeline(suppress_flow_events=True)
    persistence.restore(flow, KEY)  # False on the first run: nothing recorded yet
    flow.kickoff(inputs={"id": KEY})
    return {"steps": flow.state.steps}


# -- crew ----------------------------------------------------------------------------------


class FakeLLM(BaseLLM):
    """Answers each task at once; the answer says how many earlier answers its prompt held."""

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        name = from_task.name if from_task is not None else "?"
        side_effect(f"llm:{name}")
        seen = json.dumps(messages).count("ANSWER<")
        return f"Thought: done\nFinal Answer: ANSWER<{name} saw {seen}>"

    def supports_function_calling(self) -> bool:
        return False


def run_crew() -> dict[str, Any]:
    agent = Agent(role="writer", goal="write", backstory="offline", llm=FakeLLM(model="fake"))

    def callback(output: TaskOutput) -> None:
        side_effect(f"cb:{output.name}")

    tasks = [
        Task(name=f"t{i}", description=f"part {i} about {{topic}}", expected_output="text", agent=agent, callback=callback)
        for i in range(5)
    ]
    crew = Crew(agents=[agent], tasks=tasks, process=Process.sequential)
    out = durable_kickoff(crew, {"topic": "durability"}, thread_id=KEY, store=store)
    return {"tasks": [t.raw for t in out.tasks_output], "outputs": [t.output.raw if t.output else None for t in tasks]}


if __name__ == "__main__":
    result = run_flow() if sys.argv[1] == "flow" else run_crew()
    print("RESULT " + json.dumps(result))
