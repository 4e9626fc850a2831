"""Driving the turns of one thread in real worker processes (the adapters' #19 cases).

Each turn is its own process (a worker handling one delivery of a message). The
test sees who holds the thread's lease and who waits behind it through
``store.leases()``: a holder or waiter is named ``host:pid:tag``, so a process is
recognised by its pid. Nothing here sleeps a fixed time to order turns: a turn
that must arrive second is started once the first holds the lease, and a turn
that must be waiting is seen in the lease's queue before the test goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import persistkit as pk

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "adapters"), str(Path(__file__).parent)]),
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
}
BOUND = 120.0  # seconds before a wait that should end fails the test instead of hanging


class Turns:
    """Worker processes running turns of ``thread`` with ``script``."""

    def __init__(self, script: Path, url: str, thread: str, work_dir: Path) -> None:
        self.script, self.url, self.thread, self.dir = script, url, thread, work_dir
        self.store = pk.connect(url)
        self.procs: list[subprocess.Popen[str]] = []

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.store.close()

    def start(self, message: str, *options: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(self.script), self.url, self.thread, str(self.dir), message, *options],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
        )
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        out, err = proc.communicate(timeout=BOUND)
        assert proc.returncode == 0, f"turn process failed ({proc.returncode}):\n{err[-4000:]}"
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
        return result

    def killed(self, proc: subprocess.Popen[str]) -> None:
        proc.communicate(timeout=BOUND)
        assert proc.returncode == -signal.SIGKILL, f"expected a SIGKILLed worker, got {proc.returncode}"

    def _lease(self) -> pk.LeaseInfo | None:
        return next(
            (le for le in self.store.leases(prefix=self.thread) if le.thread_id == self.thread and le.namespace == ""),
            None,
        )

    def _until(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + BOUND
        while not done():
            for proc in self.procs:
                if proc.poll() not in (None, 0, -signal.SIGKILL):
                    _, err = proc.communicate()
                    raise AssertionError(f"a turn process failed while waiting for {what}:\n{err[-4000:]}")
            assert time.monotonic() < deadline, f"never saw {what}"
            time.sleep(0.02)

    def until_holding(self, proc: subprocess.Popen[str]) -> None:
        """Wait until ``proc`` holds the thread's lease (its turn is running)."""
        tag = f":{proc.pid}:"

        def holding() -> bool:
            lease = self._lease()
            return lease is not None and lease.held and tag in (lease.holder or "")

        self._until(f"process {proc.pid} holding the lease", holding)

    def until_waiting(self, proc: subprocess.Popen[str]) -> None:
        """Wait until ``proc`` is queued for the thread's lease."""
        tag = f":{proc.pid}:"

        def waiting() -> bool:
            lease = self._lease()
            return lease is not None and any(tag in w for w in lease.waiting)

        self._until(f"process {proc.pid} waiting for the lease", waiting)

    def release(self, message: str) -> None:
        """Let the turn of ``message`` go past its ``--hold-*`` point."""
        (self.dir / f"go-{message}").touch()

    def effects(self) -> list[str]:
        path = self.dir / "effects.log"
        return path.read_text().splitlines() if path.exists() else []

    def assert_done_once(self, expected: set[str]) -> Counter[str]:
        """Every model call / tool body that finished (``... done``) finished once, and these are
        exactly the ``expected`` ones (``"tool A 1"``, ...). Returns the ``begin`` counts."""
        lines = self.effects()
        done = Counter(ln.removesuffix(" done") for ln in lines if ln.endswith(" done"))
        twice = {k: n for k, n in done.items() if n > 1}
        assert not twice, f"finished bodies ran again: {twice}"
        assert set(done) == expected, f"finished: {sorted(done)}, expected {sorted(expected)}"
        return Counter(ln.removesuffix(" begin") for ln in lines if ln.endswith(" begin"))

    def runs_in_history(self) -> list[str]:
        """The run id of each checkpoint of the thread, oldest first."""
        return [cp.run_id or "" for cp in reversed(self.store.history(self.thread))]


def contiguous(owners: list[str]) -> list[tuple[str, int]]:
    """``owners`` as runs of equal neighbours: ``[("A", 6), ("B", 6)]``."""
    groups: list[tuple[str, int]] = []
    for owner in owners:
        if groups and groups[-1][0] == owner:
            groups[-1] = (owner, groups[-1][1] + 1)
        else:
            groups.append((owner, 1))
    return groups
