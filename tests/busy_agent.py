"""Agents of tests/test_busy_processes.py, each a real process serving many cases on one store
(``main([ROLE, URL])``, imported by ``python -c``): it reads one case a line on stdin and
answers one line on stdout, so one process runs every case of a store.

``first``: per line ``THREAD K``, a turn ``zero`` (one step), then the turn ``first`` of five
steps whose step K waits until the turn is asked to stop (the second message came); prints
``THREAD STATUS`` (``completed``, or the stopped turn's ``interrupted`` / ``rolled_back``).
``second``: per line ``THREAD BUSY``, the second message: a turn ``second`` of one step opened
with ``busy=BUSY``; prints ``THREAD STATUS``. Every step body appends its label to LOG
(O_APPEND: one line per run of a body, in the order they ran, across both processes).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from body_log import note

import persistkit as pk

LOG = Path(os.environ.get("BUSY_LOG", "/dev/null"))


def _note(label: str) -> None:
    note(LOG, label)


@pk.checkpointed
def part(label: str, gate: bool) -> str:
    _note(label)
    if gate:  # the second message comes while this step runs: wait until the turn hears it
        for _ in range(6000):  # ~60 s at most
            if pk.cancelled():
                break
            time.sleep(0.01)
    return label


def first(url: str) -> None:
    store = pk.connect(url)
    for line in sys.stdin:
        thread, k = line.split()
        with pk.resume(thread, store=store, run_id="zero") as run:
            run.state.setdefault("done", []).append(part(f"{thread}:before", False))
        status = "completed"
        try:
            # a TTL short enough that the stop is heard soon (every 0.5 s), long enough that a
            # loaded machine's late renewal does not let the lease lapse
            with pk.resume(thread, store=store, run_id="first", lease_ttl=1.5) as run:
                for i in range(1, 6):
                    run.state.setdefault("done", []).append(part(f"{thread}:first:{i}", i == int(k)))
        except pk.RunCancelledError as exc:
            status = exc.status
        print(thread, status, flush=True)


def second(url: str) -> None:
    store = pk.connect(url)
    for line in sys.stdin:
        thread, busy = line.split()
        with pk.resume(thread, store=store, run_id="second", busy=busy) as run:
            run.state.setdefault("done", []).append(part(f"{thread}:second", False))
        print(thread, run.status, flush=True)


def main(argv: list[str]) -> None:
    role, url = argv
    {"first": first, "second": second}[role](url)
