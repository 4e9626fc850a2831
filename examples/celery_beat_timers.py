"""Durable timers on Celery beat: runs that sleep for days wake up on the scheduler you have.

A follow-up flow sends a message, sleeps two days with ``pk.sleep`` and sends a reminder.
The sleep does not hold a worker: with ``suspend_above=0`` it suspends the run at once
(its wake time is stored with it) and the task returns (the default, 60 s, sleeps shorter
waits in the process). A beat task polls
``store.due()`` every 30 s and hands each due run back to a worker, which resumes it:
the steps before the sleep replay (the first message is not sent again), the sleep is
over, the reminder is sent. A run whose question has a deadline (``pk.suspend(...,
deadline=..., default=...)``) is due the same way, and takes its default.

    pip install 'persistkit[celery,postgres]'
    celery -A examples.celery_beat_timers worker --concurrency 2
    celery -A examples.celery_beat_timers beat
    python examples/celery_beat_timers.py ticket-42      # starts one follow-up

Why it is safe: ``store.due()`` reads the store, not the beat process's memory, so a
restarted beat (or two of them) finds the same due runs; resuming a run twice is harmless
(the lease runs them one after the other, the second replays); a worker killed mid-resume
leaves the run unfinished, and the next beat tick finds it due again (it is still
suspended until the resume recorded that the timer is over). ``pk.current_step().key`` is
the idempotency key of each message sent, for the one step in flight at a crash.

Environment: ``CELERY_BROKER_URL``, ``PERSISTKIT_URL`` (as ``examples/celery_worker.py``),
``CELERY_QUEUE``, ``FOLLOW_UP_AFTER`` (seconds; default two days), ``WAKE_EVERY`` (the beat
interval, seconds; default 30), ``AGENT_EFFECTS`` (a
file each sent message is appended to, for the tests).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

from celery import Celery

import persistkit as pk

app = Celery("persistkit_timers", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("CELERY_QUEUE", "persistkit-timers"),
    broker_connection_retry_on_startup=True,
    beat_schedule={"wake-due-runs": {"task": "wake_due_runs", "schedule": float(os.environ.get("WAKE_EVERY", 30))}},
)

_store: pk.Store | None = None


def store() -> pk.Store:
    """One store per worker process (opened after the fork of Celery's pool)."""
    global _store
    if _store is None:
        _store = pk.connect(os.environ.get("PERSISTKIT_URL", "postgresql://127.0.0.1:5432/test"))
    return _store


@pk.checkpointed(name="send")
def send(thread_id: str, text: str) -> str:
    """Send a message (an e-mail, a Slack post): here a line in $AGENT_EFFECTS."""
    key = pk.current_step().key  # type: ignore[union-attr]  # the API's idempotency key
    path = os.environ.get("AGENT_EFFECTS")
    if path:
        with open(path, "a") as f:
            f.write(f"{thread_id} {text} {key}\n")
            f.flush()
            os.fsync(f.fileno())
    return text


def follow_up_flow(thread_id: str, run_id: str | None = None) -> str:
    """The flow: a message, a durable sleep, a reminder. Returns the run's status."""
    after = timedelta(seconds=float(os.environ.get("FOLLOW_UP_AFTER", 2 * 24 * 3600)))
    with pk.resume(thread_id, store=store(), run_id=run_id, lease_ttl=10, busy_timeout=120) as run:
        send(thread_id, "we are on it")
        pk.sleep(after, suspend_above=0)  # never hold a worker for it: suspend, beat wakes it
        send(thread_id, "any news? (reminder)")
    return run.status


@app.task(name="follow_up", autoretry_for=(pk.RetryableError,), retry_backoff=True, max_retries=None)
def follow_up(thread_id: str, run_id: str | None = None) -> str:
    """Start (or resume: pass its run_id) the follow-up flow of ``thread_id``."""
    return follow_up_flow(thread_id, run_id)


@app.task(name="wake_due_runs")
def wake_due_runs() -> list[str]:
    """The beat task: every suspended run whose timer (or question deadline) passed goes back
    to a worker. Reads each thread's head (``store.due()``): poll every 30 s or so, not faster."""
    woken = []
    for due in store().due():
        follow_up.delay(due.thread_id, due.run_id)
        woken.append(due.thread_id)
    return woken


if __name__ == "__main__":
    thread = sys.argv[1] if len(sys.argv) > 1 else f"ticket-{int(time.time())}"
    follow_up.delay(thread)
    print(f"started the follow-up of {thread!r}; beat wakes it when its timer is due")
