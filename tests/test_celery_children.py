"""Child runs handed to a real Celery worker on RabbitMQ, checkpoints in PostgreSQL
(examples/celery_children.py): the supervisor's children run in the worker process, once each,
and a redelivered supervisor turn hands nothing over again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SESSION_TAG

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def worker_env(rabbitmq_url: str, postgres_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    schema = f"pkcc_{SESSION_TAG}"
    env = {
        **os.environ,
        "CELERY_BROKER_URL": rabbitmq_url,
        "CELERY_QUEUE": f"persistkit-children-{uuid.uuid4().hex[:10]}",
        "PERSISTKIT_URL": f"{postgres_url}?schema={schema}",
        "AGENT_EFFECTS": str(tmp_path / "effects"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "examples.celery_children", "worker", "--pool=prefork",
         "--concurrency=2", "--without-gossip", "--without-mingle", "--loglevel=WARNING",
         "-n", f"cc-{uuid.uuid4().hex[:6]}@%h"],
        cwd=ROOT, env=env,
    )
    yield env
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=30)
    import kombu
    import psycopg

    with kombu.Connection(rabbitmq_url) as conn:
        conn.default_channel.queue_delete(env["CELERY_QUEUE"])
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_supervisor_hands_its_children_to_celery(worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CELERY_BROKER_URL", "PERSISTKIT_URL", "CELERY_QUEUE", "AGENT_EFFECTS"):
        monkeypatch.setenv(name, worker_env[name])
    monkeypatch.syspath_prepend(str(ROOT))
    from examples import celery_children as recipe

    recipe.app.conf.task_default_queue = worker_env["CELERY_QUEUE"]
    recipe.app.conf.broker_url = worker_env["CELERY_BROKER_URL"]
    recipe._store = None
    thread = f"sup-{uuid.uuid4().hex[:8]}"
    topics = ["pricing", "competitors", "risks"]
    assert recipe.supervise(thread, topics, run_id="turn-1") == [f"notes on {t}" for t in topics]
    assert recipe.supervise(thread, topics, run_id="turn-1") == [f"notes on {t}" for t in topics]  # redelivered
    lines = [x.split() for x in Path(worker_env["AGENT_EFFECTS"]).read_text().splitlines()]
    assert Counter(t for t, _ in lines) == dict.fromkeys(topics, 1)  # each child ran once
    assert {int(pid) for _, pid in lines}.isdisjoint({os.getpid()})  # in the worker, not here
    kids = recipe.store().children(thread)
    assert [(k.child.agent, k.status) for k in kids] == [("examples.celery_children:research", "completed")] * 3
    recipe.store().close()
    recipe._store = None
