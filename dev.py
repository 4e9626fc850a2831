#!/usr/bin/env python3
"""Project tasks. Needs only Python 3.11+; sets up ./.venv with everything itself.

    python3 dev.py demo      run the quickstart demo (crash at step 14, resume)
    python3 dev.py test      lint (ruff), the whole test suite and, beside it, types (mypy
                             --strict; its report follows the tests') (installs chromium for
                             the timeline page's browser test and valgrind for the
                             instruction-count gate when missing, as root); prints its
                             time. It runs on three pytest-xdist workers (PERSISTKIT_TEST_WORKERS=0
                             or -n 0: serial)
    python3 dev.py test --quick
                             the quick tier: memory and SQLite stores, no service, no
                             framework, no browser, no lint (docs/testing.md); prints its time
    python3 dev.py bench     the benchmarks under bench/ (installs the peers they compare with)
    python3 dev.py mutants   past defects (CHANGELOG) planted one at a time in a scratch copy,
                             and which test tier catches each (scripts/mutants.py)

Extra arguments after ``test`` go to pytest (``python3 dev.py test -k sqlite``; ``-n 3`` runs
on three pytest-xdist workers, the default; ``-n 0`` serial).
``bench`` takes script names to run only those (``python3 dev.py bench sqlite servers``);
other arguments go to every script run (``python3 dev.py bench servers --rounds 9``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
#: The MCP side of tests/adapters/test_pydantic_ai_mcp.py, outside the venv's own packages:
#: pydantic-ai-slim's ``MCPToolset`` needs fastmcp, fastmcp 4 needs mcp>=2, and crewai (the
#: ``all`` extra) pins mcp<2. ``pip install --target`` puts what these pins need beyond the
#: venv into MCP_TARGET; the test's subprocess puts it first on PYTHONPATH (the test finds
#: it as ``<venv>/mcp-target``).
MCP_PINS = ("fastmcp==4.2.3", "mcp==2.3.0")
MCP_TARGET = VENV / "mcp-target"


def sh(*cmd: str | Path, check: bool = True) -> int:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, check=check).returncode


def ensure_venv(extras: str) -> None:
    """Create .venv and install the project with ``extras`` when pyproject.toml changed."""
    if sys.version_info < (3, 11):  # noqa: UP036 -- dev.py runs under whatever python3 the user has
        sys.exit(f"persistkit needs Python 3.11+, this is {sys.version.split()[0]}")
    stamp = VENV / f".installed-{extras.replace(',', '-')}"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want and PY.exists():
        return
    if not PY.exists():
        sh(sys.executable, "-m", "venv", VENV)
    sh(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    sh(PY, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]")
    stamp.write_text(want)


def ensure_core() -> None:
    """Create .venv and install persistkit into it, editable, with its own dependencies only
    (no extras), when pyproject.toml changed: ``.venv/bin/python`` then imports persistkit,
    so any block of the README or docs/ pasted into it runs (a store or a framework it names
    needs its extra: ``.venv/bin/pip install -e ".[postgres]"``)."""
    if sys.version_info < (3, 11):  # noqa: UP036 -- dev.py runs under whatever python3 the user has
        sys.exit(f"persistkit needs Python 3.11+, this is {sys.version.split()[0]}")
    stamp = VENV / ".installed-core"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want and PY.exists():
        return
    if not PY.exists():
        sh(sys.executable, "-m", "venv", VENV)
    sh(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    # PYTHONWARNINGS reaches the build backend: setuptools prints an information box for an
    # editable install of a package-dir mapping (the adapters/ packages), with nothing to act on.
    print("+", PY, "-m pip install --quiet -e .", flush=True)
    subprocess.run([str(PY), "-m", "pip", "install", "--quiet", "-e", "."], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"})
    stamp.write_text(want)


def ensure_mcp_target() -> None:
    """Install ``MCP_PINS`` into ``MCP_TARGET`` when missing or when the pins or the venv
    (pyproject.toml) changed: only what they need beyond the venv (pip resolves them against
    it, then installs that list, exact versions, without dependencies, into a fresh
    directory). A failure is reported, not fatal: the test then says ``mcp`` is unavailable
    (a failure where PERSISTKIT_REQUIRE names it)."""
    stamp = VENV / ".installed-mcp-target"
    want = hashlib.sha256("\n".join([*MCP_PINS, (ROOT / "pyproject.toml").read_text()]).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == want and MCP_TARGET.is_dir():
        return
    print("+ installing", " ".join(MCP_PINS), "into", MCP_TARGET, flush=True)
    plan = subprocess.run(
        [str(PY), "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", *MCP_PINS],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    try:
        needed = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in json.loads(plan.stdout)["install"]]
    except (ValueError, KeyError, TypeError):
        print(f"{' '.join(MCP_PINS)} could not be resolved: tests/adapters/test_pydantic_ai_mcp.py reports "
              f"mcp unavailable\n{plan.stderr[-2000:]}", flush=True)
        return
    fresh = MCP_TARGET.with_name(MCP_TARGET.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    if sh(PY, "-m", "pip", "install", "--quiet", "--no-deps", "--target", fresh, *needed, check=False):
        print("the MCP target could not be installed: tests/adapters/test_pydantic_ai_mcp.py reports "
              "mcp unavailable", flush=True)
        shutil.rmtree(fresh, ignore_errors=True)
        return
    shutil.rmtree(MCP_TARGET, ignore_errors=True)
    fresh.rename(MCP_TARGET)
    stamp.write_text(want)


def demo() -> int:
    # The demo is SQLite only: the core dependencies are all it needs (installing every
    # framework extra took ~60 s of a first run). The package is installed (editable), not
    # put on PYTHONPATH, so the venv the demo leaves behind runs the docs' blocks as well.
    ensure_core()
    print("+", PY, "examples/quickstart.py", flush=True)
    return subprocess.run([str(PY), "examples/quickstart.py"], cwd=ROOT, check=False).returncode


def _apt_install(package: str, test: str, service: str) -> None:
    """``apt-get install -y package`` (only as root, on Debian or Ubuntu); otherwise, or when it
    fails, say so: ``test`` then reports ``service`` unavailable (a failure where
    PERSISTKIT_REQUIRE names it)."""
    apt = shutil.which("apt-get")
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if apt is None or not root or not Path("/etc/debian_version").exists():
        print(f"{package} is not installed and dev.py installs it only as root on Debian/Ubuntu "
              f"(apt-get install -y {package}): {test} reports {service} unavailable", flush=True)
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([apt, "update"], [apt, "install", "-y", "--no-install-recommends", package]):
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode:
            print(f"{package} could not be installed: {test} reports {service} unavailable", flush=True)
            return


def ensure_chromium() -> None:
    """Install Debian's ``chromium`` for the timeline page's browser test when it is missing."""
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return
    print("installing chromium for tests/test_timeline_browser.py (the timeline page in a browser)", flush=True)
    _apt_install("chromium", "tests/test_timeline_browser.py", "chromium")


def ensure_valgrind() -> None:
    """Install ``valgrind`` for the instruction-count gate (tests/test_instruction_budget.py) when missing."""
    if shutil.which("valgrind"):
        return
    print("installing valgrind for tests/test_instruction_budget.py (the step path's instruction budget)", flush=True)
    _apt_install("valgrind", "tests/test_instruction_budget.py", "valgrind")


#: pytest-xdist workers of the whole suite (``dev.py test``; PERSISTKIT_TEST_WORKERS=0 or ``-n 0``:
#: serial). Three on two cores: the suite's process tests wait on their children part of the
#: time (tests/conftest.py isolates each worker: docs/testing.md). The quick tier runs on two.
TEST_WORKERS = os.environ.get("PERSISTKIT_TEST_WORKERS", "3")
#: The quick tier's venv: persistkit's own dependencies and the test runner (extra ``test-core``).
QUICK_EXTRAS = "test-core"


def _has_workers_option(args: list[str]) -> bool:
    """Whether the user's pytest arguments choose the workers themselves (``-n``, ``--dist``, no xdist)."""
    return any(a in {"--numprocesses", "no:xdist", "-pno:xdist"} or a.startswith(("-n", "--numprocesses=", "--dist"))
               for a in args)


def _elapsed(start: float) -> str:
    seconds = int(time.monotonic() - start)
    return f"{seconds // 60} min {seconds % 60:02d} s"


def test(args: list[str]) -> int:
    """``test``: lint, types and the whole suite; ``test --quick``: the quick tier. Prints the wall time."""
    start = time.monotonic()
    if "--quick" in args:
        failed = test_quick([a for a in args if a != "--quick"])
        what = "quick tier"
    else:
        failed = test_full(args)
        what = "lint, types and the whole suite"
    print(f"dev.py test: {what} {'FAILED' if failed else 'passed'} in {_elapsed(start)} (wall)", flush=True)
    return 1 if failed else 0


def test_quick(args: list[str]) -> int:
    """The quick tier (tests/conftest.py, PERSISTKIT_TIER=quick): memory and SQLite stores,
    no service, no framework extra, no browser, no lint. It runs in the full venv when that
    one is current, else it installs only ``persistkit[test-core]`` into .venv."""
    full = VENV / ".installed-all-test"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not (full.exists() and full.read_text() == want and PY.exists()):
        ensure_venv(QUICK_EXTRAS)
    os.environ["PERSISTKIT_TIER"] = "quick"
    workers = [] if _has_workers_option(args) else ["-n", "2", "--dist", "worksteal"]  # its work is CPU: one worker per core
    return sh(PY, "-m", "pytest", *workers, *args, check=False)


def test_full(args: list[str]) -> int:
    ensure_venv("all,test")
    ensure_chromium()
    ensure_valgrind()
    ensure_mcp_target()
    # The coverage-guided fuzzer where a wheel exists; without it the fuzz tests
    # still run on hypothesis and the atheris run is skipped (and says so).
    if not (VENV / ".atheris-tried").exists():
        sh(PY, "-m", "pip", "install", "--quiet", "--only-binary", ":all:", "atheris", check=False)
        (VENV / ".atheris-tried").write_text("")
    failed = 0
    failed |= sh(PY, "-m", "ruff", "check", "persistkit", "adapters", "tests", "examples", "bench", "scripts", "dev.py", check=False)
    if (ROOT / "scripts" / "unasync.py").exists():
        failed |= sh(PY, "scripts/unasync.py", "--check", check=False)
    # mypy --strict reads the frameworks' own sources (about 95 s of one core from a fresh
    # clone): it runs beside the tests, at a lower priority (the tests wait on servers and
    # processes much of the time, and it takes that time), and its report follows theirs
    types = _beside("mypy", [PY, "-m", "mypy"])
    # worksteal: each worker starts on a contiguous share of the suite (a module's tests stay
    # together, its fixtures made once) and an idle worker takes half of a busy one's queue, so
    # the run does not end with one worker alone on a few long moto or process tests
    workers = [] if _has_workers_option(args) or TEST_WORKERS == "0" else ["-n", TEST_WORKERS, "--dist", "worksteal"]
    failed |= sh(PY, "-m", "pytest", *workers, *args, check=False)
    failed |= types()
    return 1 if failed else 0


def _beside(name: str, cmd: list[str | Path]) -> Callable[[], int]:
    """Start ``cmd`` now, niced, its output kept; the returned call waits for it, prints
    what it said and returns its exit code."""
    print("+", " ".join(str(c) for c in cmd), "(beside the tests: its report follows them)", flush=True)
    out = tempfile.TemporaryFile()  # noqa: SIM115 -- read and closed by finish(), after the tests
    proc = subprocess.Popen(
        [str(c) for c in cmd], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.nice(10),  # dev.py starts no thread: a fork here is safe
    )

    def finish() -> int:
        code = proc.wait()
        out.seek(0)
        print(f"--- {name} ({'failed' if code else 'passed'}):", flush=True)
        sys.stdout.buffer.write(out.read())
        sys.stdout.flush()
        out.close()
        return code

    return finish


def bench(args: list[str]) -> int:
    scripts = sorted((ROOT / "bench").glob("bench_*.py"))
    names = {s.stem.removeprefix("bench_"): s for s in scripts}
    chosen = [names[a.removeprefix("bench_").removesuffix(".py")] for a in args
              if a.removeprefix("bench_").removesuffix(".py") in names]
    rest = [a for a in args if a.removeprefix("bench_").removesuffix(".py") not in names]
    ensure_venv("all,bench")
    failed = 0
    for script in chosen or scripts:
        failed |= sh(PY, script, *rest, check=False)
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"demo", "test", "bench", "mutants"}:
        print(__doc__)
        return 2
    task, rest = sys.argv[1], sys.argv[2:]
    if task == "demo":
        return demo()
    if task == "test":
        return test(rest)
    if task == "mutants":  # past defects planted in a scratch copy: which tier catches each
        ensure_venv("all,test")
        return sh(PY, "scripts/mutants.py", *rest, check=False)
    return bench(rest)


if __name__ == "__main__":
    sys.exit(main())
