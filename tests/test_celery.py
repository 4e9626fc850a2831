"""Agent turns on a real job queue: Celery workers, RabbitMQ, PostgreSQL (examples/celery_worker.py).

Two real worker processes consume one queue. A worker is SIGKILLed in the middle
of a turn; RabbitMQ redelivers the message (acks_late, reject_on_worker_lost)
and a worker continues the run: every committed step ran once and the run ends
once. Then one message is delivered twice at once: the lease serializes the two
deliveries, and the second replays the finished turn without running a step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SESSION_TAG

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 180.0


def _until(check: Callable[[], bool], what: str, workers: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        dead = [w for w in workers if w.poll() is not None]
        assert not dead, f"a celery worker exited ({dead[0].returncode}) while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Effects:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def lines(self, turn: str) -> list[list[str]]:
        return [line.split() for line in self.path.read_text().splitlines() if line.startswith(turn + " ")]

    def steps(self, turn: str) -> Counter[int]:
        return Counter(int(w[2]) for w in self.lines(turn) if w[1] == "step")

    def pids(self, turn: str, n: int) -> list[int]:
        return [int(w[-1]) for w in self.lines(turn) if w[1] == "step" and int(w[2]) == n]

    def done(self, turn: str) -> list[str]:
        return [w[2] for w in self.lines(turn) if w[1] == "done"]


@pytest.fixture
def celery_env(rabbitmq_url: str, postgres_url: str, tmp_path: Path) -> Iterator[tuple[dict[str, str], str]]:
    schema = f"pkcel_{SESSION_TAG}"
    env = {
        **os.environ,
        "CELERY_BROKER_URL": rabbitmq_url,
        "CELERY_QUEUE": f"persistkit-test-{uuid.uuid4().hex[:10]}",
        "PERSISTKIT_URL": f"{postgres_url}?schema={schema}",
        "AGENT_EFFECTS": str(tmp_path / "effects"),
        "AGENT_GATE": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    yield env, env["PERSISTKIT_URL"]
    import kombu
    import psycopg

    with kombu.Connection(rabbitmq_url) as conn:  # this test's queue, gone with it
        conn.default_channel.queue_delete(env["CELERY_QUEUE"])

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def workers(celery_env: tuple[dict[str, str], str]) -> Iterator[list[subprocess.Popen[bytes]]]:
    env, _ = celery_env
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "examples.celery_worker", "worker", "--pool=prefork",
             "--concurrency=1", "--without-gossip", "--without-mingle", "--loglevel=WARNING",
             "-n", f"w{i}-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env=env,
        )
        for i in range(2)
    ]
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_redelivered_turn_resumes_and_duplicates_are_serialized(
    celery_env: tuple[dict[str, str], str], workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    env, url = celery_env
    os.environ["CELERY_BROKER_URL"] = env["CELERY_BROKER_URL"]
    sys.path.insert(0, str(ROOT))
    from examples.celery_worker import app

    app.conf.task_default_queue = env["CELERY_QUEUE"]
    app.conf.broker_url = env["CELERY_BROKER_URL"]
    effects = Effects(Path(env["AGENT_EFFECTS"]))
    store = pk.connect(url)

    # 1. A worker is killed mid-turn; the broker redelivers; the run continues.
    thread, turn = f"cel-{uuid.uuid4().hex[:8]}", f"turn-{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{turn}@before-2").touch()  # the turn pauses there until {turn}@before-2.go exists
    app.send_task("agent_turn", args=[thread, "hello", turn])
    _until(lambda: len([c for c in store.history(thread) if c.kind == "step"]) == 2, "steps 0 and 1", workers)
    [victim] = effects.pids(turn, 1)
    os.kill(victim, signal.SIGKILL)  # the pool process running the turn, waiting before step 2
    (tmp_path / f"{turn}@before-2.go").touch()
    _until(lambda: effects.done(turn) == ["ran"], "the redelivered turn to finish", workers)
    assert effects.steps(turn) == {0: 1, 1: 1, 2: 1, 3: 1}  # every committed step ran once
    assert effects.pids(turn, 2) != [victim]
    history = store.history(thread)
    assert [c.kind for c in history].count("end") == 1 and history[0].run_status == "completed"
    assert {c.run_id for c in history} == {turn}

    # 2. The same message delivered twice at once: the lease runs them one after the other.
    turn2 = f"turn-{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{turn2}@before-2").touch()
    for _ in range(2):
        app.send_task("agent_turn", args=[thread, "again", turn2])

    def queued() -> bool:
        leases = [lease for lease in store.leases(prefix=thread) if lease.thread_id == thread]
        return bool(leases) and len(leases[0].waiting) == 1 and effects.steps(turn2) == {0: 1, 1: 1}

    _until(queued, "one delivery at the gate and the other queued on the lease", workers)
    (tmp_path / f"{turn2}@before-2.go").touch()
    _until(lambda: sorted(effects.done(turn2)) == ["ran", "replayed"], "both deliveries", workers)
    assert effects.steps(turn2) == {0: 1, 1: 1, 2: 1, 3: 1}
    ends = [c for c in store.history(thread) if c.kind == "end" and c.run_id == turn2]
    assert len(ends) == 1
    store.close()


def test_the_recipe_retries_a_retryable_error_and_fails_any_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Celery task of the recipe (run eagerly: Celery's retry runs it again at once) retries a
    ``pk.RetryableError`` instead of failing the turn, with no bound, and fails any other error once."""
    sys.path.insert(0, str(ROOT))
    from examples import celery_worker as recipe

    assert recipe.agent_turn.autoretry_for == (pk.RetryableError,)
    assert recipe.agent_turn.max_retries is None and recipe.agent_turn.retry_backoff
    store = pk.connect(f"sqlite:///{tmp_path}/turns.db")
    monkeypatch.setattr(recipe, "_store", store)
    real_resume = pk.resume
    calls: list[dict[str, object]] = []
    refusals: list[pk.PersistkitError] = [pk.ThreadBusyError("busy", thread_id="t"), pk.LeaseLostError("lost"),
                                          pk.BackendUnavailableError("down")]

    def resume(thread_id: str, **options: object) -> object:  # refuses the first attempts as persistkit would
        calls.append(options)
        if refusals:
            raise refusals.pop(0)
        return real_resume(thread_id, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(pk, "resume", resume)
    result = recipe.agent_turn.apply(args=["t", "hello", "turn-1"])
    assert result.successful(), result.traceback
    assert len(calls) == 4 and not refusals
    assert calls[-1] == dict(store=store, state=recipe.Conversation, run_id="turn-1", busy="queue", lease_ttl=10,
                             busy_timeout=120, unfinished_timeout=2)
    assert [c.kind for c in store.history("t")].count("end") == 1

    refusals.append(pk.ConflictError(thread_id="t"))  # not retryable: the turn fails for good, once
    calls.clear()
    result = recipe.agent_turn.apply(args=["t", "again", "turn-2"])
    assert result.failed() and isinstance(result.result, pk.ConflictError) and len(calls) == 1
    store.close()


def test_the_recipe_retries_a_turn_that_gave_way_after_its_retry_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn that gave its pool process back to a crashed turn (``ThreadBusyError.retry_after``,
    ``unfinished_timeout``) is retried with that countdown; other retryable errors keep the backoff;
    and a store that cannot be opened (a worker started during an outage) is retried, not kept."""
    sys.path.insert(0, str(ROOT))
    from examples import celery_worker as recipe

    store = pk.connect(f"sqlite:///{tmp_path}/turns.db")
    countdowns: list[float | None] = []
    real_retry = recipe.agent_turn.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        countdowns.append(kwargs.get("countdown"))
        return real_retry(*args, **kwargs)

    monkeypatch.setattr(recipe.agent_turn, "retry", retry)
    opened: list[str] = []

    def connect(url: str, **_: Any) -> pk.Store:  # PostgreSQL down at first: what pk.connect raises then
        opened.append(url)
        if len(opened) == 1:
            raise pk.BackendUnavailableError("cannot connect: nothing accepts connections there (yet)")
        return store

    monkeypatch.setattr(recipe, "_store", None)
    monkeypatch.setattr(pk, "connect", connect)
    real_resume = pk.resume
    refusals = [pk.ThreadBusyError("gave way", thread_id="t", unfinished_run="turn-0", retry_after=1.5)]

    def resume(thread_id: str, **options: object) -> object:
        if refusals:
            raise refusals.pop(0)
        return real_resume(thread_id, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(pk, "resume", resume)
    result = recipe.agent_turn.apply(args=["t", "hello", "turn-1"])
    assert result.successful(), result.traceback
    assert len(opened) == 2 and recipe._store is store  # the failed open was not kept
    assert len(countdowns) == 2 and countdowns[1] == 1.5  # the backoff (autoretry), then retry_after
    assert countdowns[0] != 1.5
    store.close()
