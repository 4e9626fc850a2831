"""Agents of tests/test_cancel_processes.py, each run as a real process (``main([ROLE, URL, ...])``,
imported by ``python -c``): a parent run opened with ``busy=None`` (no lease) that has children
and goes on with steps until an operator's ``persistkit cancel`` (another process) stops it.

Every step body appends its label to LOG (O_APPEND: one line per run of a body, across
processes), so the test counts the bodies that ran against the steps recorded.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from body_log import note

import persistkit as pk

LOG = Path(os.environ.get("CANCEL_LOG", "/dev/null"))
#: The child statuses after which the parent's process may exit (the child's thread is done).
_OVER = ("completed", "failed", "cancelled", "compensated", "abandoned")


def _note(label: str) -> None:
    note(LOG, label)


@pk.checkpointed
def tick(label: str) -> str:
    _note(label)
    time.sleep(0.01)
    return label


@pk.checkpointed
def long_work(label: str) -> str:
    _note(label)
    for _ in range(6000):  # until the run is asked to stop (at most ~60 s)
        if pk.cancelled():
            break
        time.sleep(0.01)
    return label


@pk.register
def lingers(label: str) -> str:
    long_work(label)
    return tick(label + "/after")  # never runs: the stop comes first


def lease_less_parent(url: str, thread: str) -> None:
    """A parent opened with ``busy=None``: one child runs in a thread of this process, one is
    handed to a queue nobody serves; then the parent goes on with steps until it is stopped.
    Exits 3 on ``pk.RunCancelledError`` (once its child's thread is done), 4 on any other error."""
    store = pk.connect(url)
    here = None
    try:
        with pk.resume(thread, store=store, run_id="r1", busy=None):
            here = pk.start(lingers, f"{thread}/here", lease_ttl=1.5)
            pk.start(lingers, f"{thread}/queued", executor=lambda spec: None)
            for i in range(6000):
                tick(f"{thread}/tick")
                if i == 2:
                    _note(f"{thread}/going")
    except pk.RunCancelledError as exc:
        print(f"stopped: {exc.status}: {exc}", file=sys.stderr)
        for _ in range(3000):  # the child's thread ends (cancelled) before this process exits
            if here is None or here.status() in _OVER:
                break
            time.sleep(0.01)
        sys.exit(3)
    except Exception as exc:  # the test reads the exit code and stderr
        print(f"failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(4)


def main(argv: list[str]) -> None:
    """Run as ``python -c "import cancel_agent; ..."``, never as ``__main__``: the agents'
    registered names are ``cancel_agent:...``, as the test process reads them."""
    role, *rest = argv
    {"lease_less_parent": lease_less_parent}[role](*rest)
