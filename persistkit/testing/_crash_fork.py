"""Process mode's clean process (``persistkit.testing.crash_matrix``, ``mode="process"``).

A process that is killed and the fresh one that resumes it start with the memory a fresh
process has: a global or a cache the killed run filled is empty in the resume. The matrix
cannot give its crash runs and its resumes that memory if it forks them from itself after
its own (uncrashed) runs filled those globals. :class:`Zygote` is forked before any of
them: it waits for commands on a pipe and forks one child per command from its own,
untouched memory; the child runs the command, the zygote replies with how it ended. That
memory is this process's when the matrix began, a fresh process's only if nothing here ran
the agent before (``RAN_HERE`` / :func:`memory_note`: the matrix then says so).
:func:`save` / :func:`load` carry a resumed run's :class:`Outcome` back in a file (a value
pickle cannot carry comes back as :class:`Opaque`, equal to what has the same ``repr``,
memory addresses aside).
"""

from __future__ import annotations

import base64
import contextlib
import gc
import importlib
import json
import os
import pickle
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import fields, replace
from typing import IO, Any

from ._crash_chain import serve
from ._crash_report import Outcome, text_of, unaddressed
from ._crash_watch import UNCARRIED, Key, wait_child

__all__ = [
    "RAN_HERE",
    "Opaque",
    "Zygote",
    "apart",
    "carried_outcome",
    "load",
    "memory_note",
    "read_events",
    "save",
    "save_given",
]

#: The names of the steps whose bodies ran in this process under a matrix's watch (an inline
#: matrix, the uncrashed runs of either mode): a zygote forked after them starts with what
#: they left in memory. Kept by ``call_agent``, once per agent call, not per step.
RAN_HERE: set[str] = set()


def memory_note(steps: list[str], mode: str = "process") -> str:
    """What the matrix says when this process ran the agent's ``steps`` before it began."""
    named = ", ".join(f"`{s}`" for s in steps[:5]) + (" ..." if len(steps) > 5 else "")
    if mode == "inline":
        return (
            f"note: this process ran the agent's steps ({named}) before this matrix (an earlier crash_matrix "
            "call: an inline one, or a process-mode one's uncrashed runs, which run here), so this matrix's "
            "uncrashed runs started from the globals and caches those runs filled, not from a fresh process's: "
            "code that behaves otherwise on a first run (a cache miss, a first call that fails) was not tried. "
            "For a fresh start run each mode in a pytest session of its own (pytest -k inline; pytest -k "
            "process), or give the agent its own globals per call"
        )
    return (
        f"note: this process ran the agent's steps ({named}) before this matrix (an earlier crash_matrix "
        "call), and process mode's children start with this process's memory, not a fresh one: a global "
        "or cache those runs filled is still filled in every crash run and resume, so a resume that "
        "depends on one (arguments built from a cache a replayed step no longer fills) is not found. "
        "For a fresh memory run process mode first or alone: before inline in the parametrization, or "
        "in a pytest session of its own (pytest -k process, or pytest-xdist's workers)"
    )


class Zygote:
    """A process forked now, which forks a child from this moment's memory for each :meth:`call`."""

    def __init__(self, child: Callable[[list[Any]], None]) -> None:
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the zygote
            os.close(cmd_w)
            os.close(rep_r)
            gc.freeze()  # as the warm process does (``_warmed``)
            code = 0
            try:
                _serve(child, cmd_r, rep_w)
            except BaseException:  # the parent sees the pipe close
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(cmd_r)
        os.close(rep_w)
        self.pid = pid
        self.commands = os.fdopen(cmd_w, "w")
        self.replies = os.fdopen(rep_r, "r")

    def call(self, command: list[Any], timeout: float) -> int:
        """Run ``command`` in a fresh child of the zygote; its wait status (``os.waitpid``), or
        -1 if it was still running after ``timeout`` seconds (it is killed then: a child stuck
        for good, e.g. waiting for a thread ``os.fork`` did not copy, must not hang the matrix)."""
        self.commands.write(json.dumps([timeout, command]) + "\n")
        self.commands.flush()
        line = self.replies.readline()
        if not line:
            raise RuntimeError("crash_matrix(mode='process'): the clean process it forks from died")
        return int(line)

    def batch(self, commands: list[list[Any]], timeout: float, parallel: int) -> list[int]:
        """Run ``commands`` in children of their own, ``parallel`` at a time (they must not
        share a store); each one's wait status, as :meth:`call` gives it."""
        self.commands.write(json.dumps([timeout, ["batch", parallel, commands]]) + "\n")
        self.commands.flush()
        line = self.replies.readline()
        if not line:
            raise RuntimeError("crash_matrix(mode='process'): the clean process it forks from died")
        statuses: list[int] = json.loads(line)
        return statuses

    def warm(self, modules: list[str]) -> bool:
        """Import ``modules`` (the ones the matrix's uncrashed runs imported) in a process that
        then forks the children in the zygote's place, so that no child pays for them again;
        False when that process started a thread while importing (``os.fork`` would not copy
        it into the children, where a fresh process has it): the zygote goes on unwarmed."""
        return self.call(["warm", modules], 0.0) == 1

    def close(self) -> None:
        self.commands.close()
        self.replies.close()
        os.waitpid(self.pid, 0)


def _serve(child: Callable[[list[Any]], None], cmd_r: int, rep_w: int) -> None:
    with os.fdopen(cmd_r, "r") as commands, os.fdopen(rep_w, "w") as replies:
        _loop(child, commands, replies)


def _loop(child: Callable[[list[Any]], None], commands: IO[str], replies: IO[str]) -> None:
    for line in commands:
        timeout, command = json.loads(line)
        if command[0] == "warm":
            if _warmed(command[1], commands, replies, child):
                return  # the warm process served every command after this one, and ended
            continue
        if command[0] == "chain":  # one crash run for many points (_crash_chain)
            reply: Any = serve(child, command, timeout)
        elif command[0] == "batch":
            reply = json.dumps(_batch(child, command[2], timeout, command[1]))
        else:
            status = wait_child(_spawn(child, command), timeout)
            reply = -1 if status is None else status
        replies.write(f"{reply}\n")
        replies.flush()


def _spawn(child: Callable[[list[Any]], None], command: list[Any]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: run the command; a kill -9 or os._exit ends it
        code = 0
        try:
            child(command)
        except BaseException:  # the parent reports the exit code
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    return pid


def _batch(child: Callable[[list[Any]], None], commands: list[list[Any]], timeout: float, parallel: int) -> list[int]:
    """Each command in a child of its own, ``parallel`` at a time; their wait statuses in
    order (-1: still running after ``timeout`` seconds, killed)."""
    statuses = [-1] * len(commands)
    waiting = list(enumerate(commands))
    running: dict[int, tuple[int, float]] = {}  # pid -> (its command's index, its deadline)
    while waiting or running:
        while waiting and len(running) < parallel:
            i, command = waiting.pop(0)
            running[_spawn(child, command)] = (i, time.monotonic() + timeout)
        for pid, (i, deadline) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses[i] = status
                del running[pid]
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
        if running and (len(running) >= parallel or not waiting):
            _any_ends(list(running), min(d for _, d in running.values()) - time.monotonic())
    return statuses


def _any_ends(pids: list[int], timeout: float) -> None:
    """Return once one of ``pids`` ended, or after ``timeout`` seconds."""
    if timeout <= 0:
        return
    if not hasattr(os, "pidfd_open"):
        time.sleep(min(0.005, timeout))  # a poll with a bound (no pidfd off Linux)
        return
    fds = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # ended already: no wait
                fds.append(os.pidfd_open(pid))
        if len(fds) == len(pids):
            select.select(fds, [], [], timeout)
    finally:
        for fd in fds:
            os.close(fd)


#: The exit code of a warm process that declined (it started a thread while importing).
_DECLINED = 2


def _warmed(
    modules: list[str], commands: IO[str], replies: IO[str], child: Callable[[list[Any]], None]
) -> bool:
    """The zygote's side of :meth:`Zygote.warm`: fork a process that imports ``modules`` and
    then reads the commands in the zygote's place (the parent sends one at a time and waits
    for its reply, so nothing is left in the inherited read buffer); True when it did and has
    ended (the parent closed the pipe), False when it declined (the zygote goes on)."""
    pid = os.fork()
    if pid == 0:  # the warm process
        code = 0
        try:
            # threads a fork hook restarted (OpenTelemetry's span processor) are in every child
            threads = _threads()
            importlib.invalidate_caches()  # a module written after a finder listed its folder
            for name in modules:
                with contextlib.suppress(Exception):  # one not importable by name stays lazy
                    importlib.import_module(name)
            _prime()
            # every object so far into the collector's permanent generation: a child's
            # collections then leave them alone instead of writing to (copying) their pages
            gc.freeze()
            if _threads() - threads:  # a thread that was not there before (one may have ended)
                replies.write("0\n")
                replies.flush()
                code = _DECLINED
            else:
                replies.write("1\n")
                replies.flush()
                _loop(child, commands, replies)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _DECLINED:
        return False
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        # it died between a command and its reply: end here too, so the parent reads the
        # pipe's end (and says its clean process died) instead of waiting for that reply
        raise RuntimeError(f"the warm process ended with wait status {status}")
    return True


def _prime() -> None:
    """Fill persistkit's own lazy caches, which depend on nothing an agent did: the secret
    detectors' compiled patterns and the environment's secrets (each child compiled and
    scanned them again, as long as a short resume)."""
    from ..secrets import _registry
    from ..secrets._detect import BUILTIN

    for det in BUILTIN:
        _ = det.regex
        if det.anchors:
            _ = det.anchor_regex
    _registry._env_sync()


def _threads() -> set[int]:
    """This process's threads, those of C libraries included where the OS lists them: their
    ids, so that a thread that ended meanwhile (a heartbeat a fork hook restarted, finding
    nothing to renew) does not hide one that started."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return {t.ident or 0 for t in threading.enumerate()}


class Opaque:
    """A value pickle could not carry between processes: equal to what has its ``repr``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return unaddressed(self.text) == (unaddressed(other.text) if isinstance(other, Opaque) else text_of(other))

    def __hash__(self) -> int:
        return hash(unaddressed(self.text))

    def __repr__(self) -> str:
        return self.text


def _carried(value: Any) -> Any:
    try:
        pickle.loads(pickle.dumps(value))
        return value
    except Exception:
        if isinstance(value, BaseException):
            return RuntimeError(f"{type(value).__name__}: {value}")
        if isinstance(value, dict):
            return {k: _carried(v) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(_carried(v) for v in value)
        return Opaque(repr(value))


def save(out: Outcome, path: str) -> None:
    fixed = replace(out, **{f.name: _carried(getattr(out, f.name)) for f in fields(out)})
    with open(path, "wb") as f:
        pickle.dump(fixed, f)


def save_given(given: Any, path: str) -> None:
    """The step results a ``given`` child's steps return (pickle raises if one cannot go;
    no file is left then)."""
    try:
        with open(path, "wb") as f:
            pickle.dump(given, f)
    except BaseException:
        os.unlink(path)
        raise


def load(path: str) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)


def read_events(
    path: str, size: int = -1
) -> tuple[dict[Key, int], dict[str, int], dict[Key, tuple[str, Any]]]:
    """What a killed child's watch logged (its first ``size`` bytes: a chain's process that
    died at a point wrote those): body runs per step key, runs outside any run per step
    name, and each step's arguments digest and result (the last per key; the result
    ``UNCARRIED`` when pickle could not carry it)."""
    counts: Counter[Key] = Counter()
    plain: Counter[str] = Counter()
    results: dict[Key, tuple[str, Any]] = {}
    with open(path, "rb") as f:
        for line in f.read(size).decode().splitlines(keepends=True):
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "run" and len(parts) == 6:
                counts[(parts[1], parts[2], parts[3], parts[4])] += 1
            elif parts[0] == "plain" and len(parts) == 2:
                plain[parts[1]] += 1
            elif parts[0] == "result" and len(parts) == 7:
                try:
                    value = pickle.loads(base64.b64decode(parts[6])) if parts[6] != "-" else UNCARRIED
                except Exception:
                    value = UNCARRIED
                results[(parts[1], parts[2], parts[3], parts[4])] = (parts[5], value)
    return dict(counts), dict(plain), results


def carried_outcome(out: Outcome) -> Outcome:
    """``out`` with what pickle cannot carry between processes replaced (see :class:`Opaque`)."""
    return replace(out, **{f.name: _carried(getattr(out, f.name)) for f in fields(out)})


def apart(work: Callable[[Callable[[str], None], Callable[[], None]], Any], reference_timeout: float) -> tuple[str, Any, list[str]]:
    """Run ``work(say, ready)`` in a child forked from this process, so that what it runs fills no
    global here (process mode: an inline matrix after it starts from this process's memory as it
    was). ``work`` calls ``ready()`` once its uncrashed runs are done: a child that has not by
    ``reference_timeout`` seconds waits for something ``os.fork`` did not copy (a framework's
    thread) and is killed. Returns ``("ok", value, said)``, ``("raised", error, said)`` or
    ``("stuck", None, [])``; ``said`` is what it passed to ``say``, for the caller to echo."""
    fd, path = tempfile.mkstemp(prefix="pk-crash-matrix-result-")
    os.close(fd)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run the work, leave what it returned (or raised) in the file
        os.close(ready_r)
        code, said = 0, []  # type: ignore[var-annotated]
        try:
            try:
                out: tuple[str, Any, list[str]] = ("ok", work(said.append, lambda: _ready(ready_w)), said)
            except BaseException as exc:  # the parent raises it
                out = ("raised", exc if _picklable(exc) else RuntimeError(f"{type(exc).__name__}: {exc}"), said)
            with open(path, "wb") as f:
                pickle.dump(out, f)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(ready_w)
    try:
        ready, _, _ = select.select([ready_r], [], [], reference_timeout)
        if not ready:  # neither ready nor ended (an end closes the pipe: readable)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "stuck", None, []
        os.waitpid(pid, 0)
        try:
            with open(path, "rb") as f:
                found: tuple[str, Any, list[str]] = pickle.load(f)
            return found
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            raise RuntimeError(
                "crash_matrix(mode='process'): the process it ran in died before it finished (see its output)"
            ) from exc
    finally:
        os.close(ready_r)
        os.unlink(path)


def _ready(fd: int) -> None:
    os.write(fd, b"1")


def _picklable(value: Any) -> bool:
    try:
        pickle.loads(pickle.dumps(value))
        return True
    except Exception:
        return False
