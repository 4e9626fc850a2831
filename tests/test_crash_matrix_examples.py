"""The crash-matrix examples users copy (examples/testing/test_*.py: a LangGraph graph, an
OpenAI Agents SDK agent wrapped by durable(), a CrewAI crew run by durable_kickoff) pass as
users run them: ``pytest <file>`` in a new process, the ``crash_matrix`` fixture coming from
the installed plugin's entry point, no conftest of this suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "testing").glob("test_*.py"))
FRAMEWORK = {"langgraph": "langgraph", "openai_agents": "agents", "crewai": "crewai"}


def test_there_is_an_example_per_adapter() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "test_langgraph_agent.py",
        "test_openai_agents_agent.py",
        "test_crewai_crew.py",
    } <= names


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_example_passes_under_pytest(example: Path, tmp_path: Path) -> None:
    for key, module in FRAMEWORK.items():
        if key in example.stem:
            pytest.importorskip(module)
    env = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(example),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, f"{example.name}:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}"
    assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout[-2000:]
