"""Process mode on SQLite: one crash run killed at every crash point (``crash_matrix``).

A crash run per point ran the agent from its start to that point once per point: most of
process mode's cost, and the resumes' floor does not have it. Here one run serves them
all. At each point it is to die at, the process forks a continuation first, then kills
itself (``SIGKILL``, as before: the store holds what a process dying there leaves, its
lease names a process that is gone). The continuation waits until that process is gone,
copies the store's file and its write-ahead log (what the death left: the resume of that
point runs on the copy), notes how much of the events log the dead run wrote, and goes on
with the run to the next point. The continuation opens its own connection (the SQLite
backend reopens after a fork; the dead process's connection is never used again).

A fork copies only the thread that calls it, so a continuation can go on only where the
agent's run lives in that one thread: at a point reached on the main thread while no
other thread runs (besides persistkit's lease heartbeat, which a later block starts again,
and threads a fork hook restarts in every child). Elsewhere the process dies at that point
as the last of the chain, and the points left get a crash run each, as before.

What the chain says, one line each, through a pipe the zygote relays to a file
(:func:`serve`): ``start PID`` (a process of the chain began: the one to kill if it is
stuck), ``cut INDEX WHEN SIZE PATH`` (a process died at that point: its store copied to
PATH, the first SIZE bytes of the events log are its), ``last INDEX WHEN`` (the last
process dies at that point: the store itself and the whole log are what it left),
``ended CODE`` (the run ended before the points left: it took another path).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ..coordination._drive import _BEATER
from ._crash_watch import Point, kill_self

__all__ = ["Kills", "read_report", "serve"]

#: The lease heartbeat's thread (``coordination._drive``): a later block starts it again.
_HEARTBEAT = "persistkit-leases"


def _others() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t is not threading.current_thread()}


class Kills:
    """The child's side: ``at`` is the crash points' callback of the run's watch."""

    def __init__(self, cuts: list[list[Any]], path: str, copies: str, events_fd: int, report_fd: int) -> None:
        self.cuts = {(int(i), str(w)) for i, w in cuts}
        self.path, self.copies, self.events_fd, self.report_fd = path, copies, events_fd, report_fd
        self.hooked = _others()  # threads a fork hook started: every child of a fork has them
        self.say(f"start {os.getpid()}")

    def say(self, line: str) -> None:
        os.write(self.report_fd, (line + "\n").encode())

    def _alone(self) -> bool:
        return threading.current_thread() is threading.main_thread() and all(
            t in self.hooked or t.name == _HEARTBEAT for t in _others()
        )

    def at(self, q: Point) -> None:
        cut = (q.index, q.when)
        if cut not in self.cuts:
            return
        self.cuts.discard(cut)
        if not self.cuts or not self._alone():
            self.say(f"last {q.index} {q.when}")
            kill_self(q)
        gone_r, gone_w = os.pipe()
        # the lease heartbeat's lock, held across the fork: a fork while its thread held it
        # would leave the continuation a lock nobody releases (its next block would hang)
        with _BEATER._cond:
            pid = os.fork()
        if pid:  # this process dies here, holding gone_w: its end is the continuation's signal
            kill_self(q)
        os.close(gone_w)
        os.read(gone_r, 1)  # empty once the process that forked this one is gone
        os.close(gone_r)
        copy = f"{self.copies}-{q.index}-{q.when}.db"
        shutil.copyfile(self.path, copy)
        if os.path.exists(self.path + "-wal"):
            shutil.copyfile(self.path + "-wal", copy + "-wal")
        self.say(f"cut {q.index} {q.when} {os.fstat(self.events_fd).st_size} {copy}")
        self.hooked = _others()
        self.say(f"start {os.getpid()}")

    def ended(self, code: int) -> None:
        self.say(f"ended {code}")


def serve(child: Callable[[list[Any]], None], command: list[Any], timeout: float) -> int:
    """The zygote's side of a ``chain`` command: fork its first process, which gets the
    report pipe's write end as the command's last item, and copy what the chain says into
    the file the command names last; 0 once every process of it is gone, -1 if one said
    nothing for ``timeout`` seconds (it is killed, as a stuck crash run is)."""
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(report_r)
        code = 0
        try:
            child([*command, report_w])
        except BaseException:  # the parent reports what the chain said
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(report_w)
    current, stuck, pending = pid, False, b""
    with open(command[-1], "w") as out:
        while True:  # until every process holding the write end is gone
            ready, _, _ = select.select([report_r], [], [], timeout)
            if not ready:
                stuck = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(current, signal.SIGKILL)
                continue
            data = os.read(report_r, 65536)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode()
                if text.startswith("start "):
                    current = int(text.split()[1])
                out.write(text + "\n")
    os.close(report_r)
    os.waitpid(pid, 0)  # the first process; the others were the children of processes now gone
    return -1 if stuck else 0


def read_report(path: str) -> list[tuple[str, int, str, int, str]]:
    """What the chain said: ``(kind, index, when, events size, store path)`` per point it
    died at (``cut``, ``last``: size -1 and no path, the whole log and the store itself)."""
    out: list[tuple[str, int, str, int, str]] = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 4)
            if parts[0] == "cut" and len(parts) == 5:
                out.append(("cut", int(parts[1]), parts[2], int(parts[3]), parts[4]))
            elif parts[0] == "last" and len(parts) == 3:
                out.append(("last", int(parts[1]), parts[2], -1, ""))
    return out
