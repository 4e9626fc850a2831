"""A worker process of tests/test_concurrency_processes.py (issue #40).

``turns URL LOG TENANT I...``: runs turns I... one after the other, each
``pk.resume(f"{TENANT}-t{I}", run_id=f"turn-{I}", concurrency=("tenant", TENANT, 5))`` whose one
step is a fake provider call: it appends ``start PID I`` and ``end PID I`` to LOG (under an
exclusive flock, so the file's order is the order the calls entered and left), then ``done PID I``
once the block ended.

``bursts URL LOG THREAD PREFIX N [KILL_AT [GATE]]``: sends N messages of one thread as turns
``PREFIX-0`` ... one after the other under ``busy="debounce"``; a turn that runs appends
``batch PID EVENT <json of run.messages>``, one that was merged ``merged PID EVENT LEADER``.
With KILL_AT (a number), the first turn from that index on that leads SIGKILLs its own process
after claiming its batch and before recording it (the window a redelivery or the next leader
must cover); with GATE (a path) too, the turn at KILL_AT waits for that file first (the test
writes it once the other sender is done, so that turn leads for sure).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import sys
import time

import persistkit as pk


def note(log: str, line: str) -> None:
    with open(log, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def turns(url: str, log: str, tenant: str, items: list[str]) -> None:
    @pk.checkpointed
    def call_provider(i: str) -> str:
        note(log, f"start {os.getpid()} {i}")
        time.sleep(
            random.uniform(0.05, 0.2)
        )  # the provider's latency (the overlap the limit bounds)
        note(log, f"end {os.getpid()} {i}")
        return f"answer {i}"

    with pk.connect(url) as store:
        for i in items:
            with pk.resume(
                f"{tenant}-t{i}",
                store=store,
                run_id=f"turn-{i}",
                lease_ttl=3,
                busy_timeout=240,
                concurrency=("tenant", tenant, 5),
            ):
                call_provider(i)
            note(log, f"done {os.getpid()} {i}")


def bursts(
    url: str, log: str, thread: str, prefix: str, n: int, kill_at: str | None, gate: str | None
) -> None:
    if kill_at:
        from persistkit.engine import _run

        real = _run.Run.step_sync

        def dies(self: _run.Run, position: str, name: str, digest: object, **kw: object) -> None:
            if name == "pk.debounce" and int(self.run_id.rpartition("-")[2]) >= int(kill_at):
                os.kill(
                    os.getpid(), signal.SIGKILL
                )  # the batch is claimed, its record never written
            real(self, position, name, digest, **kw)  # type: ignore[arg-type]

        _run.Run.step_sync = dies  # type: ignore[method-assign]
    with pk.connect(url) as store:
        for i in range(n):
            event = f"{prefix}-{i}"
            if gate and i == int(kill_at or 0):  # the test writes it once the other sender is done
                while not os.path.exists(gate):
                    time.sleep(0.01)
            try:
                with pk.resume(
                    thread,
                    store=store,
                    run_id=event,
                    busy="debounce",
                    debounce=(0.05, 0.5),
                    message=event,
                    lease_ttl=3,
                    busy_timeout=240,
                ) as run:
                    note(log, f"batch {os.getpid()} {event} {json.dumps(run.messages)}")
            except pk.Debounced as d:
                note(log, f"merged {os.getpid()} {event} {d.leader}")
            time.sleep(
                random.uniform(0.0, 0.04)
            )  # a burst: a few messages close together, then a gap
            if i % 4 == 3:
                time.sleep(0.15)


if __name__ == "__main__":
    mode, url, log = sys.argv[1:4]
    if mode == "turns":
        turns(url, log, sys.argv[4], sys.argv[5:])
    else:
        bursts(
            url,
            log,
            sys.argv[4],
            sys.argv[5],
            int(sys.argv[6]),
            sys.argv[7] if len(sys.argv) > 7 else None,
            sys.argv[8] if len(sys.argv) > 8 else None,
        )
