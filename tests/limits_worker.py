"""A worker process sharing one rate limit (tests/test_limits_processes.py, bench/bench_limits.py).

    python limits_worker.py URL LIMIT LOG [THROTTLE_AT]

Once connected it logs ``<pid> ready`` to LOG and waits for the file ``LOG.go``, which holds
``START END`` (seconds since the epoch): the driver writes it once every worker is ready, so
a slow start-up (imports on a loaded machine) never shortens a worker's run. From START until
END it makes calls to a fake provider, each under ``pk.limited(LIMIT)``: the call appends
``<pid> <time>`` to LOG (one write with O_APPEND: lines of several processes never mix).
Not a step in a turn: a turn's own writes (lease, checkpoint, end) cost more CPU than the
draw, and the machine's two cores would bound the calls before the limit does (the step path
is the conformance suite's). With THROTTLE_AT (seconds after START), the first call at or
after it also reports a provider reset one second away (``pk.throttle``), as a step that got
a 429 does, and logs ``<pid> throttle <time>``. A ``pk.RateLimitedError`` is logged as
``<pid> limited <time>``.
"""

from __future__ import annotations

import os
import sys
import time

import persistkit as pk


def main() -> int:
    url, limit, log = sys.argv[1], sys.argv[2], sys.argv[3]
    throttle_after = float(sys.argv[4]) if len(sys.argv) > 4 else None
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def write(line: str) -> None:
        os.write(fd, f"{pid} {line}\n".encode())

    store = pk.connect(url)
    store.limits.get(limit)  # connected
    write("ready")
    go = f"{log}.go"
    while not os.path.exists(go):
        time.sleep(0.01)
    with open(go) as f:
        start, end = (float(x) for x in f.read().split())
    throttle_at = None if throttle_after is None else start + throttle_after
    time.sleep(max(0.0, start - time.time()))
    while time.time() < end:
        try:
            with pk.limited(limit, store=store):
                write(f"{time.time():.6f}")  # the provider call
        except pk.RateLimitedError:
            write(f"limited {time.time():.6f}")
        if throttle_at is not None and time.time() >= throttle_at:
            pk.throttle(limit, 1.0, store=store)
            write(f"throttle {time.time():.6f}")
            throttle_at = None
    store.close()
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
