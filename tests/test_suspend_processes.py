"""Suspended runs and timers across real processes (issue #21), on PostgreSQL and SQLite.

A run suspends in one process, which is SIGKILLed while suspended (inside its block, lease
held, or after the block ended); the answer comes from another process (the CLI); a third
process resumes the run: no step before the suspend runs again (step bodies are counted
in a file). A timer is resumed by a scheduler process (``store.due()`` in a loop), after the
first scheduler was SIGKILLed and a new one started. Tests wait on events, never on time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import make_url, until

import persistkit as pk

HERE = Path(__file__).resolve().parent
AGENT = HERE / "suspend_agent.py"
DEADLINE = 60.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory, isolated=True)


def lines(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x] if path.exists() else []


def spawn(procs: list[subprocess.Popen[bytes]], *args: str, **env: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, str(AGENT), *args], env={**ENV, **env})
    procs.append(p)
    return p


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "persistkit", *args], env=ENV, capture_output=True, text=True,
                          timeout=DEADLINE)


@pytest.mark.parametrize("where", ["in-block", "after-block"])
def test_killed_while_suspended_answered_elsewhere_resumed_in_a_third(
    url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]], where: str
) -> None:
    thread = f"sus-{uuid.uuid4().hex}"
    effects, log = tmp_path / "effects", tmp_path / "log"
    hold = ["hold"] if where == "in-block" else []
    first = spawn(procs, "agent", url, thread, str(effects), str(log), *hold)
    if hold:
        until(lambda: f"{thread} holding" in lines(log), "the run suspended and holds its block")
    else:
        assert first.wait(DEADLINE) == 0 and lines(log) == [f"{thread} suspended"]
    first.send_signal(signal.SIGKILL)
    first.wait(DEADLINE)
    with pk.connect(url) as store:
        [q] = store.pending(prefix=thread)
        assert q.payload == {"refund": 120} and q.answer_type == "suspend_models:Approval"
    bad = cli("answer", thread, '{"approved": "maybe"}', "--url", url, "--allow-module", "suspend_models")
    assert bad.returncode == 1 and "AnswerError" in bad.stderr, bad.stderr
    ok = cli("answer", thread, '{"approved": true, "by": "ana"}', "--url", url, "--allow-module", "suspend_models",
             "--json")
    assert ok.returncode == 0, ok.stderr
    again = cli("answer", thread, '{"approved": false, "by": "bob"}', "--url", url, "--allow-module", "suspend_models")
    assert again.returncode == 1 and "answered already" in again.stderr
    third = spawn(procs, "agent", url, thread, str(effects), str(log))
    assert third.wait(DEADLINE) == 0
    assert lines(log)[-1] == f"{thread} suspended"  # now on the timer
    assert lines(effects) == [f"{thread} before", f"{thread} after:True:ana"]  # before ran once
    run_id = json.loads(ok.stdout)["run"]
    with pk.connect(url) as store:
        assert [d.run_id for d in store.due(time.time() + 5, prefix=thread)] == [run_id]


def test_a_timer_resumed_by_a_scheduler_after_a_restart(
    url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    prefix = f"tim-{uuid.uuid4().hex}-"
    thread = prefix + "1"
    effects, log = tmp_path / "effects", tmp_path / "log"
    with pk.connect(url) as store:
        first = spawn(procs, "agent", url, thread, str(effects), str(log))
        assert first.wait(DEADLINE) == 0
        store.answer(thread, {"approved": False, "by": "cy"}, answer_type=_approval())
    # the timer: 5 s, long enough that the first scheduler is killed before it is due
    second = spawn(procs, "agent", url, thread, str(effects), str(log), SLEEP_FOR="5")
    assert second.wait(DEADLINE) == 0 and lines(log)[-1] == f"{thread} suspended"  # on its timer
    # a scheduler starts and is killed before the timer is due (its host restarts) ...
    sched = spawn(procs, "scheduler", url, prefix, str(effects), str(log))
    until(lambda: any(x.startswith("scheduler ") for x in lines(log)), "the scheduler started")
    sched.send_signal(signal.SIGKILL)
    sched.wait(DEADLINE)
    with pk.connect(url) as store:
        [timer] = store.history(thread, limit=1)
        assert timer.run_status == "suspended" and not store.due(prefix=prefix)  # it woke nothing
    # ... and a new one resumes the run once its wake time passed
    spawn(procs, "scheduler", url, prefix, str(effects), str(log))
    until(lambda: f"{thread} completed" in lines(log), "the new scheduler resumed the timer")
    assert lines(effects) == [f"{thread} before", f"{thread} after:False:cy", f"{thread} last"]
    with pk.connect(url) as store:
        assert store.due(prefix=prefix) == [] and store.history(thread)[0].run_status == "completed"


def _approval() -> type:
    from suspend_models import Approval

    return Approval
