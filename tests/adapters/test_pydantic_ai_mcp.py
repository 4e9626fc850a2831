"""MCP through the Pydantic AI adapter: a real MCP server (``pydantic_ai_mcp_server.py``, fastmcp
over stdio) used by an agent with ``PersistkitDurability``, on SQLite and PostgreSQL.

The pinned ``pydantic-ai-slim`` reaches MCP servers through fastmcp; fastmcp 4 needs ``mcp>=2``,
while CrewAI (same venv, the ``all`` extra) pins ``mcp<2``. So ``python3 dev.py test`` installs
``fastmcp`` and ``mcp`` (pinned in dev.py, ``MCP_PINS``) with ``pip install --target`` into
``<venv>/mcp-target`` (``PERSISTKIT_MCP_TARGET`` overrides), and every scenario runs in a
subprocess whose ``PYTHONPATH`` puts that directory first; this process keeps ``mcp<2`` and only
reads the store. No target is the service ``mcp`` unavailable (skipped, or failed where
PERSISTKIT_REQUIRE names it).

The agent (``pydantic_ai_mcp_worker.py``, ``FunctionModel``): the MCP tool ``record(1)`` and the
function tool ``local(1)`` in one response, then ``record(2)``, then an answer joining the three
results. Here:

* the run's MCP discovery and calls are recorded steps, in order, each unit run once;
* a replay of the finished run in a new process calls neither the model, nor the function
  tool, nor the MCP server (which is not even started);
* a SIGKILL inside every step of the run (each step on one store, the two taking turns), then
  a resume in a new process: every finished model request, function-tool and MCP call ran
  exactly once, the one in flight at the kill at least once, and the output is the uncrashed
  run's;
* outside ``pk.resume`` the agent with the capability gives the same output and messages as
  without it.

Ported from Pydantic AI's ``tests/test_dbos.py`` (its MCP scenarios, run by
``pydantic_ai_mcp_cases.py`` in one subprocess per store; the newest stored revision of that
file was read, the 2.68.0 tag is not in the mirror): an MCP call and a function-tool call in one
response (``test_complex_agent_run_in_workflow``); ``cache_tools=False``
(``test_mcp_tools_not_cached_when_disabled``); discovery recorded per run
(``test_dbos_mcp_get_tools_recorded_independently_per_run``); an MCP tool error within the
agent's retry budget, the retry crossing the step as a value
(``test_dbos_mcp_tool_inherits_agent_retries``,
``test_dbos_mcp_model_retry_crosses_step_without_engine_retries``); server instructions through
a step, also in a cold process (``test_dbos_mcptoolset_instructions_propagate``,
``..._get_instructions_uses_step_when_server_warm``); id-less, duplicate and colliding
URL-derived ids refused, a shared instance and a derived id accepted
(``test_dbos_durability_rejects_idless_mcp_toolset``, ``..._rejects_duplicate_toolset_id``,
``test_capability_contributed_toolsets_with_colliding_derived_id``,
``..._same_toolset_instance_reused``, ``test_capability_contributed_toolset_id_from_capability``);
an MCP toolset contributed by a capability and one built by a ``DynamicCapability``
(``test_dbos_durability_wraps_capability_contributed_mcp_toolset``,
``..._dynamic_capability_mcp_runs_in_steps``); a runtime MCP toolset refused in ``run`` and
``iter`` inside a run, working outside (``test_dbos_durability_rejects_runtime_mcp_toolset``,
``..._in_iter``). Plus one of our own: a structured result and an image replayed from the store.

Not applicable, and why:

* MCP task routing (``test_dbos_mcptoolset_preserves_task_routing``): needs ``fastmcp-tasks``
  (the ``mcp-tasks`` extra), which the adapter's pin does not install.
* DBOS machinery: ``DBOSAgent`` / ``DBOSMCPToolset`` internals (the wrapper classes,
  ``visit_and_replace``, the private tool-defs cache, ``dbosify_mcp_toolset`` called directly),
  step configs with engine retries, enqueue guards: persistkit has no counterpart (the base
  capability does the wrapping; a step is never retried by the engine).
* ``..._get_instructions_uses_local_when_initialized``: a DBOS wrapper's shortcut that the
  capability's wrapping does not have (instructions are always a step).
* VCR cassettes / ``OpenAIChatModel`` and MCP over HTTP: offline, ``FunctionModel`` and a stdio
  server (the wrapping does not depend on the transport).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim is not installed")

from conftest import make_url, uid, unavailable

import persistkit as pk

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WORKER = HERE / "pydantic_ai_mcp_worker.py"
CASES_SCRIPT = HERE / "pydantic_ai_mcp_cases.py"
TARGET = Path(os.environ.get("PERSISTKIT_MCP_TARGET") or Path(sys.prefix) / "mcp-target")
BOUND = 180.0  # seconds before a process that should end fails the test instead of hanging

#: The worker's steps, in order (``pydantic_ai_mcp_worker.STEPS``: that module needs fastmcp).
STEPS = ["discovery", "model:0", "mcp:1", "local:1", "model:1", "mcp:2", "model:2"]
OUTPUT = "mcp 1 ok | local 1 ok | mcp 2 ok"
RECORDED = [
    "mcp_agent__mcp_server__tests.get_tools",
    "mcp_agent__model.request",
    "mcp_agent__mcp_server__tests.call_tool",
    "mcp_agent__function_toolset__<agent>.call_tool:local",
    "mcp_agent__model.request",
    "mcp_agent__mcp_server__tests.call_tool",
    "mcp_agent__model.request",
]
#: What a whole run does once (the server's discovery is left out: a resumed process's first MCP
#: call lists the server's tools again inside that call, fastmcp checking the result's schema).
UNITS = {"model:0", "mcp:1", "local:1", "model:1", "mcp:2", "model:2"}
#: The ported cases of pydantic_ai_mcp_cases.py.
CASES = [
    "mcp_and_function_tool_calls_in_parallel",
    "mcp_tools_not_cached_when_disabled",
    "get_tools_recorded_independently_per_run",
    "structured_and_image_results_replay",
    "mcp_tool_error_uses_agent_retries_and_replays",
    "mcp_instructions_are_a_step",
    "idless_and_duplicate_mcp_toolsets_refused",
    "capability_contributed_mcp_toolset_is_recorded",
    "dynamic_capability_mcp_runs_in_steps",
    "runtime_mcp_toolset_refused_in_a_run",
]


@pytest.fixture(scope="session")
def mcp_env() -> dict[str, str]:
    """The environment of a process that sees the MCP target first: fastmcp and mcp>=2."""
    if not TARGET.is_dir():
        unavailable("mcp", f"no MCP target at {TARGET}: `python3 dev.py test` installs it")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(p) for p in (TARGET, ROOT, ROOT / "adapters", HERE)),
        "OTEL_SDK_DISABLED": "true",
        "FASTMCP_LOG_LEVEL": "WARNING",
    }
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m, pydantic_ai.mcp; print(m.version('mcp'))"],
        env=env, capture_output=True, text=True, timeout=BOUND, check=False,
    )
    if probe.returncode:
        unavailable("mcp", f"the MCP target at {TARGET} does not import: {probe.stderr[-2000:]}")
    if int(probe.stdout.strip().split(".")[0]) < 2:
        unavailable("mcp", f"the MCP target at {TARGET} gives mcp {probe.stdout.strip()}, not >= 2")
    return env


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


class Worker:
    """Runs of the worker's agent on one thread, each its own process."""

    def __init__(self, env: dict[str, str], url: str, work_dir: Path) -> None:
        self.env, self.url, self.dir, self.thread = env, url, work_dir, uid("pyd-mcp")
        self.store = pk.connect(url)

    def start(self, *options: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(WORKER), "run", self.url, self.thread, str(self.dir), "--run-id", "r1", *options],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env, cwd=ROOT,
        )

    def finish(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        try:
            out, err = proc.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        assert proc.returncode == 0, f"run process failed ({proc.returncode}):\n{err[-4000:]}"
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
        return result

    def killed(self, proc: subprocess.Popen[str]) -> None:
        try:
            _, err = proc.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, f"expected a SIGKILLed run, got {proc.returncode}:\n{err[-4000:]}"

    def effects(self) -> list[str]:
        path = self.dir / "effects.log"
        return path.read_text().splitlines() if path.exists() else []

    def counts(self, suffix: str) -> Counter[str]:
        return Counter(ln.removesuffix(suffix) for ln in self.effects() if ln.endswith(suffix))

    def steps(self) -> list[str]:
        return [cp.step or "" for cp in reversed(self.store.history(self.thread)) if cp.kind == "step"]


@pytest.fixture
def worker(mcp_env: dict[str, str], url: str, tmp_path: Path) -> Iterator[Worker]:
    w = Worker(mcp_env, url, tmp_path)
    yield w
    w.store.close()


def test_the_mcp_call_and_discovery_are_recorded_steps(worker: Worker) -> None:
    result = worker.finish(worker.start())
    assert result["output"] == OUTPUT
    assert result["status"] == "completed"
    assert worker.steps() == RECORDED
    assert worker.counts(" done") == Counter({u: 1 for u in UNITS} | {"discovery": 1})
    assert worker.effects().count("server start") == 1  # one MCP session for the run


def test_a_replay_of_the_finished_run_calls_neither_the_model_nor_the_mcp_server(worker: Worker) -> None:
    first = worker.finish(worker.start())
    before = worker.effects()
    again = worker.finish(worker.start())
    assert again == first  # output, status and the whole message history
    assert worker.effects() == before  # no model request, no tool body, no server started
    assert worker.steps() == RECORDED


#: Each kill position on one store, the stores taking turns (pairwise, issue #35): every step is
#: killed once and each store sees both kinds of unit (an MCP call, a model request).
KILLS = [(("sqlite", "postgres")[i % 2], step) for i, step in enumerate(STEPS)]


@pytest.mark.parametrize(("url", "step"), KILLS, indirect=["url"])
def test_sigkill_at_every_step_then_a_resume_runs_each_finished_call_once(worker: Worker, step: str) -> None:
    worker.killed(worker.start("--kill", step))
    result = worker.finish(worker.start())
    assert result["output"] == OUTPUT
    assert worker.steps() == RECORDED
    done = worker.counts(" done")
    assert {u: done[u] for u in UNITS} == {u: 1 for u in UNITS}, worker.effects()
    begun = worker.counts(" begin")
    # At-least-once for the unit in flight at the kill; every other unit began exactly once.
    assert {u for u in UNITS if begun[u] > 1} == ({step} & UNITS), worker.effects()
    if step == "discovery":
        assert begun["discovery"] >= 2


def test_outside_a_run_the_capability_changes_nothing(mcp_env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(WORKER), "plain", str(tmp_path)],
        env=mcp_env, cwd=ROOT, capture_output=True, text=True, timeout=BOUND, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["durable"] == result["bare"]
    assert result["durable"]["output"] == OUTPUT
    done = Counter(ln.removesuffix(" done") for ln in (tmp_path / "effects.log").read_text().splitlines()
                   if ln.endswith(" done"))
    assert {u: done[u] for u in UNITS} == {u: 2 for u in UNITS}  # live, once per agent


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_ported_dbos_mcp_cases_pass(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mcp_env: dict[str, str]
) -> None:
    """Every case of pydantic_ai_mcp_cases.py on one store, in one process (one test: each case
    was its own test over a module fixture, which every xdist worker that ran one ran again)."""
    store_url = make_url(kind, request, tmp_path_factory, isolated=True)
    work_dir = tmp_path_factory.mktemp("mcp-cases")
    proc = subprocess.run(
        [sys.executable, str(CASES_SCRIPT), store_url, str(work_dir)],
        env=mcp_env, cwd=ROOT, capture_output=True, text=True, timeout=BOUND * 2, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    results: dict[str, str] = json.loads(line.removeprefix("RESULT "))
    assert list(results) == CASES
    assert {case: why for case, why in results.items() if why != "ok"} == {}
