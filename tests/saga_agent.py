"""A booking saga for the process-level rollback tests, run as its own process.

    python saga_agent.py URL THREAD RUN_ID EFFECTS_FILE KILL

Steps 0-3 book ``a``..``d`` (each registers its undo with ``pk.compensate``); step 4 fails
for good, so the run rolls back: undo d, c, b, a. Every step body and every compensation
appends one line to EFFECTS_FILE (fsynced): ``book:x``, ``fail``, ``undo:x <key>``. With
KILL ``before:x`` the process SIGKILLs itself when the compensation of ``x`` starts (before
its effect); with ``after:x`` right after its effect (before its record commits); ``none``
never. Prints the outcome as JSON: ``declined`` (the first process: the rollback completed),
``compensated`` (a resume that finished an interrupted rollback).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import persistkit as pk

EFFECTS = sys.argv[4] if len(sys.argv) > 4 else os.devnull
KILL = sys.argv[5] if len(sys.argv) > 5 else "none"


class Declined(Exception):
    pass


def _effect(line: str) -> None:
    with open(EFFECTS, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@pk.register
def cancel(name: str) -> None:
    if f"before:{name}" == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    step = pk.current_step()
    assert step is not None
    _effect(f"undo:{name} {step.key}")
    if f"after:{name}" == KILL:
        os.kill(os.getpid(), signal.SIGKILL)


@pk.checkpointed
def book(name: str) -> str:
    _effect(f"book:{name}")
    pk.compensate(cancel, name)
    return name


@pk.checkpointed
def charge() -> None:
    _effect("fail")
    raise Declined("card declined")


def main() -> None:
    url, thread, run_id = sys.argv[1], sys.argv[2], sys.argv[3]
    store = pk.connect(url)
    try:
        with pk.resume(thread, store=store, run_id=run_id):
            for name in "abcd":
                book(name)
            charge()
    except Declined:
        print(json.dumps({"outcome": "declined"}))
    except pk.RunCompensatedError:
        print(json.dumps({"outcome": "compensated"}))


if __name__ == "__main__":
    main()
