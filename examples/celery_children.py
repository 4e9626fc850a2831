"""Child runs on a job queue: a supervisor hands three research tasks to Celery workers.

Start a worker, then run a supervisor turn::

    pip install 'persistkit[celery,postgres]'
    celery -A examples.celery_children worker --concurrency 2
    python examples/celery_children.py supervisor-1 pricing competitors risks

``pk.start(research, topic, executor=enqueue)`` records the child in the supervisor's run, then
calls ``enqueue(spec)``: the spec is plain data (the agent's registered name, its arguments,
the child's thread and run ids, the parent), so it travels in a Celery message as JSON. The
worker's task is one line, ``pk.run_child(spec, store=store())``: it opens the child's run on
its own thread and runs the agent there.

Why this is safe with a queue that redelivers, and with a supervisor that crashes:

* The child's run id is fixed by the supervisor's run and the position of its ``pk.start``,
  so a redelivered message (``task_acks_late``) continues or replays the same child run,
  never a second one: its committed steps do not run again.
* A supervisor that dies after ``pk.start`` is resumed with the same ``run_id``: it gets the
  same handles, hands over only a child that nobody runs (not finished, its lease not held),
  and its ``pk.gather`` reads the results the workers recorded in the children's threads.
* ``handle.result()`` waits in the supervisor's process up to ``suspend_above`` seconds; past
  that the supervisor suspends and ``store.due()`` lists it once every child it waits on ended.
* ``store.cancel(supervisor_thread, run_id)`` (or ``persistkit cancel``) reaches every child:
  a running one stops at its next step boundary (even if its worker dies during the cancel,
  its redelivery runs nothing), one still in the queue runs nothing when it is delivered.

Environment: ``CELERY_BROKER_URL`` (default ``amqp://guest:guest@127.0.0.1:5672//``),
``PERSISTKIT_URL`` (default ``postgresql://127.0.0.1:5432/test``), ``CELERY_QUEUE``;
``AGENT_EFFECTS`` (tests: a file each step body appends a line to).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery

import persistkit as pk

app = Celery("persistkit_children", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,  # ack when the child's run returned, not when it started
    task_reject_on_worker_lost=True,  # a killed worker's message goes back to the queue
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("CELERY_QUEUE", "persistkit-children"),
    broker_connection_retry_on_startup=True,
)

_store: pk.Store | None = None


def store() -> pk.Store:
    """One store per process, opened on first use (after the fork of Celery's pool)."""
    global _store
    if _store is None:
        _store = pk.connect(os.environ.get("PERSISTKIT_URL", "postgresql://127.0.0.1:5432/test"))
    return _store


@pk.checkpointed
def read_up(topic: str) -> str:
    path = os.environ.get("AGENT_EFFECTS")
    if path:  # a side effect outside persistkit (an API call): here, a line in a file
        with open(path, "a") as f:
            f.write(f"{topic} {os.getpid()}\n")
    return f"notes on {topic}"


@pk.register
def research(topic: str) -> str:
    """The child agent: a worker finds it by this registered name (``examples.celery_children:research``)."""
    return read_up(topic)


@app.task(name="run_child", autoretry_for=(pk.RetryableError,), retry_backoff=True, max_retries=None)
def run_child(spec: dict[str, Any]) -> Any:
    """The whole worker side: run the child's run to its end (a redelivery continues or replays it)."""
    try:
        return pk.run_child(spec, store=store())
    except pk.RunCancelledError:
        return None  # cancelled before or while it ran: nothing more to do, ack it


def enqueue(spec: dict[str, Any]) -> None:
    """The executor ``pk.start`` calls once the child is recorded in the supervisor's run."""
    run_child.delay(spec)


def supervise(thread_id: str, topics: list[str], run_id: str | None = None) -> list[str]:
    """A supervisor turn: one child per topic, on the queue; their results, in order."""
    with pk.resume(thread_id, store=store(), run_id=run_id):
        handles = [pk.start(research, topic, executor=enqueue) for topic in topics]
        return pk.gather(*handles, timeout=300)


if __name__ == "__main__":
    thread, *topics = sys.argv[1:] or ["supervisor-demo", "pricing", "competitors", "risks"]
    print(supervise(thread, topics))
