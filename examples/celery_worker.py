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
* A turn whose worker died keeps its place: the thread's next turns wait for
  its redelivery to finish it (``busy="queue"``), so turns of one thread finish
  in the order they took the lease, each one's messages together.
* ...but they do not wait in a pool process: the redelivery needs one, and the
  turns waiting for it could take them all (nothing moved until
  ``busy_timeout``). With ``unfinished_timeout=2`` a turn that has waited 2 s
  for another turn's unfinished run raises ``pk.ThreadBusyError`` with
  ``retry_after`` and gives its place back; the task retries it with that
  countdown, and the freed process takes the next message: the redelivery.
* persistkit's retryable errors (``pk.RetryableError``: ``ThreadBusyError``
  after ``busy_timeout``, ``LeaseLostError``, ``BackendUnavailableError``) are
  retried, never acked as failed: ``autoretry_for=(pk.RetryableError,)`` with an
  exponential backoff and ``max_retries=None`` (``err.retry_after``, when set, is
  the countdown). The store is opened in the task, not at import: a worker that
  starts while PostgreSQL is down (or restarting) gets ``BackendUnavailableError``
  from ``pk.connect`` in the task, which retries like any other, and a store that
  could not be opened is not kept (the next attempt connects again); a store
  opened before the outage reconnects by itself. Celery's retry publishes a copy
  of the message (with a countdown) and then acks the original, so the turn is
  never lost (a worker dying in between delivers it twice: ``run_id`` makes
  that harmless). The copy goes to the back of the queue: a retried turn that
  had committed steps keeps its place in its thread (the next turns wait for
  it); one that had not started yet arrives again, after the turns that
  overtook it. A turn that can never go on (its crashed run was given up)
  retries until you remove it; any other error is the turn failing for good and
  is acked as failed, as Celery does.
* The one thing that can happen twice is the side effect of the step that was
  in flight when a worker died: pass ``pk.current_step().key`` to the API you
  call as its idempotency key.

Environment: ``CELERY_BROKER_URL`` (default ``amqp://guest:guest@127.0.0.1:5672//``),
``PERSISTKIT_URL`` (default ``postgresql://127.0.0.1:5432/test``), ``CELERY_QUEUE``.
The tests (``tests/test_celery.py``, ``tests/test_celery_stress.py``) also set
``AGENT_EFFECTS`` (a file each turn appends what it did to) and ``AGENT_GATE``
(a directory: a turn pauses at a point named by a file ``<turn_id>@<point>``
there until ``<turn_id>@<point>.go`` exists, so a test can kill a worker at
that point; points are ``before-<n>``, n steps committed, and ``in-<n>``, step
n ran and is not committed yet).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from celery import Celery, Task, signals

import persistkit as pk

app = Celery("persistkit_agents", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,  # ack when the task returned, not when it started
    task_reject_on_worker_lost=True,  # a killed worker's message goes back to the queue
    worker_prefetch_multiplier=1,  # a worker holds one unacked message per process
    task_default_queue=os.environ.get("CELERY_QUEUE", "persistkit-agents"),
    broker_connection_retry_on_startup=True,
)

_store: pk.Store | None = None


def store() -> pk.Store:
    """One store per worker process, opened by the first task (after the fork of Celery's
    pool). Called in the task: while the store is unreachable it raises
    ``pk.BackendUnavailableError`` there, which the task retries, and nothing is kept."""
    global _store
    if _store is None:
        _store = pk.connect(os.environ.get("PERSISTKIT_URL", "postgresql://127.0.0.1:5432/test"))
    return _store


class Conversation(pk.State):
    messages: list[dict[str, Any]] = []


# -- test hooks (no-ops unless AGENT_EFFECTS / AGENT_GATE are set) ------------------------------


def _effect(*words: object) -> None:
    """A side effect outside persistkit (an API call, an e-mail...): here, a line in a file."""
    path = os.environ.get("AGENT_EFFECTS")
    if path:
        with open(path, "a") as f:
            f.write(" ".join(str(w) for w in (*words, os.getpid())) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _gate(turn_id: str, point: str) -> None:
    gate = os.environ.get("AGENT_GATE")
    if not gate or not os.path.exists(os.path.join(gate, f"{turn_id}@{point}")):
        return
    _effect(turn_id, "gate", point)
    while not os.path.exists(os.path.join(gate, f"{turn_id}@{point}.go")):
        time.sleep(0.02)


@signals.task_failure.connect
def _failed(task_id: str, exception: BaseException, args: tuple[Any, ...], **_: Any) -> None:
    _effect(args[2], "failed", type(exception).__name__)  # acked as failed: the turn is lost


@signals.task_retry.connect
def _retried(request: Any, reason: BaseException, **_: Any) -> None:
    exc = getattr(reason, "exc", None) or reason  # reason: Celery's Retry, exc: the error retried
    after = exc.retry_after if isinstance(exc, pk.RetryableError) else None
    _effect(request.args[2], "retry", type(exc).__name__, "gave-way" if after is not None else "backoff")


# -- the agent --------------------------------------------------------------------------------


@pk.checkpointed(name="agent.think")
def think(turn_id: str, n: int, message: str) -> str:
    key = pk.current_step().key  # type: ignore[union-attr]  # the idempotency key for the API call
    _effect(turn_id, "step", n, key)
    _gate(turn_id, f"in-{n}")
    return f"thought {n} about {message!r}"


@app.task(
    name="agent_turn",
    bind=True,
    autoretry_for=(pk.RetryableError,),  # a busy thread, a lost lease, a store briefly down: retry
    retry_backoff=True,  # 1 s, 2 s, 4 s, ... (with jitter)
    retry_backoff_max=60,
    max_retries=None,  # never ack a turn as failed for a retryable error
)
def agent_turn(self: Task, thread_id: str, message: str, turn_id: str, steps: int = 4) -> list[str]:
    """One turn of the agent: ``steps`` checkpointed steps; idempotent per ``turn_id``."""
    try:
        return _turn(thread_id, message, turn_id, steps)
    except pk.RetryableError as exc:
        if exc.retry_after is None:
            raise  # autoretry_for: the exponential backoff
        # it gave its pool process back to the crashed turn it waited for: retry after that long
        raise self.retry(exc=exc, countdown=exc.retry_after) from exc


def _turn(thread_id: str, message: str, turn_id: str, steps: int) -> list[str]:
    with pk.resume(thread_id, store=store(), state=Conversation, run_id=turn_id, busy="queue",
                   lease_ttl=10, busy_timeout=120, unfinished_timeout=2) as run:
        if run.lease is not None:
            _effect(turn_id, "holding", run.lease.token)
        run.state.messages.append({"role": "user", "turn": turn_id, "content": message})
        thoughts = []
        for n in range(steps):
            _gate(turn_id, f"before-{n}")
            thought = think(turn_id, n, message)
            run.state.messages.append({"role": "assistant", "turn": turn_id, "step": n, "content": thought})
            thoughts.append(thought)
    _effect(turn_id, "done", "replayed" if run.replay_only else "ran")
    return thoughts


if __name__ == "__main__":
    thread, text = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("demo-thread", "hello")
    result = agent_turn.delay(thread, text, f"{thread}-{int(time.time() * 1000)}")
    print(f"sent turn {result.id} for thread {thread!r}; watch the worker's log")
