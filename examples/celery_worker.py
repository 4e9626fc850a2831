"""Agent turns on a real job queue: Celery + RabbitMQ, checkpoints in PostgreSQL.

Start workers (as many as you like, on as many machines), then send turns::

    pip install 'persistkit[celery,postgres]'
    celery -A examples.celery_worker worker --concurrency 2
    python examples/celery_worker.py thread-1 "hello"      # sends one turn

Why this is safe with a queue that redelivers:

* ``task_acks_late`` + ``task_reject_on_worker_lost``: the broker keeps a message
  until its task returned, and gives it to another worker if the one running it
  died (SIGKILL, OOM, a lost node).
* The turn runs in ``pk.resume(thread_id, run_id=turn_id)``: the redelivered
  message continues the SAME run — committed steps replay from PostgreSQL, the
  first unfinished one runs — and a turn that already finished replays without
  running anything.
* The thread's lease (``busy="queue"``) serializes two deliveries of one message,
  and two messages of one conversation, across workers: the second waits, then
  replays or continues. A worker that paused past ``lease_ttl`` is fenced out
  (``pk.LeaseLostError``) and the message is not acked: the broker redelivers it.
* The one thing that can happen twice is the side effect of the step that was
  in flight when a worker died: pass ``pk.current_step().key`` to the API you
  call as its idempotency key.

Environment: ``CELERY_BROKER_URL`` (default ``amqp://guest:guest@127.0.0.1:5672//``),
``PERSISTKIT_URL`` (default ``postgresql://127.0.0.1:5432/test``), ``CELERY_QUEUE``.
The test (``tests/test_celery.py``) also sets ``AGENT_EFFECTS`` (a file each step
appends its side effect to) and ``AGENT_GATE`` (a directory: between steps a turn
waits for ``<turn_id>.go`` there, so the test can kill a worker mid-turn).
"""

from __future__ import annotations

import os
import sys
import time

from celery import Celery

import persistkit as pk

app = Celery("persistkit_agents", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,  # ack when the task returned, not when it started
    task_reject_on_worker_lost=True,  # a killed worker's message goes back to the queue
    worker_prefetch_multiplier=1,  # a worker holds one unacked message at a time
    task_default_queue=os.environ.get("CELERY_QUEUE", "persistkit-agents"),
    broker_connection_retry_on_startup=True,
)

_store: pk.Store | None = None


def store() -> pk.Store:
    """One store per worker process (opened after the fork of Celery's pool)."""
    global _store
    if _store is None:
        _store = pk.connect(os.environ.get("PERSISTKIT_URL", "postgresql://127.0.0.1:5432/test"))
    return _store


def _effect(*words: object) -> None:
    """A side effect outside persistkit (an API call, an e-mail...): here, a line in a file."""
    path = os.environ.get("AGENT_EFFECTS")
    if path:
        with open(path, "a") as f:
            f.write(" ".join(str(w) for w in (*words, os.getpid())) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _gate(turn_id: str) -> None:
    gate = os.environ.get("AGENT_GATE")
    while gate and not os.path.exists(os.path.join(gate, f"{turn_id}.go")):
        time.sleep(0.05)


@pk.checkpointed(name="agent.think")
def think(turn_id: str, n: int, message: str) -> str:
    key = pk.current_step().key  # type: ignore[union-attr]  # the idempotency key for the API call
    _effect(turn_id, "step", n, key)
    return f"thought {n} about {message!r}"


@app.task(name="agent_turn")
def agent_turn(thread_id: str, message: str, turn_id: str, steps: int = 4) -> list[str]:
    """One turn of the agent: ``steps`` checkpointed steps; idempotent per ``turn_id``."""
    with pk.resume(thread_id, store=store(), run_id=turn_id, busy="queue", lease_ttl=10) as run:
        if run.lease is not None:
            _effect(turn_id, "holding", run.lease.token)
        thoughts = []
        for n in range(steps):
            if n >= 2:
                _gate(turn_id)
            thoughts.append(think(turn_id, n, message))
    _effect(turn_id, "done", "replayed" if run.replay_only else "ran")
    return thoughts


if __name__ == "__main__":
    thread, text = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("demo-thread", "hello")
    result = agent_turn.delay(thread, text, f"{thread}-{int(time.time() * 1000)}")
    print(f"sent turn {result.id} for thread {thread!r}; watch the worker's log")
