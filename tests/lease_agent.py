"""A worker for the lease process tests, run as its own process.

    python lease_agent.py URL THREAD NAME LOG OPTIONS_JSON

Every line it appends to LOG is ``NAME EVENT ...`` (flushed and fsynced, so the
test reads events in the order they happened). OPTIONS: ``busy``, ``ttl``,
``steps`` (how many), ``go`` (a file: before each step after the first, wait
until it exists), ``probe`` (False: do not recognise dead local processes, as
on another machine), ``runs`` and ``mode`` (``"writer"``: the 16-writer workload).

Exit codes: 0 done, 3 ThreadBusyError, 4 LeaseLostError.
"""

from __future__ import annotations

import json
import os
import sys
import time

import persistkit as pk
from persistkit.coordination import _lease


def log(path: str, *words: object) -> None:
    with open(path, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")
        f.flush()
        os.fsync(f.fileno())


def wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


def agent(store: pk.Store, thread: str, name: str, path: str, opts: dict[str, object]) -> None:
    @pk.checkpointed(name="work")
    def work(i: int) -> int:
        log(path, name, "step", i)  # the side effect, counted by the test
        run = pk.current_run()
        assert run is not None
        run.state.setdefault("done", []).append([name, i])
        return i

    steps = int(opts.get("steps", 3))  # type: ignore[call-overload]
    go = opts.get("go")
    log(path, name, "started", os.getpid())
    with pk.resume(thread, store=store, busy=opts.get("busy", "queue"), lease_ttl=float(opts.get("ttl", 2.0))) as run:  # type: ignore[arg-type]
        assert run.lease is not None
        log(path, name, "enter", run.lease.token, repr(time.time()), run.run_id)
        for i in range(steps):
            if i and isinstance(go, str):
                wait_for(go)
            work(i)
        log(path, name, "leave")  # the last thing done holding the lease ("exit" comes after it is given up)
    log(path, name, "exit", json.dumps(run.state["done"]))


def writer(store: pk.Store, thread: str, name: str, path: str, opts: dict[str, object]) -> None:
    """The 16-writer workload: each run appends one item, through a step with or without
    arguments, with or without run_id; no ConflictError may ever reach this code."""

    @pk.checkpointed(name="append_arg")
    def append_arg(item: str) -> None:
        run = pk.current_run()
        assert run is not None
        run.state.setdefault("items", []).append(item)

    @pk.checkpointed(name="append_none")
    def append_none() -> None:
        run = pk.current_run()
        assert run is not None
        step = pk.current_step()
        assert step is not None
        run.state.setdefault("items", []).append(run.metadata["item"])

    for i in range(int(opts["runs"])):  # type: ignore[call-overload]
        item = f"{name}:{i}"
        with_args, with_run_id = i % 2 == 0, (i // 2) % 2 == 0
        with pk.resume(
            thread, store=store, busy="queue", lease_ttl=float(opts.get("ttl", 5.0)),  # type: ignore[arg-type]
            run_id=f"{thread}/{item}" if with_run_id else None, metadata={"item": item},
        ):
            if with_args:
                append_arg(item)
            else:
                append_none()
        log(path, name, "ran", item)


def main() -> None:
    url, thread, name, path, raw = sys.argv[1:6]
    opts = json.loads(raw)
    if opts.get("probe") is False:
        _lease.PROBE_LOCAL_PROCESSES = False
    store = pk.connect(url)
    try:
        (writer if opts.get("mode") == "writer" else agent)(store, thread, name, path, opts)
    except pk.ThreadBusyError as exc:
        log(path, name, "busy", json.dumps(str(exc)))
        sys.exit(3)
    except pk.LeaseLostError as exc:
        log(path, name, "lost", json.dumps(str(exc)))
        sys.exit(4)
    finally:
        store.close()


if __name__ == "__main__":
    main()
