"""The package metadata and namespace a user sees."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import types
import zipfile
from pathlib import Path

import pytest

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it() -> None:
    # A {text = ...} table makes setuptools >= 77 print a deprecation warning per build (PEP 639).
    data = _pyproject()
    project = data["project"]
    assert isinstance(project, dict) and project["license"] == "Apache-2.0"
    requires = data["build-system"]["requires"]  # type: ignore[index]
    assert any(r.replace(" ", "") in ("setuptools>=77", "setuptools>=77.0") for r in requires)


def test_every_package_of_the_source_tree_is_shipped() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])  # type: ignore[index]
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "persistkit").rglob("__init__.py")
    }
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"


def test_public_namespace_holds_only_the_public_api() -> None:
    leaked = [
        name for name in dir(pk)
        if not name.startswith("_") and name not in pk.__all__
        and not isinstance(getattr(pk, name), types.ModuleType)  # subpackages: pk.backends, pk.testing
    ]
    assert leaked == [], f"names in persistkit's namespace that are not in __all__: {leaked}"
    for name in pk.__all__:
        assert getattr(pk, name) is not None


# -- the built wheel, installed as a user installs it ------------------------------------------
#
# `python -m build` writes the sdist and the wheel built from it; the wheel goes with the
# `postgres` extra into a fresh venv (no --system-site-packages, no checkout on the path, run
# from a directory outside the checkout), and that venv runs what a new user runs first.
# The dependencies come from PyPI once: `pip download` fills a wheelhouse under .venv, keyed
# by what it holds, and every later run installs from it with `--no-index`.

#: Installed beside the wheel: what the user's project tests with.
USER_WANTS = ["pytest"]

USER_AGENT = '''
import persistkit as pk


@pk.checkpointed
def fetch(i: int) -> str:
    return f"page {i}"


@pk.checkpointed
def summarize(pages: list[str]) -> str:
    return " / ".join(pages)


def my_agent(thread_id: str) -> str:
    with pk.resume(thread_id) as run:
        pages = [fetch(i) for i in range(3)]
        run.state["summary"] = summarize(pages)
        return run.state["summary"]
'''

USER_TEST = '''
from agent import my_agent


def test_my_agent_resumes(crash_matrix):
    result = crash_matrix(lambda: my_agent("ticket-42"))
    result.assert_exactly_once()
    result.assert_same_outcome()
    assert result.points
'''


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PERSISTKIT_URL", "VIRTUAL_ENV", "PYTHONHOME")}
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _wheelhouse(wants: list[str]) -> Path:
    # keyed by the interpreter and pyproject.toml (what the wheel depends on), not by the
    # wheel's temporary path; USER_WANTS names the rest
    key = hashlib.sha256("\n".join([sys.version, *USER_WANTS, (ROOT / "pyproject.toml").read_text()]).encode())
    house = ROOT / ".venv" / "wheelhouse" / key.hexdigest()[:16]
    if (house / ".complete").exists():
        return house
    fresh = house.with_name(f"{house.name}.{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest", str(fresh),
          *wants], cwd=ROOT)
    for ours in fresh.glob("persistkit-*.whl"):  # the wheel under test comes from its build, never from here
        ours.unlink()
    (fresh / ".complete").write_text("")
    try:
        fresh.rename(house)
    except OSError:  # another xdist worker filled it first
        shutil.rmtree(fresh, ignore_errors=True)
    return house


@pytest.mark.slow
def test_the_built_wheel_runs_the_readme_in_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], cwd=ROOT)
    [wheel] = dist.glob("persistkit-*.whl")
    [sdist] = dist.glob("persistkit-*.tar.gz")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel carries no LICENSE"
    for package in ("persistkit_langgraph", "persistkit_pytest", "persistkit/testing"):
        assert any(n.startswith(package + "/") for n in names), f"the wheel lacks {package}"
    with tarfile.open(sdist) as tf:
        assert any(n.endswith("/LICENSE") for n in tf.getnames()), "the sdist carries no LICENSE"

    wants = [f"{wheel}[postgres]", *USER_WANTS]
    house = _wheelhouse(wants)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(house), *wants],
         cwd=tmp_path)

    project = tmp_path / "project"
    project.mkdir()
    where = _run([str(py), "-c", "import persistkit, psycopg, psycopg_pool; print(persistkit.__file__)"],
                 cwd=project).stdout.strip()
    assert Path(where).is_relative_to(venv), f"persistkit imported from {where}, not from the venv"

    readme = (ROOT / "README.md").read_text()
    quickstart = re.search(r"## Quickstart\s+```python\n(.*?)```", readme, re.S)
    assert quickstart is not None
    out = _run([str(py), "-c", quickstart.group(1)], cwd=project).stdout
    assert out.splitlines()[1:] == ["step 0/0 call_llm", "step 0/1 call_llm", "step 0 agent", "end  completed"]

    helped = _run([str(venv / "bin" / "persistkit"), "--help"], cwd=project).stdout
    assert "usage: persistkit" in helped

    (project / "agent.py").write_text(USER_AGENT)
    (project / "test_agent.py").write_text(USER_TEST)
    tested = _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_agent.py"], cwd=project).stdout
    assert "1 passed" in tested, tested
