"""The OpenAI Agents SDK's own session tests, run against ``PersistkitSession``.

The contract is the SDK's suite, not our reading of it: ``tests/memory/test_session.py``
and ``tests/memory/test_session_limit.py`` of the installed release are taken from
that release's sdist on PyPI (``pip download --no-binary :all:``; nothing of the
SDK is kept in this repository), and run by pytest with ``sdk_session_shim``,
which puts ``PersistkitSession`` where the tests build a ``SQLiteSession``.
The sdist is cached per release under ``<venv>/persistkit-sdk-tests``
(``PERSISTKIT_SDK_TESTS_CACHE`` overrides). pyproject.toml's ``test`` extra
pins the release, so CI always runs the suite of the SDK it installs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed")
pytest.importorskip("pytest_asyncio", reason="the SDK's tests need pytest-asyncio (the test extra)")

from sdk_session_shim import EXCLUDED

ROOT = Path(__file__).resolve().parents[2]
SUITE = ["tests/memory/test_session.py", "tests/memory/test_session_limit.py"]


def _pinned() -> str:
    pin = re.search(r'"openai-agents==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml's test extra must pin openai-agents==<release> (the suite run here)"
    return pin.group(1)


def _sdk_source(version: str) -> Path:
    """The unpacked sdist of openai-agents ``version`` (downloaded once per cache)."""
    cache = Path(os.environ.get("PERSISTKIT_SDK_TESTS_CACHE") or Path(sys.prefix) / "persistkit-sdk-tests")
    root = cache / f"openai_agents-{version}"
    if (root / ".complete").exists():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"openai-agents=={version}", "-d", tmp],
            capture_output=True, text=True, timeout=600,
        )
        assert got.returncode == 0, (
            f"could not download the sdist of openai-agents=={version} from the package index "
            f"(the SDK's own session tests come from it):\n{got.stderr[-3000:]}"
        )
        (sdist,) = Path(tmp).glob("openai_agents-*.tar.gz")
        with tarfile.open(sdist) as tar:
            prefix = f"openai_agents-{version}/"
            members = [m for m in tar.getmembers()
                       if m.name.startswith((prefix + "tests/", prefix + "pyproject.toml"))]
            assert any(m.name == prefix + SUITE[0] for m in members), (
                f"the sdist of openai-agents=={version} no longer ships {SUITE[0]}"
            )
            tar.extractall(tmp, members=members, filter="data")
        shutil.rmtree(root, ignore_errors=True)
        Path(tmp, f"openai_agents-{version}").rename(root)
    (root / ".complete").write_text("")
    return root


def test_the_pinned_release_is_the_installed_one() -> None:
    assert metadata.version("openai-agents") == _pinned(), (
        "the installed openai-agents is not the release pinned in pyproject.toml's test extra: "
        "reinstall with `pip install -e .[all,test]` (python3 dev.py test does)"
    )


@pytest.mark.slow
def test_the_sdk_session_suite_passes_with_persistkit_session(tmp_path: Path) -> None:
    src = _sdk_source(metadata.version("openai-agents"))
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), str(ROOT), str(ROOT / "adapters")])
    env["PK_SDK_SUITE_REPORT"] = str(report)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "sdk_session_shim", "-p", "no:cacheprovider",
         "-c", str(src / "pyproject.toml"), "--rootdir", str(src), f"--junitxml={junit}",
         "-q", "-o", "timeout=120", *SUITE],
        cwd=src, env=env, capture_output=True, text=True, timeout=900,
    )
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, f"the SDK's session tests failed with PersistkitSession:\n{tail}"

    done = json.loads(report.read_text())
    # The run proves something only if the tests built our sessions, and every exclusion
    # (listed in the adapter page) still names a test of this release.
    assert done["session_classes"] == ["PersistkitSession"] and done["sessions_created"] >= 40, done
    stale = sorted(set(EXCLUDED) - set(done["excluded_seen"]))
    assert not stale, f"excluded tests no longer in the SDK's suite (drop them from EXCLUDED and the docs): {stale}"
    cases = ET.parse(junit).getroot().iter("testcase")
    outcomes = {f"{c.get('classname')}::{c.get('name')}": [e.tag for e in c] for c in cases}
    ran = [k for k, v in outcomes.items() if not v]
    skipped = [k for k, v in outcomes.items() if "skipped" in v]
    assert not skipped, f"SDK tests skipped, not run: {skipped}"
    assert len(ran) == len(done["collected"]) - sum(
        1 for nodeid in done["collected"] if re.sub(r"\[.*\]$", "", nodeid.rsplit("::", 1)[1]) in EXCLUDED
    ), tail


def test_the_adapter_page_lists_exactly_the_excluded_tests() -> None:
    page = (ROOT / "docs" / "adapters-openai-agents.md").read_text()
    section = page.split("## The SDK's own session tests", 1)
    assert len(section) == 2, "docs/adapters-openai-agents.md lost its section '## The SDK's own session tests'"
    listed = set(re.findall(r"`(test_\w+)`", section[1].split("\n## ", 1)[0]))
    assert listed == set(EXCLUDED), (
        f"docs/adapters-openai-agents.md lists {sorted(listed - set(EXCLUDED))} not excluded and "
        f"misses {sorted(set(EXCLUDED) - listed)}"
    )
