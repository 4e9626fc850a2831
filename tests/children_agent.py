"""Agents of tests/test_children_processes.py: a supervisor, its children and a queue worker,
each run as a real process (``main([ROLE, URL, ...])``, imported by ``python -c``).

Every step body appends its label to LOG (O_APPEND: one line per run of a body, across
processes), so the test counts how often each child's work ran.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from body_log import note

import persistkit as pk

LOG = Path(os.environ.get("CHILDREN_LOG", "/dev/null"))


def _note(label: str) -> None:
    note(LOG, label)


@pk.checkpointed
def work(label: str) -> str:
    _note(label)
    return label.upper()


@pk.checkpointed
def long_work(label: str) -> str:
    _note(label)
    while not pk.cancelled():  # until the run is asked to stop (the test cancels it)
        time.sleep(0.01)
    return label


@pk.register
def research(label: str) -> str:
    return work(label)


@pk.register
def lingers(label: str) -> str:
    long_work(label)
    return work(label + "/after")  # never runs: the stop comes first


@pk.register
def waits(label: str) -> Any:
    work(label)
    return pk.receive("go")


@pk.checkpointed
def gated_work(label: str) -> str:
    _note(label)
    go = Path(str(LOG) + ".go")
    while not go.exists():  # until the test lets it finish
        time.sleep(0.01)
    return label.upper()


@pk.register
def gated(label: str) -> str:
    """A child that finishes only once the test creates ``<LOG>.go``."""
    return gated_work(label)


def enqueue(spec: dict[str, Any]) -> None:
    """A queue that keeps every spec it was given (one JSON line each): the test counts them."""
    with open(os.environ["CHILDREN_QUEUE"] + ".all", "a") as f:
        f.write(json.dumps(spec) + "\n")


def waiting_parent(url: str, thread: str) -> None:
    """Starts one gated child on the queue (a worker process runs it), then waits for it: the
    test SIGKILLs this process while it waits."""
    store = pk.connect(url)
    with pk.resume(thread, store=store, run_id="r1"):
        h = pk.start(gated, f"{thread}/child", executor=enqueue)
        _note(f"{thread}/waiting")
        h.result()


def queue_worker(url: str) -> None:
    """Runs the first spec of the queue (``enqueue``'s file)."""
    with open(os.environ["CHILDREN_QUEUE"] + ".all") as f:
        spec = json.loads(f.readline())
    pk.run_child(spec, store=pk.connect(url))


def _to_queue(spec: dict[str, Any]) -> None:
    """The executor of a queue: the spec goes to a file a worker process picks up."""
    path = Path(os.environ["CHILDREN_QUEUE"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec))
    tmp.rename(path)


def supervisor(url: str, thread: str, kill_at: str) -> None:
    """Starts three research children; SIGKILLs itself at ``kill_at``: ``finished`` (two
    children finished, before the third start) or ``handover`` (the second child's start is
    recorded, its handover to the executor never happens)."""
    store = pk.connect(url)

    def dies(spec: dict[str, Any]) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    with pk.resume(thread, store=store, run_id="r1"):
        a = pk.start(research, f"{thread}/a")
        while kill_at == "handover" and a.status() != "completed":  # a finished: only b's start is cut
            time.sleep(0.01)
        b = pk.start(research, f"{thread}/b", executor=dies if kill_at == "handover" else "thread")
        while a.status() != "completed" or b.status() != "completed":
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)


def cancel_parent(url: str, thread: str) -> None:
    """A parent with three children: one in a thread of this process, one suspended (inline),
    one handed to a queue worker process; then it waits for the first (the test cancels it)."""
    store = pk.connect(url)
    try:
        with pk.resume(thread, store=store, run_id="r1"):
            here = pk.start(lingers, f"{thread}/here")
            pk.start(waits, f"{thread}/parked", executor="inline")
            pk.start(lingers, f"{thread}/worker", executor=_to_queue)
            _note(f"{thread}/started")
            here.result()
    except pk.RunCancelledError:
        sys.exit(3)


def worker(url: str) -> None:
    """The queue worker: runs the one spec in the queue file."""
    spec = json.loads(Path(os.environ["CHILDREN_QUEUE"]).read_text())
    try:
        pk.run_child(spec, store=pk.connect(url))
    except pk.RunCancelledError:
        sys.exit(3)


def holder(url: str, thread: str) -> None:
    """A run of ``thread`` (not a child) in a step that waits for ``<LOG>.go``: the test
    SIGKILLs this process there, leaving the run unfinished and the lease held by a dead process."""
    with pk.resume(thread, store=pk.connect(url), run_id="old"):
        work(f"{thread}/first")  # committed: the thread's newest run is this one
        gated_work(f"{thread}/old")


def main(argv: list[str]) -> None:
    """Run as ``python -c "import children_agent; ..."``, never as ``__main__``: the agents'
    registered names are ``children_agent:...``, as in the test process that resumes them."""
    role, *rest = argv
    roles = {
        "supervisor": supervisor,
        "cancel_parent": cancel_parent,
        "worker": worker,
        "waiting_parent": waiting_parent,
        "queue_worker": queue_worker,
        "holder": holder,
    }
    roles[role](*rest)
