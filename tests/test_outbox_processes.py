"""After-commit effects across real processes killed with SIGKILL (issue #21).

The agent (``tests/outbox_agent.py``) runs a three-step turn; each step posts a reply
with ``after_commit`` to a receiver file (``key text`` lines, fsynced). A kill between a
step's commit and its effect: the effect runs exactly once, by the next resume or by
``drain_outbox`` from another process. A kill after the effect and before its done mark:
it runs again with the same key, and a receiver that deduplicates by key sees it once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_url

HERE = Path(__file__).resolve().parent
AGENT = HERE / "outbox_agent.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory, isolated=True)


def agent(url: str, thread: str, run_id: str, receiver: Path, mode: str) -> tuple[int, dict[str, object] | None]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(AGENT), url, thread, run_id, str(receiver), mode],
                       env=env, capture_output=True, text=True, timeout=120)
    if p.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"agent failed ({p.returncode}): {p.stderr}")
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else None)


def posts(receiver: Path) -> list[tuple[str, str]]:
    return [tuple(line.split(" ")) for line in receiver.read_text().splitlines() if line]  # type: ignore[misc]


def test_a_kill_between_commit_and_effect_is_settled_by_the_next_resume(url: str, tmp_path: Path) -> None:
    receiver, thread = tmp_path / "posts", f"outbox-{uuid.uuid4().hex}"
    receiver.touch()
    code, _ = agent(url, thread, "r1", receiver, "before:1")
    assert code == -signal.SIGKILL
    assert [text for _, text in posts(receiver)] == ["t0"]  # step 1 committed, its post did not run
    code, out = agent(url, thread, "r1", receiver, "-")
    assert out == {"out": ["t0", "t1", "t2"], "status": "completed"}
    got = posts(receiver)
    assert [text for _, text in got] == ["t0", "t1", "t2"]  # each exactly once, in order
    assert len({key for key, _ in got}) == 3


def test_a_kill_between_commit_and_effect_is_settled_by_a_drain(url: str, tmp_path: Path) -> None:
    receiver, thread = tmp_path / "posts", f"outbox-{uuid.uuid4().hex}"
    receiver.touch()
    code, _ = agent(url, thread, "r1", receiver, "before:1")
    assert code == -signal.SIGKILL
    code, out = agent(url, thread, "-", receiver, "drain")  # another process, a sweeper
    assert out is not None and len(out["done"]) == 1 and out["failed"] == [] and out["skipped"] == []  # type: ignore[arg-type]
    assert [text for _, text in posts(receiver)] == ["t0", "t1"]
    code, out = agent(url, thread, "-", receiver, "drain")
    assert out == {"done": [], "failed": [], "skipped": []}
    code, out = agent(url, thread, "r1", receiver, "-")  # the run goes on: nothing twice
    assert out == {"out": ["t0", "t1", "t2"], "status": "completed"}
    got = posts(receiver)
    assert [text for _, text in got] == ["t0", "t1", "t2"] and len({key for key, _ in got}) == 3


def test_a_kill_after_the_effect_runs_it_again_with_the_same_key(url: str, tmp_path: Path) -> None:
    receiver, thread = tmp_path / "posts", f"outbox-{uuid.uuid4().hex}"
    receiver.touch()
    code, _ = agent(url, thread, "r1", receiver, "after:1")
    assert code == -signal.SIGKILL
    code, out = agent(url, thread, "r1", receiver, "-")
    assert out == {"out": ["t0", "t1", "t2"], "status": "completed"}
    got = posts(receiver)
    assert [text for _, text in got] == ["t0", "t1", "t1", "t2"]  # what can still happen twice
    assert Counter(key for key, _ in got)[got[1][0]] == 2 and got[1][0] == got[2][0]  # the same key
    deduplicated = dict(reversed(got))  # a receiver that keeps the first post of each key
    assert sorted(deduplicated.values()) == ["t0", "t1", "t2"]
