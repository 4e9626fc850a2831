"""A worker for the suspend process tests (tests/test_suspend_processes.py), run as its own process.

    python suspend_agent.py agent URL THREAD EFFECTS LOG [hold]
    python suspend_agent.py scheduler URL PREFIX EFFECTS LOG

``agent``: one turn of THREAD: step ``before``, ``pk.suspend`` (an ``Approval``), step
``after``, ``pk.sleep($SLEEP_FOR or 0.3, suspend_above=0)`` (a timer), step ``last``. Each step body
appends ``THREAD name`` to EFFECTS (fsynced: the test counts step bodies that ran). LOG gets
``THREAD <status>`` when the block ends. With ``hold``, when the run suspends the process
logs ``THREAD holding`` and stays inside the block (lease held) until it is SIGKILLed.

``scheduler``: a timer loop (what cron or Celery beat would run): every 50 ms,
``store.due()`` under PREFIX, and each due run resumed with the agent's code; logs
``THREAD <status>`` and ``scheduler <pid>`` once it starts.
"""

from __future__ import annotations

import os
import sys
import time

from suspend_models import Approval

import persistkit as pk


def log(path: str, *words: object) -> None:
    with open(path, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")
        f.flush()
        os.fsync(f.fileno())


def agent(store: pk.Store, thread: str, effects: str, path: str, hold: bool = False) -> str:
    @pk.checkpointed(name="step")
    def step(name: str) -> str:
        log(effects, thread, name)
        return name

    with pk.resume(thread, store=store, lease_ttl=2.0) as run:
        step("before")
        try:
            answer = pk.suspend({"refund": 120}, answer_type=Approval)
        except pk.Suspended:
            if hold:
                log(path, thread, "holding")
                while True:
                    time.sleep(1)
            raise
        step(f"after:{answer.approved}:{answer.by}")
        pk.sleep(float(os.environ.get("SLEEP_FOR", "0.3")), suspend_above=0)
        step("last")
    log(path, thread, run.status)
    return run.status


def main() -> int:
    mode, url = sys.argv[1], sys.argv[2]
    store = pk.connect(url)
    if mode == "agent":
        thread, effects, path = sys.argv[3:6]
        agent(store, thread, effects, path, hold=sys.argv[6:7] == ["hold"])
        return 0
    prefix, effects, path = sys.argv[3:6]
    log(path, "scheduler", os.getpid())
    while True:
        for due in store.due(prefix=prefix):
            agent(store, due.thread_id, effects, path)
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
