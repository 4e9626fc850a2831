"""CrewAI on persistkit: a flow around a 5-task crew, killed twice, finished by a third process.

    python examples/crewai_agent.py        # needs persistkit[crewai]; no network, no API key

A flow (``@persist(PersistkitFlowPersistence(store))``) runs ``research``,
which kicks off a 5-task crew with ``durable_kickoff``, then ``publish``. The
same command runs three times; every process dies for real (SIGKILL):

1. during task 3 of the crew;
2. (``research`` runs again: the crew replays tasks 1-2 from the store and
   runs 3-5) during ``publish``;
3. the flow is restored by its id: ``research`` completed, so it is skipped;
   ``publish`` runs and the flow finishes.

The model is a deterministic fake; every model call and flow method is logged.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # offline: no telemetry, no tracing
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from crewai import Agent, Crew, Process, Task
from crewai.flow.flow import Flow, listen, start
from crewai.flow.persistence import persist
from crewai.llms.base_llm import BaseLLM
from pydantic import BaseModel

import persistkit as pk
from persistkit_crewai import PersistkitFlowPersistence, durable_kickoff

FLOW_ID = "demo-crewai-report"
CALLS = Path(".persistkit") / "demo-crewai-llm-calls.log"
store = pk.connect()  # $PERSISTKIT_URL, else SQLite under ./.persistkit/
persistence = PersistkitFlowPersistence(store)


def log(message: str, what: str) -> None:
    """Print, append ``what`` to the call log, and die if DEMO_CRASH_AT names it."""
    print(f"  {message}", flush=True)
    CALLS.parent.mkdir(exist_ok=True)
    with CALLS.open("a") as f:
        f.write(what + "\n")
    if what == os.environ.get("DEMO_CRASH_AT"):
        print("  ... the process dies here (SIGKILL)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class FakeLLM(BaseLLM):
    """A deterministic model; with DEMO_CRASH_AT=<task> the process dies while it answers that task."""

    def call(self, messages: Any, *args: Any, from_task: Any = None, **kwargs: Any) -> str:
        task = from_task.name if from_task is not None else "?"
        log(f"model call for {task}", task)
        return f"Thought: done\nFinal Answer: notes on {task}"

    def supports_function_calling(self) -> bool:
        return False


class Report(BaseModel):
    id: str = ""
    notes: list[str] = []
    published: bool = False


@persist(persistence)
class ReportFlow(Flow[Report]):
    @start()
    def research(self) -> None:
        log("flow method research", "research")
        writer = Agent(role="writer", goal="write", backstory="offline demo", llm=FakeLLM(model="fake"))
        tasks = [
            Task(name=f"task{i}", description=f"section {i} on {{topic}}", expected_output="notes", agent=writer)
            for i in range(1, 6)
        ]
        crew = Crew(agents=[writer], tasks=tasks, process=Process.sequential)
        # run_id: if this method runs again after the crew finished, the crew replays whole.
        out = durable_kickoff(
            crew, {"topic": "durable agents"}, thread_id=f"{self.state.id}:crew", run_id=self.state.id, store=store,
            busy="queue", lease_ttl=30, busy_timeout=300,  # the thread's lease: pk.resume's defaults
        )
        self.state.notes = [t.raw for t in out.tasks_output]

    @listen(research)
    def publish(self) -> str:
        log("flow method publish", "publish")
        self.state.published = True
        return f"published {len(self.state.notes)} sections"


def worker() -> None:
    flow = ReportFlow(suppress_flow_events=True)
    if persistence.restore(flow, FLOW_ID):
        print("  restored flow from the store", flush=True)
    print("  result:", flow.kickoff(inputs={"id": FLOW_ID}), flush=True)


def main() -> None:
    for thread in (persistence.thread_id(FLOW_ID), f"{FLOW_ID}:crew"):
        store.delete_thread(thread)
    CALLS.unlink(missing_ok=True)
    me = [sys.executable, __file__, "--worker"]
    print(f"CrewAI on persistkit ({store.url})")
    codes = []
    for n, crash_at in enumerate(["task3", "publish", ""], 1):
        print(f"\nRun {n}:" + (f" will die in {crash_at}" if crash_at else " the same command again"))
        proc = subprocess.run(me, env={**os.environ, "DEMO_CRASH_AT": crash_at}, text=True, capture_output=True)
        print(proc.stdout, end="")
        print(f"  -> exit code {proc.returncode}")
        codes.append(proc.returncode)
    calls = CALLS.read_text().split()
    print(f"\nlog over the three runs: {calls}")
    print(f"flow state: {persistence.load_state(FLOW_ID)}")
    # What was in flight at a kill ran twice (task3, research, publish); nothing else did.
    expected = ["research", "task1", "task2", "task3", "research", "task3", "task4", "task5", "publish", "publish"]
    if codes != [-signal.SIGKILL, -signal.SIGKILL, 0] or calls != expected:
        sys.exit("demo: unexpected outcome")


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
