"""Every script in examples/ runs from the command its docstring gives, with the extras it names.

A docstring names its command (``python examples/<file>.py`` or ``pytest examples/...``) and
the extras it needs (``pip install 'persistkit[crypto]'`` or ``needs persistkit[crewai]``).
Two checks: the extras named provide every third-party module the example imports (read from
pyproject.toml and the installed distributions' requirements, so a missing extra fails here
rather than in a reader's fresh venv), and the docstring's first command runs and exits 0 —
here, or in the test named by RUN_ELSEWHERE that already runs that command (a worker with a
broker, a crash matrix under pytest: run twice it would only cost time).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.relative_to(ROOT).as_posix() for p in [*(ROOT / "examples").glob("*.py"),
                                                           *(ROOT / "examples" / "testing").glob("test_*.py")])
COMMAND = re.compile(r"^\s*((?:python|pytest)\s+examples/\S+\.py.*?)\s*(?:#.*)?$", re.M)
EXTRAS = re.compile(r"persistkit\[([a-z0-9,_-]+)\]")
#: The examples whose docstring command another test already runs, and that test.
RUN_ELSEWHERE = {
    "examples/quickstart.py": "tests/test_docs_examples.py",  # the demo's output, step by step
    "examples/slack_thread.py": "tests/test_slack_thread.py",  # the demo and --chaos
    "examples/celery_worker.py": "tests/test_celery.py",  # workers on RabbitMQ, killed mid-turn
    "examples/celery_beat_timers.py": "tests/test_celery_beat.py",  # a worker and beat
    "examples/celery_children.py": "tests/test_celery_children.py",  # a supervisor's children on a worker
    "examples/sse_chat.py": "tests/test_sse_chat.py",  # a server, killed workers, a reconnecting client
    "examples/testing/test_crewai_crew.py": "tests/test_crash_matrix_examples.py",
    "examples/testing/test_langgraph_agent.py": "tests/test_crash_matrix_examples.py",
    "examples/testing/test_openai_agents_agent.py": "tests/test_crash_matrix_examples.py",
}
#: Modules of this repository, not of a distribution.
LOCAL = {"persistkit", "examples", "persistkit_langgraph", "persistkit_openai_agents", "persistkit_crewai",
         "persistkit_pytest", "persistkit_pydantic_ai"}


def docstring(example: str) -> str:
    return ast.get_docstring(ast.parse((ROOT / example).read_text())) or ""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def provided(extras: set[str]) -> set[str]:
    """The distributions installing persistkit with ``extras`` brings: its own requirements and
    theirs, transitively (as installed here)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        todo += [Requirement(r) for r in project["optional-dependencies"][extra]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        if name == "persistkit":  # persistkit[a,b] inside an extra: those extras
            todo += [Requirement(r) for e in req.extras for r in project["optional-dependencies"][e]]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(sub)
    return seen


def imported(example: str) -> set[str]:
    tree = ast.parse((ROOT / example).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - LOCAL - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_docstring_gives_the_command_and_the_extras_it_needs(example: str) -> None:
    doc = docstring(example)
    commands = COMMAND.findall(doc)
    assert any(example in c for c in commands), (
        f"{example}: its docstring gives no command that runs it ('python {example}' or 'pytest {example}' "
        f"on a line of its own); found {commands}")
    named = {e for group in EXTRAS.findall(doc) for e in group.split(",")}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    unknown = sorted(named - set(extras))
    assert not unknown, f"{example}: its docstring names extras {unknown} that pyproject.toml does not define"
    by_module = md.packages_distributions()
    have = provided(named)
    if commands[0].startswith("pytest"):
        have.add("pytest")  # the command is pytest itself: the reader's test runner
    missing = {}
    for module in sorted(imported(example)):
        dists = {_norm(d) for d in by_module.get(module, [])}
        if not dists:
            pytest.fail(f"{example} imports {module}, which no installed distribution provides: install the "
                        f"extras the docstring names ({sorted(named)}) to check it", pytrace=False)
        if not dists & have:
            missing[module] = sorted(dists)
    assert not missing, (
        f"{example} imports {missing} (module: distributions), which 'pip install \"persistkit[{','.join(sorted(named))}]\"' "
        "does not install: name the extra that brings it in the docstring (pip install 'persistkit[...]')")


@pytest.mark.parametrize("example", sorted(RUN_ELSEWHERE))
def test_an_example_run_elsewhere_is_run_there(example: str) -> None:
    assert example in EXAMPLES, f"RUN_ELSEWHERE names {example}, which is not an example any more"
    test = (ROOT / RUN_ELSEWHERE[example]).read_text()
    stem = Path(example).stem
    assert stem in test, f"{RUN_ELSEWHERE[example]} does not run {example} (RUN_ELSEWHERE says it does)"


@pytest.mark.slow
@pytest.mark.parametrize("example", [e for e in EXAMPLES if e not in RUN_ELSEWHERE])
def test_the_example_runs_from_its_docstring_command(example: str, tmp_path: Path) -> None:
    command = shlex.split(COMMAND.findall(docstring(example))[0])
    argv = [sys.executable, *(["-m", "pytest", "-q", "-p", "no:cacheprovider"] if command[0] == "pytest" else []),
            *(str(ROOT / a) if a.startswith("examples/") else a for a in command[1:])]
    env = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    # the checkout stands in for the installed wheel (persistkit and its adapters' packages)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")])
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, (
        f"{example}: '{' '.join(command)}' (its docstring's command) exits {out.returncode}\n"
        f"--- stdout ---\n{out.stdout[-2000:]}\n--- stderr ---\n{out.stderr[-3000:]}")
