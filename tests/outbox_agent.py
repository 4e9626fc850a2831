"""A three-step turn whose steps post replies with ``after_commit``, run as its own process.

    python outbox_agent.py URL THREAD RUN_ID RECEIVER KILL         (a turn)
    python outbox_agent.py URL THREAD - RECEIVER drain             (a sweeper: drain_outbox)

Each step registers ``post(receiver, text)``; the effect appends ``key text`` to the
RECEIVER file (fsynced): a receiver that deduplicates by key counts each key once. KILL
is ``-`` (no kill), ``before:N`` (SIGKILL in step N's effect before it posts: the step's
checkpoint committed, its effect did not run) or ``after:N`` (SIGKILL right after step
N's effect posted, before any checkpoint carried its done mark).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import persistkit as pk

KILL = ("-", -1)


@pk.register
def post(receiver: str, text: str, *, idempotency_key: str) -> None:
    if ("before", int(text[1:])) == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    with open(receiver, "a") as f:
        f.write(f"{idempotency_key} {text}\n")
        f.flush()
        os.fsync(f.fileno())
    if ("after", int(text[1:])) == KILL:
        os.kill(os.getpid(), signal.SIGKILL)


@pk.checkpointed
def step(receiver: str, i: int) -> str:
    pk.after_commit(post, receiver, f"t{i}")
    return f"t{i}"


def main() -> None:
    global KILL
    url, thread, run_id, receiver, mode = sys.argv[1:6]
    store = pk.connect(url)
    if mode == "drain":
        report = store.drain_outbox(prefix=thread)
        print(json.dumps({"done": [e.key for e in report.done], "failed": [e.error for e in report.failed],
                          "skipped": [s[0] for s in report.skipped]}))
        return
    if mode != "-":
        when, _, n = mode.partition(":")
        KILL = (when, int(n))
    with pk.resume(thread, store=store, run_id=run_id) as run:
        out = [step(receiver, i) for i in range(3)]
    print(json.dumps({"out": out, "status": run.status}))


if __name__ == "__main__":
    main()
