"""Agents for the crash matrix's own tests (tests/test_crash_matrix.py): one without a
defect, and one planted with each defect the matrix must name. ``stamped=True`` makes
each defect's agent first record a step that is not deterministic (``now``: the clock,
read inside a step, recorded and replayed: not a defect), which must not hide the defect
or be named as its cause."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import persistkit as pk

SENT: list[
    str
] = []  # the outbox of the fake mail API: a side effect persistkit does not know about
LAST: list[str] = []  # a global a step body fills: what "arguments from an unstored global" reads


@pk.checkpointed
def plan(topic: str, n: int) -> list[str]:
    return [f"{topic} part {i}" for i in range(n)]


@pk.checkpointed
def search(query: str) -> str:
    LAST.append(query)
    return f"result for {query}"


@pk.checkpointed
def send_email(to: str, body: str) -> str:
    SENT.append(f"{to}: {body}")
    return f"sent to {to}"


@pk.checkpointed
def summarize(notes: list[str]) -> str:
    return " | ".join(notes)


@pk.checkpointed
def now() -> float:
    return time.time()  # not deterministic, but inside a step: recorded, replayed on resume


@pk.checkpointed
def draft(topic: str) -> str:
    return f"{topic} #{uuid.uuid4().hex[:8]}"  # a real model: another answer each time


def stamp(run: Any, stamped: bool) -> None:
    if stamped:
        run.state["started_at"] = now()


def recorded_nondeterminism(thread: str) -> str:
    """No defect: the steps that are not deterministic are steps; what follows from their
    results (the state, the next steps' arguments) follows from what the store recorded."""
    with pk.resume(thread) as run:
        stamp(run, True)
        topic = draft("refunds")
        run.state["notes"] = [search(q) for q in plan(topic, 2)]
        return summarize([*run.state["notes"], str(run.state["started_at"])])


def good(thread: str, steps: int = 4) -> str:
    """No defect: everything that differs from run to run is inside a step."""
    with pk.resume(thread) as run:
        run.state.setdefault("notes", [])
        for q in plan("refunds", steps):
            run.state["notes"].append(search(q))
        reply = summarize(run.state["notes"])
        send_email("ops@example.com", reply)
        return reply


def clock_between_steps(thread: str, stamped: bool = False) -> str:
    with pk.resume(thread) as run:
        stamp(run, stamped)
        run.state["notes"] = []
        for q in plan("refunds", 3):
            run.state["notes"].append(search(q))
            run.state["checked_at"] = time.time()  # the defect: the clock read between steps
        return summarize(run.state["notes"])


def side_effect_outside_a_step(thread: str, stamped: bool = False) -> str:
    with pk.resume(thread) as run:
        stamp(run, stamped)
        notes = [search(q) for q in plan("refunds", 3)]
        # the defect: the step runs in a thread the run's context did not follow: no run records it
        worker = threading.Thread(target=send_email, args=("ops@example.com", notes[0]))
        worker.start()
        worker.join()
        run.state["notes"] = notes
        return summarize(notes)


def arguments_from_a_global(thread: str, stamped: bool = False) -> str:
    with pk.resume(thread) as run:
        stamp(run, stamped)
        for q in plan("refunds", 3):
            search(q)
        # the defect: the argument comes from a global the (replayed, not run) step bodies fill
        reply = summarize(LAST[-3:])
        run.state["reply"] = reply
        return reply


class Client:
    """A live object: a connection to some service."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def unstorable_field(thread: str, stamped: bool = False) -> str:
    with pk.resume(thread) as run:
        stamp(run, stamped)
        run.state["client"] = Client()  # the defect: a live object in the state
        notes = [search(q) for q in plan("refunds", 2)]
        return summarize(notes)


def reset() -> None:
    SENT.clear()
    LAST.clear()


def run_all(agents: dict[str, Any]) -> None:  # pragma: no cover (a manual check)
    from persistkit.testing.crash_matrix import crash_matrix

    for name, agent in agents.items():
        print(name, crash_matrix(agent))
