"""Leases between real processes, on every store that several processes can share.

Workers are ``tests/lease_agent.py`` processes; they append events to a log file
(fsynced) and the test waits for events in it, never for time. TTLs are 1-2 s;
each test is bounded by a pytest timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import make_url, uid

import persistkit as pk

HERE = Path(__file__).resolve().parent
AGENT = HERE / "lease_agent.py"
SHARED = ["sqlite", "postgres", "redis", "s3"]  # memory:// lives in one process
DEADLINE = 90.0  # seconds any one wait may take before the test fails (a hang, not a timing)


@pytest.fixture(params=SHARED)
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def lines(self) -> list[list[str]]:
        # [name, event, rest]: "enter" rest is "token time run_id", "step" rest the step number
        return [line.split(" ", 2) for line in self.path.read_text().splitlines() if line]

    def events(self, name: str | None = None, event: str | None = None) -> list[list[str]]:
        return [e for e in self.lines() if (name is None or e[0] == name) and (event is None or e[1] == event)]

    def wait(self, name: str, event: str, count: int = 1, procs: list[subprocess.Popen[bytes]] = ()) -> list[list[str]]:  # type: ignore[assignment]
        deadline = time.monotonic() + DEADLINE
        while len(found := self.events(name, event)) < count:
            dead = [p for p in procs if p.poll() not in (None, 0, 3, 4)]
            assert not dead, f"a worker died ({dead[0].returncode}) before {name} {event}: {self.lines()}"
            assert time.monotonic() < deadline, f"no {name} {event} after {DEADLINE} s: {self.lines()}"
            time.sleep(0.02)
        return found


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(url: str, thread: str, name: str, log: Log, **opts: object) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
        p = subprocess.Popen([sys.executable, str(AGENT), url, thread, name, str(log.path), json.dumps(opts)], env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait(timeout=30)


def _enter(log: Log, name: str) -> list[str]:
    """[token, time, run_id] of ``name``'s enter event."""
    return log.events(name, "enter")[0][2].split()


def _waiting(url: str, thread: str) -> int:
    with pk.connect(url) as store:
        found = [lease for lease in store.leases(prefix=thread) if lease.thread_id == thread]
    return len(found[0].waiting) if found else 0


def _wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("busy", ["wait", "reject", "queue"])
def test_two_processes_one_thread(url: str, busy: str, tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    thread, log, go = uid("two"), Log(tmp_path / "log"), tmp_path / "go"
    first = spawn(url, thread, "A", log, busy=busy, ttl=2.0, go=str(go))
    log.wait("A", "step", procs=[first])  # A holds the lease, between its steps
    second = spawn(url, thread, "B", log, busy=busy, ttl=2.0)
    if busy == "reject":
        assert second.wait(timeout=DEADLINE) == 3
        [busy_line] = log.events("B", "busy")
        message = json.loads(busy_line[2])  # names the holder (host:pid:tag) and its expiry
        assert f":{first.pid}:" in message and "holds its lease until" in message
    elif busy == "queue":
        _wait_until(lambda: _waiting(url, thread) == 1, "B to queue")
    else:
        log.wait("B", "started", procs=[second])
    assert log.events("B", "enter") == []  # A still holds it: B has not entered
    go.touch()
    assert first.wait(timeout=DEADLINE) == 0
    if busy != "reject":
        assert second.wait(timeout=DEADLINE) == 0
        order = [(e[0], e[1]) for e in log.lines() if e[1] in ("enter", "leave")]
        assert order == [("A", "enter"), ("A", "leave"), ("B", "enter"), ("B", "leave")]
        # B started a new run after A's completed one: it did not join A's
        assert _enter(log, "A")[2] != _enter(log, "B")[2]
    steps = Counter((e[0], e[2]) for e in log.events(event="step"))
    assert all(n == 1 for n in steps.values()), steps


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_paused_holder_is_fenced_out(url: str, tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    """SIGSTOP past the TTL: another process takes over and finishes the run; the holder,
    woken up, is refused (LeaseLostError) and nothing it writes after that lands."""
    thread, log, go = uid("stop"), Log(tmp_path / "log"), tmp_path / "go"
    holder = spawn(url, thread, "A", log, busy="wait", ttl=1.0, steps=4, go=str(go))
    log.wait("A", "step", procs=[holder])  # step 0 committed... or about to: wait for its row
    with pk.connect(url) as store:
        _wait_until(lambda: len(store.history(thread)) >= 1, "A's first checkpoint")
    holder.send_signal(signal.SIGSTOP)
    taker = spawn(url, thread, "B", log, busy="wait", ttl=1.0, steps=4)
    assert taker.wait(timeout=DEADLINE) == 0
    go.touch()
    holder.send_signal(signal.SIGCONT)
    assert holder.wait(timeout=DEADLINE) == 4
    assert "taken over" in log.events("A", "lost")[0][2]
    a_enter, b_enter = _enter(log, "A"), _enter(log, "B")
    assert int(b_enter[0]) > int(a_enter[0])  # a newer fencing token
    assert a_enter[2] == b_enter[2]  # B continued A's run (its lease had expired)
    with pk.connect(url) as store:
        steps = [cp for cp in reversed(store.history(thread)) if cp.kind == "step"]
        assert [cp.position for cp in steps] == ["0", "1", "2", "3"]  # each once, no write of A after B
        assert store.history(thread)[0].run_status == "completed"
    ran = Counter(int(e[2]) for e in log.events(event="step"))
    assert ran[0] == 1 and ran[2] == ran[3] == 1  # committed steps ran once; only A's in-flight one twice


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("probe", [True, False], ids=["same-machine", "other-machine"])
def test_a_killed_holder_is_taken_over(url: str, probe: bool, tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    """SIGKILL: the next process continues the run, at once when it can see the holder's
    process is gone, else after the lease expired (within TTL + one heartbeat)."""
    thread, log, go = uid("kill"), Log(tmp_path / "log"), tmp_path / "go"
    ttl = 2.0
    holder = spawn(url, thread, "A", log, busy="queue", ttl=ttl, steps=4, go=str(go))
    log.wait("A", "step", procs=[holder])
    with pk.connect(url) as store:
        _wait_until(lambda: len(store.history(thread)) >= 1, "A's first checkpoint")
        [before] = [lease for lease in store.leases(prefix=thread) if lease.thread_id == thread]
    holder.kill()
    holder.wait(timeout=30)
    taker = spawn(url, thread, "B", log, busy="queue", ttl=ttl, steps=4, probe=probe)
    assert taker.wait(timeout=DEADLINE) == 0
    b_enter = _enter(log, "B")
    if not probe:
        assert float(b_enter[1]) >= before.expires_at - 0.05  # took over after expiry
    assert b_enter[2] == _enter(log, "A")[2]  # the same run, continued
    ran = Counter(int(e[2]) for e in log.events(event="step"))
    assert ran == {0: 1, 1: 1, 2: 1, 3: 1}  # A's step 0 was committed: replayed, not run again
    with pk.connect(url) as store:
        assert store.history(thread)[0].run_status == "completed"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eight_processes_queue_in_arrival_order(url: str, tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    # Nobody dies here, so the TTL only has to outlast a waiter starved of CPU: a waiter that
    # cannot refresh its queue entry within the TTL drops out of the line (as a dead one must),
    # and on a loaded 2-core machine 2 s was not always enough.
    thread, log, go = uid("fifo"), Log(tmp_path / "log"), tmp_path / "go"
    procs = [spawn(url, thread, "P0", log, busy="queue", ttl=10.0, steps=2, go=str(go))]
    log.wait("P0", "enter", procs=procs)
    for i in range(1, 9):
        procs.append(spawn(url, thread, f"P{i}", log, busy="queue", ttl=10.0, steps=1))
        _wait_until(lambda i=i: _waiting(url, thread) == i, f"P{i} to queue")  # type: ignore[misc]
    go.touch()
    assert [p.wait(timeout=DEADLINE) for p in procs] == [0] * 9
    entered = [e[0] for e in log.lines() if e[1] == "enter"]
    assert entered == [f"P{i}" for i in range(9)]
    # one after another: a holder's last act under the lease comes before the next one enters
    # ("exit" is logged after the lease was given up, so the next holder may log first)
    spans = [(e[0], e[1]) for e in log.lines() if e[1] in ("enter", "leave")]
    assert spans == [(f"P{i}", ev) for i in range(9) for ev in ("enter", "leave")]
    with pk.connect(url) as store:
        done = store.get_state(thread)["done"]
    assert done == [["P0", 0], ["P0", 1]] + [[f"P{i}", 0] for i in range(1, 9)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sixteen_writers_lose_and_duplicate_nothing(url: str, tmp_path: Path, spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    """16 processes, 4 runs each (2 on S3) on one thread (steps with and without arguments, with and
    without run_id), busy="queue": every item lands exactly once, and no ConflictError
    reaches a writer (it would end the process with a traceback)."""
    # Two runs each on S3 (moto answers every lease poll over HTTP from one process: four took
    # 125 s in CI); sixteen queued writers are the point.
    runs = 2 if url.startswith("s3:") else 4
    thread, log = uid("sixteen"), Log(tmp_path / "log")
    procs = [spawn(url, thread, f"W{i}", log, mode="writer", runs=runs, ttl=5.0) for i in range(16)]
    assert [p.wait(timeout=500) for p in procs] == [0] * 16
    with pk.connect(url) as store:
        items = store.get_state(thread)["items"]
        steps = [cp for cp in store.history(thread) if cp.kind == "step"]
    expected = {f"W{i}:{n}" for i in range(16) for n in range(runs)}
    assert sorted(items) == sorted(expected) and len(items) == 16 * runs
    assert len(steps) == 16 * runs  # one step checkpoint per run: nothing replayed from another writer
