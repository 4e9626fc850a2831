"""A 5-step agent whose state schema changes between code versions (tests/test_migrations_resume.py).

    python -c "import migrate_agent; migrate_agent.main()" URL THREAD KIND VERSION KILL_AT COUNTER_FILE

KIND is how version 2 of the state differs from version 1 (``KINDS``): a
renamed field, added fields filled in from stored data, or changed types (a
list of strings becomes a list of models, an int becomes a str). Each kind's
migration turns a version-1 state into exactly what version-2 code would
have made. Each step appends its index to COUNTER_FILE (a side effect
persistkit does not know about); with KILL_AT >= 0 the process SIGKILLs
itself inside that step, after its side effect. Prints the squares and the
final state as JSON.

Imported by the tests too: ``run_agent`` takes a ``crash`` callable instead of
SIGKILL for in-process crashes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel

import persistkit as pk

STEPS = 5
KINDS = ("rename", "add", "type")


class Entry(BaseModel):
    i: int
    text: str


class RenameV1(pk.State, name="tests.migrate_agent.rename", version=1):
    turns: int = 0
    log: Annotated[list[str], pk.append] = []


class RenameV2(pk.State, name="tests.migrate_agent.rename", version=2):
    turn_count: int = 0
    log: Annotated[list[str], pk.append] = []


@pk.migration(RenameV2, from_version=1)
def rename_turns(data: dict[str, Any]) -> dict[str, Any]:
    data["turn_count"] = data.pop("turns")
    return data


class AddV1(pk.State, name="tests.migrate_agent.add", version=1):
    turns: int = 0
    log: Annotated[list[str], pk.append] = []


class AddV2(pk.State, name="tests.migrate_agent.add", version=2):
    turns: int = 0
    score: int = 0  # each version-2 step adds 10; the migration fills in 10 per version-1 step
    origin: str = ""
    log: Annotated[list[str], pk.append] = []


@pk.migration(AddV2, from_version=1)
def add_score(data: dict[str, Any]) -> dict[str, Any]:
    data["score"] = data["turns"] * 10
    data["origin"] = "version 1"
    return data


class TypeV1(pk.State, name="tests.migrate_agent.type", version=1):
    turns: int = 0
    log: Annotated[list[str], pk.append] = []


class TypeV2(pk.State, name="tests.migrate_agent.type", version=2):
    turns: str = "0"
    log: Annotated[list[Entry], pk.append] = []


@pk.migration(TypeV2, from_version=1)
def to_entries(data: dict[str, Any]) -> dict[str, Any]:
    data["turns"] = str(data["turns"])
    data["log"] = [Entry(i=int(text[1:]), text=text) for text in data["log"]]
    return data


CLASSES: dict[tuple[str, int], type[pk.State]] = {
    ("rename", 1): RenameV1,
    ("rename", 2): RenameV2,
    ("add", 1): AddV1,
    ("add", 2): AddV2,
    ("type", 1): TypeV1,
    ("type", 2): TypeV2,
}


def advance(state: Any, kind: str, version: int, i: int) -> None:
    """What step ``i`` does to the state, in the code of ``version``."""
    if version == 1:
        state.turns += 1
        state.log.append(f"t{i}")
    elif kind == "rename":
        state.turn_count += 1
        state.log.append(f"t{i}")
    elif kind == "add":
        state.turns += 1
        state.score += 10
        state.log.append(f"t{i}")
    else:
        state.turns = str(int(state.turns) + 1)
        state.log.append(Entry(i=i, text=f"t{i}"))


def run_agent(
    store: pk.Store,
    thread: str,
    kind: str,
    version: int,
    *,
    effect: Callable[[int], None],
    crash: Callable[[int], None] | None = None,
    crash_after: Callable[[int], None] | None = None,
    run_id: str | None = None,
    steps: int = STEPS,
) -> dict[str, Any]:
    """Run the agent; ``crash(i)`` is called inside step ``i`` after its side effect,
    ``crash_after(i)`` after step ``i`` returned (its checkpoint committed)."""

    @pk.checkpointed(name="turn")
    def turn(i: int) -> int:
        effect(i)
        if crash is not None:
            crash(i)
        run = pk.current_run()
        assert run is not None
        advance(run.state, kind, version, i)
        return i * i

    with pk.resume(thread, store=store, state=CLASSES[(kind, version)], run_id=run_id) as run:
        squares = []
        for i in range(steps):
            squares.append(turn(i))
            if crash_after is not None:
                crash_after(i)
    return {"squares": squares, "state": run.state.model_dump(mode="json"), "run_id": run.run_id}


def main() -> None:
    url, thread, kind, version, kill_at, counter = sys.argv[1:7]

    def effect(i: int) -> None:
        with open(counter, "a") as f:
            f.write(f"{i}\n")
            f.flush()
            os.fsync(f.fileno())

    def crash(i: int) -> None:
        if i == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    store = pk.connect(url)
    print(json.dumps(run_agent(store, thread, kind, int(version), effect=effect, crash=crash)))


if __name__ == "__main__":
    main()
