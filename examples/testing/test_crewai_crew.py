"""A CrewAI crew run by ``durable_kickoff``, crashed at every task by the crash matrix.

    pytest examples/testing/test_crewai_crew.py      # needs persistkit[crewai]; offline

Copy it next to your own crew: replace ``make_crew`` with yours and keep a fake model
(the matrix compares a resumed run with an uncrashed one, so a model call must answer
the same for the same prompt). Each task is a step, and each model call a step nested
under it, so the matrix crashes before, inside and after every one of them.

Inline mode only: CrewAI runs an event bus on a thread it starts in the process, and a child
made by ``os.fork`` (process mode) has no copy of that thread, so its first kickoff waits
forever; the matrix kills such a child after a deadline and says so.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # offline: no telemetry, no tracing
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import json
from typing import Any

import pytest

pytest.importorskip("crewai")

from crewai import Agent, Crew, Process, Task
from crewai.llms.base_llm import BaseLLM

from persistkit_crewai import durable_kickoff

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # CrewAI's own


class FakeLLM(BaseLLM):
    """A deterministic model: its answer depends only on the task and the answers before it."""

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        name = from_task.name if from_task is not None else "?"
        seen = json.dumps(messages).count("NOTES<")
        return f"Thought: done\nFinal Answer: NOTES<{name} after {seen}>"

    def supports_function_calling(self) -> bool:
        return False


def make_crew() -> Crew:
    writer = Agent(
        role="writer",
        goal="write",
        backstory="offline",
        llm=FakeLLM(model="fake"),
        max_retry_limit=0,
    )
    tasks = [
        Task(
            name=f"section{i}",
            description=f"section {i} on {{topic}}",
            expected_output="notes",
            agent=writer,
        )
        for i in range(3)
    ]
    return Crew(agents=[writer], tasks=tasks, process=Process.sequential)


def report(thread_id: str, topic: str) -> list[str]:
    """The agent under test: one kickoff of the crew on ``thread_id`` (a fresh crew per call,
    as a new process would build it)."""
    out = durable_kickoff(make_crew(), {"topic": topic}, thread_id=thread_id)
    return [t.raw for t in out.tasks_output]


def test_the_crew_survives_a_crash_at_every_task(crash_matrix: Any) -> None:
    result = crash_matrix(lambda: report("report-42", "durable agents"))
    result.assert_exactly_once()
    result.assert_same_outcome()
    assert result.reference.value == [f"NOTES<section{i} after {i}>" for i in range(3)]
    assert len(result.points) == 6 * 3  # 3 tasks and their 3 model calls, each crashed 3 ways
