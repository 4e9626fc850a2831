"""Turns of one thread in real processes (issue #19): a crashed turn keeps its place.

Workers are ``tests/turn_agent.py`` processes, one turn each, on PostgreSQL (the
seeds' deployment) and SQLite. They log events and their step bodies' side effects
to files (fsynced); the tests wait for events, never for time. The checks: no turn
lost, none run twice, each turn's items contiguous and in step order in the thread's
state, no committed step body run twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import make_url

import persistkit as pk

HERE = Path(__file__).resolve().parent
AGENT = HERE / "turn_agent.py"
DEADLINE = 60.0  # seconds any one wait may take before the test fails (a hang, not a timing)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


class Files:
    def __init__(self, tmp: Path) -> None:
        self.log, self.effects = tmp / "log", tmp / "effects"
        self.log.touch()
        self.effects.touch()

    def events(self, run: str, event: str) -> list[list[str]]:
        lines = [line.split(" ") for line in self.log.read_text().splitlines() if line]
        return [e for e in lines if e[0] == run and e[1] == event]

    def bodies(self) -> list[str]:
        return [line for line in self.effects.read_text().splitlines() if line]

    def order(self, event: str) -> list[str]:
        return [e[0] for e in (line.split(" ") for line in self.log.read_text().splitlines() if line) if e[1] == event]


Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


@pytest.fixture
def spawn(files: Files) -> Iterator[Spawn]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(url: str, thread: str, run_id: str, **opts: object) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
        argv = [sys.executable, str(AGENT), url, thread, run_id, str(files.log), str(files.effects), json.dumps(opts)]
        p = subprocess.Popen(argv, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def lease(url: str, thread: str) -> pk.LeaseInfo | None:
    with pk.connect(url) as store:
        found = [i for i in store.leases(prefix=thread) if i.thread_id == thread]
    return found[0] if found else None


def items(url: str, thread: str) -> list[str]:
    with pk.connect(url) as store:
        return list(store.get_state(thread)["items"])


def committed(url: str, thread: str) -> list[str]:
    with pk.connect(url) as store:
        return list(store.get_state(thread)["items"]) if store.history(thread, limit=1) else []


def check_turns(found: list[str], turns: list[str], steps: int) -> None:
    """Each turn's items exactly once, contiguous and in step order, turns in this order."""
    assert found == [f"{t}.{k}" for t in turns for k in range(steps)], found


def test_two_turns_of_one_thread_at_once(url: str, files: Files, spawn: Spawn, tmp_path: Path) -> None:
    thread, go = f"two-{uuid.uuid4().hex}", tmp_path / "go"
    first = spawn(url, thread, "T1", go=str(go))
    until(lambda: files.bodies() == ["T1.0"], "T1 ran its first step")
    second = spawn(url, thread, "T2")
    until(lambda: (info := lease(url, thread)) is not None and len(info.waiting) == 1, "T2 queued")
    go.touch()
    assert first.wait(DEADLINE) == 0 and second.wait(DEADLINE) == 0
    check_turns(items(url, thread), ["T1", "T2"], 3)
    assert Counter(files.bodies()) == Counter(f"{t}.{k}" for t in ("T1", "T2") for k in range(3))
    # (b) a finished turn redelivered replays without running a step
    again = spawn(url, thread, "T1")
    assert again.wait(DEADLINE) == 0
    assert len(files.bodies()) == 6
    check_turns(items(url, thread), ["T1", "T2"], 3)


def test_a_killed_turn_keeps_its_place(url: str, files: Files, spawn: Spawn, tmp_path: Path) -> None:
    """A worker SIGKILLed after step 2 of 4 while the thread's next turn waits behind it;
    a third turn arrives while it is dead; the crashed turn's redelivery arrives last, goes
    first and finishes it; then the other two, in arrival order."""
    thread, go = f"kill-{uuid.uuid4().hex}", tmp_path / "never"
    crashed = spawn(url, thread, "A", steps=4, at=2, go=str(go))
    until(lambda: committed(url, thread) == ["A.0", "A.1"], "A committed two steps")
    b = spawn(url, thread, "B", steps=4)
    until(lambda: (i := lease(url, thread)) is not None and len(i.waiting) == 1, "B queues behind A")
    crashed.send_signal(signal.SIGKILL)
    crashed.wait(DEADLINE)
    until(lambda: (i := lease(url, thread)) is not None and i.reserved_for == "A" and len(i.waiting) == 1, "B waits for A")
    c = spawn(url, thread, "C", steps=4)
    until(lambda: (i := lease(url, thread)) is not None and len(i.waiting) == 2, "C queues behind B")
    assert files.events("B", "enter") == [] and files.events("C", "enter") == []
    redelivered = spawn(url, thread, "A", steps=4)
    for p in (redelivered, b, c):
        assert p.wait(DEADLINE) == 0
    assert files.order("enter") == ["A", "A", "B", "C"]
    check_turns(items(url, thread), ["A", "B", "C"], 4)
    bodies = files.bodies()
    assert Counter(bodies) == Counter(f"{t}.{k}" for t in "ABC" for k in range(4)), bodies  # none ran twice


def test_the_wait_ends_at_busy_timeout_then_by_abandon(url: str, files: Files, spawn: Spawn, tmp_path: Path) -> None:
    thread, go = f"abandon-{uuid.uuid4().hex}", tmp_path / "never"
    crashed = spawn(url, thread, "A", steps=3, at=2, go=str(go))
    until(lambda: committed(url, thread) == ["A.0", "A.1"], "A committed two steps")
    crashed.send_signal(signal.SIGKILL)
    crashed.wait(DEADLINE)
    late = spawn(url, thread, "B", timeout=0.2)
    assert late.wait(DEADLINE) == 3
    assert files.events("B", "busy") == [["B", "busy", "A"]]
    b = spawn(url, thread, "B")
    until(lambda: (i := lease(url, thread)) is not None and len(i.waiting) == 1, "B waits for A")
    cli = subprocess.run(
        [sys.executable, "-m", "persistkit", "abandon", thread, "A", "--url", url, "--json"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])},
        capture_output=True, text=True, timeout=DEADLINE,
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["run_status"] == "abandoned"
    assert b.wait(DEADLINE) == 0
    assert items(url, thread) == ["A.0", "A.1", "B.0", "B.1", "B.2"]  # A's committed steps stay
    redelivered = spawn(url, thread, "A", steps=3)
    assert redelivered.wait(DEADLINE) == 5
    assert files.bodies().count("A.2") == 0


def test_a_finished_turn_redelivered_behind_a_live_turn_replays_at_once(
    url: str, files: Files, spawn: Spawn, tmp_path: Path
) -> None:
    """docs/coordination.md: a redelivered turn that finished replays without running a
    step and waits for nothing, even with busy="reject" while another turn holds the thread."""
    thread, go = f"nowait-{uuid.uuid4().hex}", tmp_path / "go"
    assert spawn(url, thread, "T1").wait(DEADLINE) == 0
    live = spawn(url, thread, "T2", go=str(go))
    until(lambda: files.bodies()[-1:] == ["T2.0"], "T2 ran its first step and waits")
    for opts in ({"busy": "reject"}, {"timeout": 0}, {}):
        again = spawn(url, thread, "T1", **opts)
        assert again.wait(DEADLINE) == 0  # while T2 still holds the thread
    assert live.poll() is None and files.events("T2", "exit") == []
    assert files.bodies() == ["T1.0", "T1.1", "T1.2", "T2.0"]  # the redeliveries ran nothing
    go.touch()
    assert live.wait(DEADLINE) == 0
    check_turns(items(url, thread), ["T1", "T2"], 3)
