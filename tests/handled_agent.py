"""An agent whose step fails and whose caller handles the error, for tests/test_handled_failure.py.

    python handled_agent.py URL THREAD LOG SHAPE RETRY CRASH

``may_fail(i)`` raises ``ValueError`` for ``i == 1``; the caller catches it and goes on
with ``may_fail(2)``. SHAPE: ``toplevel`` (the loop is the block's code) or ``nested``
(the loop is the body of the step ``parent``). RETRY: ``none``, ``step`` (``may_fail``
retries, 2 attempts) or ``parent`` (``parent`` retries, 3 attempts; nested only).
CRASH: ``none``, ``between`` (the process dies in the caller right after it handled the
error, before the next step is called) or ``inside`` (it dies in the body of the next
step, ``may_fail(2)``). In a process of its own (``__main__``) the death is a real
SIGKILL; in-process callers get :class:`Died` raised (nothing after it runs, nothing is
written for it). Every step body run appends ``name i`` to LOG (a side effect persistkit
does not know about); the result and the recorded steps are printed as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import persistkit as pk

#: Set per call by :func:`agent`: where this run dies, how, and where bodies are counted.
_HERE: dict[str, Any] = {"crash": "none", "kill": False, "log": ""}


class Died(BaseException):
    """A process death stand-in: nothing after it runs, and it is never recorded."""


def _die(where: str) -> None:
    if _HERE["crash"] != where:
        return
    if _HERE["kill"]:
        os.kill(os.getpid(), signal.SIGKILL)
    raise Died(where)


def _ran(name: str, i: int) -> None:
    with open(_HERE["log"], "a") as f:
        f.write(f"{name} {i}\n")
        f.flush()
        os.fsync(f.fileno())


def _may_fail(i: int) -> int:
    _ran("may_fail", i)
    if i == 1:
        raise ValueError("bad input")
    if i == 2:
        _die("inside")
    return i


may_fail = pk.checkpointed(name="handled.may_fail")(_may_fail)
may_fail_retried = pk.checkpointed(
    name="handled.may_fail", retry=pk.Retry(attempts=2, on=ValueError)
)(_may_fail)


def _loop(step: Any, n: int) -> list[int]:
    out = []
    for i in range(n):
        try:
            out.append(step(i))
        except ValueError:
            out.append(-1)
            _die("between")
    return out


def _parent(n: int) -> list[int]:
    _ran("parent", n)
    return _loop(may_fail_retried if _HERE["retry"] == "step" else may_fail, n)


parent = pk.checkpointed(name="handled.parent")(_parent)
parent_retried = pk.checkpointed(name="handled.parent", retry=pk.Retry(attempts=3))(_parent)


def agent(
    store: pk.Store,
    thread: str,
    log: str,
    shape: str,
    retry: str,
    crash: str = "none",
    kill: bool = False,
    run_id: str | None = None,
) -> list[int]:
    """One run of the block on ``thread`` (see the module docstring)."""
    _HERE.update(crash=crash, kill=kill, log=log, retry=retry)
    with pk.resume(thread, store=store, run_id=run_id):
        if shape == "toplevel":
            return _loop(may_fail_retried if retry == "step" else may_fail, 3)
        return (parent_retried if retry == "parent" else parent)(3)


def recorded(store: pk.Store, thread: str) -> list[tuple[str, str]]:
    """The thread's step records, oldest first: (position, status)."""
    return [
        (str(c.position), str(c.status))
        for c in reversed(store.history(thread))
        if c.kind == "step"
    ]


def main() -> None:
    url, thread, log, shape, retry, crash = sys.argv[1:7]
    store = pk.connect(url)
    pk.set_testing(True)  # no retry waits
    result = agent(store, thread, log, shape, retry, crash, kill=True)
    print(json.dumps({"result": result, "recorded": recorded(store, thread)}))
    store.close()


if __name__ == "__main__":
    main()
