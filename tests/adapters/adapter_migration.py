"""Adapter state that changes shape across a crash: the case the combination matrix runs.

    outcome = run_case("langgraph", url, key, "put:b", workdir)
    check(outcome)                      # the v2 agent finished with every v1 value migrated

:func:`run_case` runs the framework's v1 agent (a real LangGraph graph or CrewAI
flow, no model, no network) in a subprocess until it SIGKILLs itself at
``position``, then the v2 agent (fields renamed, value types changed, the
documented migration registered) in a NEW process to the end. :func:`check`
asserts what must hold: the first process died by SIGKILL at that position,
each node/method ran in v1 up to the crash and in v2 from there (at least
once, completed ones not again), and the final state holds every value,
migrated. ``variant="v2-nomigration"`` is the same deploy without the
migration: :func:`check_refused` asserts a ``SchemaVersionError`` naming what
changed and nothing run by v2.

Stores: any URL a new process can open (not ``memory://``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True)
class Framework:
    script: Path
    steps: tuple[str, ...]  # node / method names in run order
    positions: tuple[str, ...]  # where the v1 process can die
    routers: tuple[str, ...] = ()
    #: what the refusal of v2 without a migration must name
    refused: tuple[str, ...] = ()


FRAMEWORKS = {
    "langgraph": Framework(
        HERE / "langgraph_migrate_graph.py",
        steps=("a", "b", "c", "d"),
        # inside a node (before its writes), or after its writes were committed
        positions=("a", "b", "c", "d", "put:a", "put:b", "put:c", "put:d"),
        refused=("SchemaVersionError", "'notes'", "PersistkitSaver(store, version=2)", "@saver.migration(from_version=1)"),
    ),
    "crewai": Framework(
        HERE / "crewai_migrate_flow.py",
        steps=("fetch", "clean", "route", "summarize", "publish"),
        # inside a method, or right after its state was saved
        positions=("fetch", "clean", "route", "summarize", "publish", "saved:fetch", "saved:clean", "saved:summarize"),
        routers=("route",),
        refused=("SchemaVersionError", "Report", "steps"),
    ),
}


@dataclass
class Outcome:
    framework: str
    position: str
    variant: str
    crash_code: int
    code: int
    stdout: str
    stderr: str
    calls: list[str]  # "<variant>:<step>" in the order they ran, both processes
    crash_stderr: str = ""  # the first process's (v1's), shown when it did not die as planned

    def result(self) -> Any:
        marker = "RESULT " if self.framework == "crewai" else ""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("{") or (marker and line.startswith(marker)):
                return json.loads(line[len(marker) :] if line.startswith(marker) else line)
        raise AssertionError(f"no result printed:\n{self.stdout[-2000:]}\n{self.stderr[-3000:]}")


def _env() -> dict[str, str]:
    paths = [str(ROOT), str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_TRACING_ENABLED": "false",
        "OTEL_SDK_DISABLED": "true",
    }


def run_case(framework: str, url: str, key: str, position: str, workdir: Path, *, variant: str = "v2") -> Outcome:
    """v1 until it dies at ``position``, then ``variant`` in a new process to the end."""
    fw = FRAMEWORKS[framework]
    if position not in fw.positions:
        raise ValueError(f"{framework} has no crash position {position!r}; pick one of {fw.positions}")
    log = workdir / f"{framework}-{key}.log".replace("/", "_").replace(":", "_")
    cmd = [sys.executable, str(fw.script)]
    first = subprocess.run([*cmd, "v1", url, key, str(log), position], env=_env(), capture_output=True, text=True, timeout=300)
    second = subprocess.run([*cmd, variant, url, key, str(log), "-"], env=_env(), capture_output=True, text=True, timeout=300)
    calls = log.read_text().split() if log.exists() else []
    return Outcome(framework, position, variant, first.returncode, second.returncode, second.stdout, second.stderr,
                   calls, first.stderr)


def _done_before(fw: Framework, position: str) -> tuple[list[str], list[str]]:
    """The steps v1 ran, and the steps v2 must run."""
    saved = position.split(":", 1)[-1]
    i = fw.steps.index(saved)
    ran = list(fw.steps[: i + 1])
    # put:/saved: its writes / state were committed before the kill; else it was in flight (runs again)
    finished = set(ran) if position.startswith(("put:", "saved:")) else set(ran[:-1])
    finished -= set(fw.routers)  # CrewAI does not record a router's route: it decides again
    rest = [s for s in fw.steps if s not in finished]
    return ran, rest


def check(outcome: Outcome) -> None:
    """The v2 agent finished after the crash, each step at least once, values migrated."""
    fw = FRAMEWORKS[outcome.framework]
    detail = f"{outcome.framework} at {outcome.position}: {outcome.stdout[-1500:]}\n{outcome.stderr[-3000:]}"
    assert outcome.crash_code == -signal.SIGKILL, f"v1 exited {outcome.crash_code}: {outcome.crash_stderr[-3000:]}\n{detail}"
    assert outcome.code == 0, detail
    ran, rest = _done_before(fw, outcome.position)
    v1 = [c.split(":", 1)[1] for c in outcome.calls if c.startswith("v1:")]
    v2 = [c.split(":", 1)[1] for c in outcome.calls if not c.startswith("v1:")]
    assert v1 == ran, (v1, detail)
    assert v2 == rest, (v2, detail)
    if outcome.framework == "langgraph":
        assert outcome.result() == {
            "notes": [[n, i] for i, n in enumerate(fw.steps)],
            "log": [f"{n} done" for n in fw.steps],
            "log_types": ["AIMessage"],
        }, detail
    else:
        assert outcome.result() == {"steps": ["fetch", "clean", "summarize", "publish"], "score": 4}, detail


def check_refused(outcome: Outcome) -> None:
    """v2 without its migration: a SchemaVersionError naming what changed; v2 ran nothing."""
    fw = FRAMEWORKS[outcome.framework]
    detail = f"{outcome.framework} at {outcome.position}: {outcome.stdout[-1500:]}\n{outcome.stderr[-3000:]}"
    assert outcome.crash_code == -signal.SIGKILL, detail
    assert outcome.code == 2, detail
    error = next((line for line in outcome.stdout.splitlines() if line.startswith("ERROR ")), "")
    for word in fw.refused:
        assert word in error, (word, detail)
    assert not [c for c in outcome.calls if not c.startswith("v1:")], detail


def refusal_positions(framework: str) -> tuple[str, ...]:
    """Crash positions after which v1 state is stored, so that v2 without a migration must refuse
    it (LangGraph commits the input's checkpoint before node a; CrewAI saves nothing before fetch returns)."""
    fw = FRAMEWORKS[framework]
    return fw.positions if framework == "langgraph" else tuple(p for p in fw.positions if p != fw.steps[0])
