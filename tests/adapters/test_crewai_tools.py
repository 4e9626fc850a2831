"""CrewAI tool calls inside a durable task are steps: a tool that returned is not run again.

The crash tests SIGKILL a real process (``crewai_tool_crash_agent.py``) after a
tool returned (in the model call that follows it) and resume in a new process;
the tools' side effects are lines in a file persistkit does not know about.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import json
import logging
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import make_url, uid

pytest.importorskip("crewai")

from crewai import Agent, Crew, Process, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool, tool

import persistkit as pk
from persistkit_crewai import adurable_kickoff, durable_kickoff

AGENT = Path(__file__).with_name("crewai_tool_crash_agent.py")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai"),
    pytest.mark.filterwarnings("ignore:function callbacks cannot be serialized:UserWarning"),
]


def run_agent(url: str, thread: str, log: Path, mode: str, kill: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(AGENT), url, thread, str(log), mode, kill],
                          capture_output=True, text=True, env=env, timeout=120)
    assert "NETWORK ATTEMPT" not in done.stderr, done.stderr
    return done


def side_effects(log: Path) -> Counter[str]:
    return Counter(line.split(" ", 1)[0] for line in log.read_text().splitlines())


#: (store, kill point, tools done before it, tool-calling mode): every pair of the three
#: factors once (the pairwise cut of their 8 combinations, issue #35); each case starts two
#: interpreters that import crewai, 10-40 s on two cores.
PAIRWISE_KILLS = [
    ("sqlite", "llm:2", 1, "react"),
    ("sqlite", "llm:3", 2, "native"),
    ("postgres", "llm:2", 1, "native"),
    ("postgres", "llm:3", 2, "react"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "kill", "tools_done", "mode"), PAIRWISE_KILLS)
def test_a_tool_that_returned_before_a_sigkill_does_not_run_again(
    kind: str, kill: str, tools_done: int, mode: str, request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
) -> None:
    url, thread, log = make_url(kind, request, tmp_path_factory), uid("crew-tools"), tmp_path / "effects.log"
    first = run_agent(url, thread, log, mode, kill)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert sum(side_effects(log)[t] for t in ("send_email", "open_ticket")) == tools_done
    second = run_agent(url, thread, log, mode, "none")
    assert second.returncode == 0, second.stderr[-3000:]
    # Each tool's side effect happened once across both processes: the email was not sent twice.
    effects = side_effects(log)
    assert effects["send_email"] == 1 and effects["open_ticket"] == 1, log.read_text()
    # The model calls of the task in flight are steps too: the ones that answered before the
    # kill replay, the one killed runs again. Four model calls answered, one of them twice.
    assert effects["llm"] == 5, log.read_text()
    with pk.connect(url) as store:
        steps = [c.step for c in reversed(store.history(thread)) if c.kind == "step"]
    assert steps == ["crewai.llm:fake", "crewai.tool:send_email", "crewai.llm:fake", "crewai.tool:open_ticket",
                     "crewai.llm:fake", "crewai.task[0] email", "crewai.llm:fake", "crewai.task[1] report"]


@pytest.mark.slow
def test_the_tool_in_flight_at_a_sigkill_runs_again(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    # At-least-once for the one call in flight: killed inside the tool, before it returned.
    url, thread, log = make_url("sqlite", request, tmp_path_factory), uid("crew-tools"), tmp_path / "effects.log"
    assert run_agent(url, thread, log, "react", "tool:open_ticket").returncode == -signal.SIGKILL
    assert run_agent(url, thread, log, "react", "none").returncode == 0
    effects = side_effects(log)
    assert (effects["send_email"], effects["open_ticket"]) == (1, 2), log.read_text()


# -- in one process ------------------------------------------------------------------------


class Scripted(BaseLLM):
    """Asks for ``send_email`` with the arguments of ``self.to``, then fails or answers."""

    to: str = "bob"
    fail_after_tool: bool = False

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        if "SENT" not in json.dumps(messages, default=str):
            return f'Thought: email\nAction: send_email\nAction Input: {{"to": "{self.to}"}}'
        if self.fail_after_tool:
            raise RuntimeError("model outage")
        return "Thought: done\nFinal Answer: ok"

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call(messages, *args, **kwargs)

    def supports_function_calling(self) -> bool:
        return False


class Mailer(BaseTool):
    name: str = "send_email"
    description: str = "Send an email."
    sent: list[str] = []

    def _run(self, to: str) -> str:
        self.sent.append(to)
        return f"SENT to {to}"


def crew_of(llm: BaseLLM, tools: list[Any]) -> Crew:
    # max_retry_limit=0: CrewAI's own retry of a failed task runs it again in the same process
    # (its tools too, at new positions, as without persistkit); here a failure ends the kickoff.
    agent = Agent(role="clerk", goal="serve", backstory="offline", llm=llm, tools=tools, max_retry_limit=0)
    return Crew(agents=[agent], tasks=[Task(name="t", description="email", expected_output="x", agent=agent)],
                process=Process.sequential)


@pytest.mark.parametrize("kickoff", ["sync", "async"])
def test_a_task_that_failed_after_its_tool_reruns_without_the_tool(kickoff: str, caplog: pytest.LogCaptureFixture) -> None:
    store, thread, mailer = pk.connect("memory://"), uid("crew"), Mailer()
    llm = Scripted(model="fake", fail_after_tool=True)

    def go() -> Any:
        crew = crew_of(llm, [mailer])
        if kickoff == "sync":
            return durable_kickoff(crew, thread_id=thread, store=store)
        return __import__("asyncio").run(adurable_kickoff(crew, thread_id=thread, store=store))

    with pytest.raises(Exception, match="model outage"):
        go()
    assert mailer.sent == ["bob"]
    # The rerun's model would ask with other arguments, but its call that answered before the
    # failure is a step: it replays (bob), and so does the tool call it asked for.
    llm.fail_after_tool, llm.to = False, "alice"
    with caplog.at_level(logging.WARNING, logger="persistkit_crewai"):
        assert go().raw == "ok"
    assert mailer.sent == ["bob"]  # not run again, neither for bob nor for alice
    assert "other arguments" not in caplog.text and "other messages" not in caplog.text
    assert "_run" not in mailer.__dict__  # the shadowing is gone after the kickoff


def test_outside_a_durable_kickoff_tools_are_the_plain_tools() -> None:
    ran: list[str] = []

    @tool("send_email")
    def send_email(to: str) -> str:
        """Send an email."""
        ran.append(to)
        return f"SENT to {to}"

    plain = send_email.func
    store, thread = pk.connect("memory://"), uid("crew")
    llm = Scripted(model="fake")
    durable_kickoff(crew_of(llm, [send_email]), thread_id=thread, store=store)
    assert ran == ["bob"] and send_email.func is plain
    assert send_email.run(to="carol") == "SENT to carol" and ran == ["bob", "carol"]
    steps = [c.step for c in reversed(store.history(thread)) if c.kind == "step"]
    assert steps == ["crewai.llm:fake", "crewai.tool:send_email", "crewai.llm:fake", "crewai.task[0] t"]
    assert "call" not in llm.__dict__ and "acall" not in llm.__dict__  # the model's shadowing is gone too
