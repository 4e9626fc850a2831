"""Concurrency limits and debounce in real processes (issue #40), on PostgreSQL and Redis.

Workers are ``tests/concurrency_worker.py`` processes. They log what they do to one file under
an exclusive ``flock``, so the file's order is the order things happened; the tests wait for
lines and exit codes, never for time, and assert nothing about durations.

* 40 turns of one tenant under ``concurrency=("tenant", t, 5)`` in 8 worker processes; two
  workers are SIGKILLed while their turn is inside its provider call (holding a slot), and
  their unfinished turns are redelivered to new workers. The fake provider's log never shows
  more than 5 calls inside at once (a killed worker's call counts until the test's ``dying``
  line, written before the kill: its slot cannot be taken before it dies), and every turn is done.
* Two processes send bursts to one thread under ``busy="debounce"``, at the same time; then
  one of them, alone, leads a turn that SIGKILLs its process between claiming its batch and
  recording it, and all its events are delivered again. Every message is in exactly one turn's batch, the turns'
  batches follow the order the messages were sent, and each process's messages keep its order.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_url

import persistkit as pk

HERE = Path(__file__).resolve().parent
WORKER = HERE / "concurrency_worker.py"
DEADLINE = 120.0  # seconds any one wait may take before the test fails (a hang, not a timing)
LIMIT, TURNS, WORKERS = 5, 40, 8

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(params=["postgres", "redis"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=str(HERE.parent))
        p = subprocess.Popen([sys.executable, str(WORKER), *args], env=env, stderr=subprocess.PIPE)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stderr is not None:
            p.stderr.close()


def lines(log: Path) -> list[list[str]]:
    return [line.split(" ", 3) for line in log.read_text().splitlines() if line]


def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


def finish(p: subprocess.Popen[bytes]) -> None:
    try:
        p.wait(timeout=DEADLINE * 2)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    err = p.stderr.read().decode() if p.stderr is not None else ""
    assert p.returncode == 0, f"worker {p.pid} exited {p.returncode}: {err[-2000:]}"


def peak(events: list[list[str]]) -> int:
    """The most provider calls inside at once, in the log's order (``dying`` ends a worker's)."""
    inside: set[tuple[str, str]] = set()
    most = 0
    for e in events:
        if e[0] == "start":
            inside.add((e[1], e[2]))
            most = max(most, len(inside))
        elif e[0] == "end":
            inside.discard((e[1], e[2]))
        elif e[0] == "dying":
            inside = {c for c in inside if c[0] != e[1]}
    return most


def test_concurrency_five_over_forty_turns_with_workers_killed(
    url: str, tmp_path: Path, spawn: Spawn
) -> None:
    log = tmp_path / "log"
    log.touch()
    tenant = f"acme-{uuid.uuid4().hex[:8]}"
    plan = {w: [str(i) for i in range(w, TURNS, WORKERS)] for w in range(WORKERS)}
    workers = {w: spawn("turns", url, str(log), tenant, *items) for w, items in plan.items()}

    def done() -> set[str]:
        return {e[2] for e in lines(log) if e[0] == "done"}

    until(lambda: len(done()) >= 12, "12 turns done")

    def in_call() -> list[tuple[int, str]]:
        inside: dict[str, str] = {}
        for e in lines(log):
            if e[0] == "start":
                inside[e[1]] = e[2]
            elif e[0] == "end":
                inside.pop(e[1], None)
        alive = {str(p.pid): w for w, p in workers.items() if p.poll() is None}
        return [(alive[pid], i) for pid, i in inside.items() if pid in alive]

    victims = until(
        lambda: (c := in_call()) and len(c) >= 2 and c[:2], "two workers inside a provider call"
    )
    redeliver: list[subprocess.Popen[bytes]] = []
    for w, _ in victims:
        p = workers.pop(w)
        with open(
            log, "a"
        ) as f:  # before the kill: its slot cannot be taken until the process is gone
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(f"dying {p.pid} -\n")
        p.send_signal(signal.SIGKILL)
        p.wait()
    for w, _ in victims:
        left = [i for i in plan[w] if i not in done()]  # its turn in flight first, then the rest
        if left:  # (none if its last call ended, and its turn with it, before the kill landed)
            redeliver.append(spawn("turns", url, str(log), tenant, *left))
    for p in [*workers.values(), *redeliver]:
        finish(p)
    events = lines(log)
    assert done() == {str(i) for i in range(TURNS)}
    most = peak(events)
    assert 1 <= most <= LIMIT, f"{most} provider calls at once under a limit of {LIMIT}"
    with pk.connect(url) as store:
        for i in range(TURNS):
            assert store.history(f"{tenant}-t{i}", limit=1)[0].run_status == "completed"
        info = pk.Concurrency("tenant", tenant, LIMIT).info(store)
        assert (
            info is not None and info.holders == () and info.waiting == ()
        )  # every slot given back
    print(
        f"\nconcurrency {LIMIT}, {TURNS} turns, {WORKERS} workers, 2 SIGKILLed: peak {most} at once, "
        f"{sum(1 for e in events if e[0] == 'start')} provider calls (turns killed mid-call ran again)"
    )


def test_debounce_bursts_from_two_processes_with_a_leader_killed(
    url: str, tmp_path: Path, spawn: Spawn
) -> None:
    log = tmp_path / "log"
    log.touch()
    thread = f"slack-{uuid.uuid4().hex[:8]}"
    n = 12
    gate = tmp_path / "b-done"
    a = spawn("bursts", url, str(log), thread, "A", str(n), "8", str(gate))
    b = spawn("bursts", url, str(log), thread, "B", str(n))
    finish(b)  # A's first 8 messages and B's 12 went at the same time
    gate.touch()  # from A-8 on nobody else sends: A-8 leads, and kills A after claiming its batch
    a.wait(timeout=DEADLINE * 2)
    assert a.returncode == -signal.SIGKILL, "A-8 leads and kills its process after its claim"
    handled = {e[2] for e in lines(log) if e[0] in ("batch", "merged")}
    killed = next(f"A-{i}" for i in range(n) if f"A-{i}" not in handled)
    assert killed == "A-8"
    again = spawn("bursts", url, str(log), thread, "A", str(n))  # every A event delivered again
    finish(again)
    events = lines(log)
    batches = {e[2]: json.loads(e[3]) for e in events if e[0] == "batch"}
    with pk.connect(url) as store:
        order = [str(c.run_id) for c in reversed(store.history(thread)) if c.step == "pk.debounce"]
        sent = [m.value for m in store.messages(thread, topic="pk.debounce")]
    assert set(order) <= set(batches), (order, sorted(batches))
    flat = [m for run in order for m in batches[run]]
    assert sorted(sent) == sorted([f"A-{i}" for i in range(n)] + [f"B-{i}" for i in range(n)])
    assert flat == sent, (
        "each message in exactly one turn, turns in the order the messages were sent"
    )
    for p in ("A", "B"):
        assert [m for m in flat if m.startswith(p)] == [f"{p}-{i}" for i in range(n)]
    merged = sum(1 for e in events if e[0] == "merged")
    print(
        f"\ndebounce: {len(sent)} messages from two processes in {len(order)} turns ({merged} merged answers, "
        f"A SIGKILLed at {killed}, between its batch's claim and record)"
    )
