"""Process mode's look at the agent under another hash seed (``persistkit.testing.crash_matrix``).

Iterating a set of strings (or a dict built from one) gives an order that depends on the
process's hash seed, which every new Python process draws afresh: a run killed in one
process and resumed in another may call its steps in another order. Runs forked from this
process share its seed, so none of them can show it. The probe starts this test again in
a fresh interpreter under another ``PYTHONHASHSEED`` (``python -m pytest <this test's
node id>``: the agent may be a lambda, which cannot be sent to a new process), where each
``crash_matrix`` call (:func:`probing`) only runs the agent once, uncrashed, and leaves the
steps it called in a file; the matrix compares them with its own uncrashed run's
(:func:`order_changed`). It starts as the matrix begins and runs beside it. Each call in the
probe then returns what the same call returned here (:func:`hand` here, :func:`handed` there),
so the test takes the same path in both and reaches every call (it used to return an empty
result, which failed the test's own assertions: no later call was compared). Outside pytest
there is no test to start again, and the matrix says the order was not checked.
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ._crash_fork import _picklable

__all__ = [
    "ENV",
    "Probe",
    "call_index",
    "hand",
    "handed",
    "order_changed",
    "probe",
    "probing",
    "save_calls",
]

#: Set in the probe: the directory its calls leave their steps in.
ENV = "PERSISTKIT_CRASH_MATRIX_PROBE"

_counter: dict[str, int] = {}


def _test() -> str | None:
    current = os.environ.get("PYTEST_CURRENT_TEST")
    return current.rsplit(" (", 1)[0] if current else None


def call_index() -> int:
    """This ``crash_matrix`` call's number within the current test (the probe numbers its own alike)."""
    test = _test() or ""
    n = _counter.get(test, 0)
    _counter[test] = n + 1
    return n


def probing() -> str | None:
    """The directory to leave the steps in, when this process is a probe."""
    return os.environ.get(ENV)


#: One step call as the probe and the matrix compare them: thread (by order of first use),
#: namespace, position, run ordinal, step name, arguments digest.
Call = tuple[int, str, str, str, str, str]


def normalized(calls: Sequence[Any]) -> list[Call]:
    """Step calls (``_crash_watch.StepCall``) without their thread ids, which a test draws
    afresh each time it runs (``uid()``): threads are numbered by first use."""
    threads: dict[str, int] = {}
    return [
        (threads.setdefault(c.key[0], len(threads)), c.key[1], c.key[2], c.key[3], c.step, c.digest)
        for c in calls
    ]


def save_calls(index: int, calls: Sequence[Any]) -> None:
    directory = probing()
    if directory:
        _write(os.path.join(directory, f"{index}.pickle"), pickle.dumps(normalized(calls)))


def _write(path: str, data: bytes) -> None:
    """``data`` in ``path`` at once (the other process polls for the file: never half of it)."""
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


#: Here: what each crash_matrix call of the current test returned (pickled), by call index,
#: for the probe of this test, which may start after the first calls (at the first process-mode one).
_handed: dict[int, bytes] = {}
_handed_test: list[str | None] = [None]


def hand(index: int, how: str, value: Any) -> None:
    """Here, at the end of call ``index``: what it returned (``how="ok"``) or raised
    (``"raised"``), for the probe to give back from the same call."""
    test = _test()
    if test is None:
        return
    if _handed_test[0] != test:
        _handed.clear()
        _handed_test[0] = test
    if how == "raised" and not _picklable(value):
        value = RuntimeError(f"{type(value).__name__}: {value}")
    try:
        data = pickle.dumps((how, value))
    except Exception:  # a result pickle cannot carry: the probe gives back its own (empty) one
        data = pickle.dumps(("none", None))
    _handed[index] = data
    if _current and _current[0].test == test and _current[0].dir:
        _write(os.path.join(_current[0].dir, f"result-{index}.pickle"), data)


#: Seconds the probe waits for a call's result here (the matrix runs meanwhile); it stops
#: sooner when the process that started it is gone.
HAND_TIMEOUT = 3600.0


def handed(index: int, mine: Any) -> Any:
    """In the probe: what call ``index`` returned in the process that started the probe (or
    raise what it raised there), once it has; ``mine`` (the probe's own result) if it never
    came."""
    directory = probing()
    if not directory:
        return mine
    path = os.path.join(directory, f"result-{index}.pickle")
    parent, deadline = os.getppid(), time.monotonic() + HAND_TIMEOUT
    while not os.path.exists(path):
        if os.getppid() != parent or time.monotonic() > deadline:
            return mine
        time.sleep(0.02)  # a poll with a bound: the other process writes the file
    with open(path, "rb") as f:
        how, value = pickle.load(f)
    if how == "raised":
        raise value
    return mine if how == "none" else value




_current: list[Probe] = []  # the probe of the current test: one for all its matrix calls


@atexit.register
def _end() -> None:
    for old in _current:
        old.close()
        old.remove()


def probe(index: int) -> Probe:
    """The current test's probe (started by its first process-mode matrix call)."""
    test = _test()
    if _current and _current[0].test == test and test is not None:
        _current[0].index = index
        return _current[0]
    for old in _current:
        old.close()
        old.remove()
    _current[:] = [Probe(index)]
    return _current[0]


#: Installed pytest plugins the probe does without: it runs one test, and these cost seconds
#: to import (hypothesis, langsmith) or would spread it over workers (xdist).
_UNNEEDED = ("cacheprovider", "randomly", "hypothesispytest", "langsmith_plugin", "xdist", "xdist.looponfail")


class Probe:
    """The probe of one test, started by the first process-mode matrix call that wants it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.test = _test()
        self.seed = ""
        self.why_not: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = ""
        test = _test()
        if test is None:
            self.why_not = "not checked: the matrix runs outside pytest, so there is no test to start again"
            return
        root = _root(test.split("::", 1)[0])
        if root is None:
            self.why_not = f"not checked: the test file of {test} was not found from {os.getcwd()}"
            return
        mine = os.environ.get("PYTHONHASHSEED")
        self.seed = str((int(mine) + 1) % 4294967296) if mine and mine.isdigit() else "1"
        if mine == "1":
            self.seed = "2"
        self.dir = tempfile.mkdtemp(prefix="pk-crash-matrix-probe-")
        if _handed_test[0] == test:  # this test's calls before this one: the probe meets them first
            for i, data in _handed.items():
                _write(os.path.join(self.dir, f"result-{i}.pickle"), data)
        env = {**os.environ, "PYTHONHASHSEED": self.seed, ENV: self.dir}
        env.pop("PYTEST_XDIST_WORKER", None)
        env.pop("PYTEST_ADDOPTS", None)
        command = [sys.executable, "-m", "pytest", test, "-q", "-x", "--no-header", "-o", "addopts="]
        for name in _UNNEEDED:
            command += ["-p", f"no:{name}"]
        try:
            self.proc = subprocess.Popen(
                command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        except OSError as exc:
            self.why_not = f"not checked: the test could not be started again ({exc})"

    def close(self) -> None:
        """Stop the probe if the matrix ended without asking for it (it raised)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def calls(self, timeout: float) -> list[Call] | None:
        """The probe's steps for this call, or None (``why_not`` says why)."""
        if self.proc is None:
            return None
        path = os.path.join(self.dir, f"{self.index}.pickle")
        deadline = time.monotonic() + timeout
        # the probe leaves them as its call ends, then waits for this call's result (``hand``)
        while not os.path.exists(path) and self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                self.why_not = f"not checked: the test started again was still running after {timeout:.0f} s"
                break
            time.sleep(0.02)  # a poll with a bound: the probe writes the file
        try:
            with open(path, "rb") as f:
                found: list[Call] = pickle.load(f)
            return found
        except OSError:
            self.why_not = self.why_not or (
                "not checked: the test started again under another hash seed did not reach this "
                "crash_matrix call (it took another path through the test, or failed before it)"
            )
            return None

    def remove(self) -> None:
        if self.dir and os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)


def _root(file: str) -> str | None:
    here = os.getcwd()
    while True:
        if os.path.exists(os.path.join(here, file)):
            return here
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up


def order_changed(mine: list[Call], theirs: list[Call], seed: str) -> str | None:
    """The finding when the probe called the same steps with the same arguments in another
    order (the mark of a set's order), else None: anything else that differs between two
    processes (a thread id drawn at random and passed as an argument) is not named here."""
    if Counter(c[1:] for c in mine) == Counter(c[1:] for c in theirs):
        return None  # the same calls at the same positions
    if Counter((c[0], c[1], c[3], c[4], c[5]) for c in mine) != Counter(
        (c[0], c[1], c[3], c[4], c[5]) for c in theirs
    ):
        return None  # not a permutation: another cause (the in-process runs name theirs)
    here, there = next((a, b) for a, b in zip(mine, theirs, strict=True) if a != b)
    what = (
        f"`{here[4]}` was called at position {here[2]} here, `{there[4]}` there"
        if here[4] != there[4]
        else f"step `{here[4]}` at position {here[2]} was called with other arguments"
    )
    return (
        f"the order of the steps changed in a fresh process with another hash seed (PYTHONHASHSEED={seed}): "
        f"{what}, the same calls in another order. Code between steps iterates a set (or a dict built from "
        "one) of strings or bytes, whose order changes from process to process: a run resumed in another "
        "process calls its steps in another order (a NonDeterminismError, or results landing in other "
        "places). Sort it first: `for name in sorted(names)`"
    )
