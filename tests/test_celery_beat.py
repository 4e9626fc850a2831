"""Durable timers woken by Celery beat (examples/celery_beat_timers.py).

The beat task and the flow's task run eagerly (Celery's ``task_always_eager``: a
``.delay`` runs the task at once, in this process): the flow sleeps past
``suspend_above`` and suspends; the beat task finds nothing due, then, once the wake
time passed, resumes the run: the first message is not sent again, the reminder is sent
once, and a second beat tick finds nothing more. Waits are on store conditions, never
asserted on time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent


def test_beat_resumes_due_timers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT))
    from examples import celery_beat_timers as recipe

    effects = tmp_path / "effects"
    monkeypatch.setenv("AGENT_EFFECTS", str(effects))
    monkeypatch.setenv("FOLLOW_UP_AFTER", "0.3")
    store = pk.connect(f"sqlite:///{tmp_path}/timers.db")
    monkeypatch.setattr(recipe, "_store", store)
    recipe.app.conf.task_always_eager = True
    try:
        _run(recipe, store, effects)
    finally:
        recipe.app.conf.task_always_eager = False
        store.close()


def _run(recipe: Any, store: pk.Store, effects: Path) -> None:
    assert recipe.app.conf.beat_schedule["wake-due-runs"]["task"] == "wake_due_runs"

    after = float(os.environ["FOLLOW_UP_AFTER"])
    earliest: dict[str, float] = {}  # no wake before this (its sleep began after it)
    for ticket in ("ticket-1", "ticket-2"):
        earliest[ticket] = time.monotonic() + after
        assert recipe.follow_up.apply(args=[ticket]).get() == "suspended"
    sent = lambda: [line.split(" ", 1)[1].rsplit(" ", 1)[0] for line in effects.read_text().splitlines()]  # noqa: E731
    assert sent() == ["we are on it", "we are on it"]
    deadline = time.monotonic() + 60
    woken: list[str] = []
    while len(woken) < 2:  # each tick wakes what is due (on a loaded machine, one at a time)
        got = recipe.wake_due_runs.apply().get()
        for ticket in got:
            assert time.monotonic() >= earliest[ticket], f"{ticket} woken before its timer was due"
            assert ticket not in woken, f"{ticket} woken twice"
        woken += got
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert sorted(woken) == ["ticket-1", "ticket-2"]
    assert sent() == ["we are on it", "we are on it", "any news? (reminder)", "any news? (reminder)"]
    assert recipe.wake_due_runs.apply().get() == []  # a second tick: nothing more
    for t in ("ticket-1", "ticket-2"):
        assert store.history(t)[0].run_status == "completed"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_beat_restarted_wakes_the_timer(rabbitmq_url: str, postgres_url: str, tmp_path: Path) -> None:
    """A Celery worker and a beat process on RabbitMQ and PostgreSQL: the flow suspends on its
    timer; the beat process is SIGKILLed and started again (a restart); the new beat wakes
    the run, and each message was sent once."""
    import os
    import signal
    import subprocess
    import uuid

    from conftest import SESSION_TAG

    schema = f"pkbeat_{SESSION_TAG}"
    url = f"{postgres_url}?schema={schema}"
    effects = tmp_path / "effects"
    effects.touch()
    env = {**os.environ, "CELERY_BROKER_URL": rabbitmq_url, "CELERY_QUEUE": f"pk-beat-{uuid.uuid4().hex[:10]}",
           "PERSISTKIT_URL": url, "AGENT_EFFECTS": str(effects), "FOLLOW_UP_AFTER": "2", "WAKE_EVERY": "0.5",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    celery = [sys.executable, "-m", "celery", "-A", "examples.celery_beat_timers"]
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([*celery, *args, "--loglevel=WARNING"], cwd=ROOT, env=env)
        procs.append(p)
        return p

    def until(check: Any, what: str) -> None:
        deadline = time.monotonic() + 120
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    sent = lambda: [line.split(" ")[1:-1] for line in effects.read_text().splitlines()]  # noqa: E731
    thread = f"beat-{uuid.uuid4().hex[:8]}"
    try:
        start("worker", "--pool=prefork", "--concurrency=1", "--without-gossip", "--without-mingle",
              "-n", f"b-{uuid.uuid4().hex[:6]}@%h")
        beat = start("beat", "-s", str(tmp_path / "beat-schedule"))
        os.environ["CELERY_BROKER_URL"] = rabbitmq_url
        sys.path.insert(0, str(ROOT))
        from examples import celery_beat_timers as recipe

        recipe.app.conf.broker_url = rabbitmq_url
        recipe.app.conf.task_default_queue = env["CELERY_QUEUE"]
        recipe.app.send_task("follow_up", args=[thread])
        with pk.connect(url) as store:
            until(lambda: bool(store.history(thread, limit=1)) and store.history(thread, limit=1)[0].run_status
                  == "suspended", "the flow suspended on its timer")
            beat.send_signal(signal.SIGKILL)  # the scheduler's host restarts
            beat.wait(30)
            assert sent() == [["we", "are", "on", "it"]]
            start("beat", "-s", str(tmp_path / "beat-schedule"))
            until(lambda: store.history(thread, limit=1)[0].run_status == "completed", "the new beat woke the run")
            assert sent() == [["we", "are", "on", "it"], ["any", "news?", "(reminder)"]]
            assert store.due() == [] or all(d.thread_id != thread for d in store.due())
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        import kombu
        import psycopg

        with kombu.Connection(rabbitmq_url) as conn:
            conn.default_channel.queue_delete(env["CELERY_QUEUE"])
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
