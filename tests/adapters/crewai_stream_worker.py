"""A worker process for the CrewAI stream kill test (no network: a scripted ``BaseLLM``).

    python crewai_stream_worker.py URL THREAD RUN_ID KILL_TASK

One kickoff of three tasks, ``durable_kickoff(..., stream="answer")``; each task calls the
``lookup`` tool, then answers. ``KILL_TASK`` (``t1``, or ``-``): in that task's step callback,
once its action is in the store (it reads its own stream), the process SIGKILLs itself.
Prints the crew's output on success.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import json
import signal
import sys
import warnings
from typing import Any

from crewai import Agent, Crew, Process, Task
from crewai.agents.parser import AgentAction
from crewai.llms.base_llm import BaseLLM
from crewai.tools import tool

import persistkit as pk
from persistkit_crewai import durable_kickoff

warnings.simplefilter("ignore")


class ScriptLLM(BaseLLM):
    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        name = from_task.name if from_task is not None else "?"
        if f"the {name} fact is 42" not in json.dumps(messages):
            return f'Thought: I need the {name} fact\nAction: lookup\nAction Input: {{"q": "{name} fact"}}'
        return f"Thought: done\nFinal Answer: ANSWER<{name}>"

    def supports_function_calling(self) -> bool:
        return False


@tool("lookup")
def lookup(q: str) -> str:
    """Look a fact up."""
    return f"the {q} is 42"


def main() -> None:
    url, thread, run_id, kill = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    with pk.connect(url) as store:

        def step_callback(step: Any) -> None:
            if isinstance(step, AgentAction) and f"{kill} fact" in str(step.tool_input):
                for ev in store.read_stream(thread, "answer", timeout=10):
                    if (
                        ev.kind == "event"
                        and ev.data.get("type") == "action"
                        and kill in ev.data["tool_input"]
                    ):
                        os.kill(os.getpid(), signal.SIGKILL)
                raise AssertionError("the action never reached the store")

        agent = Agent(
            role="writer",
            goal="write",
            backstory="offline",
            llm=ScriptLLM(model="fake"),
            tools=[lookup],
            max_retry_limit=0,
            step_callback=step_callback,
        )
        tasks = [
            Task(name=f"t{i}", description=f"part {i}", expected_output="text", agent=agent)
            for i in range(3)
        ]
        crew = Crew(agents=[agent], tasks=tasks, process=Process.sequential)
        out = durable_kickoff(crew, thread_id=thread, store=store, run_id=run_id, stream="answer")
    print(out.raw)


if __name__ == "__main__":
    main()
