"""Environment secrets through each framework, in new processes, on every store (issue 18, section 2).

Each framework at its own level (a real LangGraph graph, a CrewAI Flow, the OpenAI
Agents Runner with an offline model): the key comes from the environment and sits in
the framework's state and inside a tool call's arguments (an email body). The agent
process is SIGKILLed inside the tool call (tests/adapters/env_secret_frameworks.py),
then new processes, with nothing registered:

* inspect the thread without the variable: the framework's own read path works and
  shows handles (before: ``SecretResolutionError``, the thread could not be read);
* resume without the variable: ``SecretResolutionError`` naming the variable, and the
  tool is NOT called (before: it re-ran with ``$CRED{…}`` text in the email body);
* resume with the key rotated: the tool in flight runs again with the new key, every
  later model call sees the new key, nothing sees handle text.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("agents")
pytest.importorskip("crewai")

from conftest import make_url, uid
from planted import raw_bytes

SCRIPT = Path(__file__).with_name("env_secret_frameworks.py")
VARIABLE = "PK_AGENT_OPENAI_API_KEY"
KEY = "sk-proj-Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7cF0"
ROTATED = "sk-proj-Zz9yX8wV7uT6sR5qP4oN3mL2kJ1hG0"
HANDLE = f"$CRED{{env:{VARIABLE}}}"
STEPS = {"langgraph": ("model", "tool", "model2"), "crewai": ("begin", "draft", "send"), "openai": ("model", "send", "model2")}
TOOL = {"langgraph": "tool", "crewai": "send", "openai": "send"}


#: Each framework on SQLite and on one server store, each server store under one framework
#: (issue #35: four interpreters a case, each importing its framework; the secret is turned
#: into a handle before any store sees it, so a framework's path is the same on every store).
PAIRS = {("langgraph", "sqlite"), ("langgraph", "postgres"), ("crewai", "sqlite"), ("crewai", "redis"),
         ("openai", "sqlite"), ("openai", "s3")}


@pytest.fixture(params=["sqlite", "postgres", "redis", "s3"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    framework = request.node.callspec.params.get("framework")
    if framework is not None and (framework, request.param) not in PAIRS:
        pytest.skip(f"{framework} runs on SQLite and one server store; {request.param} is crossed with another framework")
    return make_url(request.param, request, tmp_path_factory)


def run(framework: str, url: str, thread: str, outbox: Path, key: str | None, kill: str = "none", *extra: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if key is not None:
        env[VARIABLE] = key
    env["PK_AGENT_OUTBOX"] = str(outbox)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), framework, url, thread, kill, *extra],
        capture_output=True, text=True, env=env, timeout=240,
    )
    if kill != "none":
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
        return {}
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def calls(outbox: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in outbox.read_text().splitlines()] if outbox.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["langgraph", "crewai", "openai"])
def test_a_crash_in_the_tool_call_resumes_with_the_environments_key(framework: str, url: str, tmp_path: Path) -> None:
    thread, outbox = uid(f"env-{framework}"), tmp_path / "outbox"
    tool = TOOL[framework]
    run(framework, url, thread, outbox, KEY, tool)
    assert calls(outbox)[-1]["step"] == tool and KEY in calls(outbox)[-1]["texts"][0]

    shown = run(framework, url, thread, outbox, None, "none", "inspect")  # no variable, nothing registered
    assert "error" not in shown, shown
    assert KEY not in json.dumps(shown)
    if framework != "openai":  # the SDK's session holds the user's message only before the turn ends
        assert shown["api_key"] == HANDLE and any(HANDLE in t for t in shown["texts"]), shown

    before = len(calls(outbox))
    refused = run(framework, url, thread, outbox, None)
    assert refused.get("error") == "SecretResolutionError", refused
    assert HANDLE in refused["message"] and f"set {VARIABLE}" in refused["message"] and KEY not in refused["message"]
    assert calls(outbox)[before:] == []  # nothing ran with handle text: no email with $CRED{...} in it

    done = run(framework, url, thread, outbox, ROTATED)
    assert done.get("done"), done
    after = calls(outbox)[before:]
    assert after[0]["step"] == tool  # the call in flight at the crash runs again (at-least-once) ...
    texts = [t for c in after for t in c["texts"]]
    assert all("$CRED{" not in t and KEY not in t for t in texts), texts  # ... with the rotated key
    assert ROTATED in after[0]["texts"][0]
    assert KEY.encode() not in raw_bytes(url) and ROTATED.encode() not in raw_bytes(url)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["langgraph", "crewai", "openai"])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_every_crash_position_resumes_in_a_new_process(framework: str, position: int, tmp_path: Path,
                                                      request: pytest.FixtureRequest,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    url = make_url("sqlite", request, tmp_path_factory)
    thread, outbox = uid(f"pos-{framework}"), tmp_path / "outbox"
    kill = STEPS[framework][position]
    run(framework, url, thread, outbox, KEY, kill)
    done = run(framework, url, thread, outbox, KEY)
    assert done.get("done"), done
    seen = calls(outbox)
    assert [c["step"] for c in seen] == list(STEPS[framework][: position + 1]) + list(STEPS[framework][position:])
    texts = [t for c in seen for t in c["texts"]]
    assert all("$CRED{" not in t for t in texts), texts
    assert KEY.encode() not in raw_bytes(url)
