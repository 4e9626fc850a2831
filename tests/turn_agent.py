"""A worker for the turn process tests (tests/test_turn_processes.py), run as its own process.

    python turn_agent.py URL THREAD RUN_ID LOG EFFECTS OPTIONS_JSON

One turn of THREAD, ``pk.resume(THREAD, run_id=RUN_ID, busy=..., busy_timeout=...)``,
of ``steps`` steps; step ``k`` appends ``RUN_ID.k`` to the state's ``items`` (committed
with the step) and, as its side effect, a line ``RUN_ID.k`` to EFFECTS (fsynced: the
test counts the step bodies that ran). Before step ``at`` (default 1) it waits until the
file ``go`` exists, if given (the test SIGKILLs it there, after step at-1 committed).
LOG gets ``RUN_ID started|enter|exit|busy|abandoned ...`` lines.

Exit codes: 0 done, 3 ThreadBusyError, 5 RunAbandonedError.
"""

from __future__ import annotations

import json
import os
import sys
import time

import persistkit as pk


def log(path: str, *words: object) -> None:
    with open(path, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    url, thread, run_id, path, effects, raw = sys.argv[1:7]
    opts = json.loads(raw)

    @pk.checkpointed(name="item")
    def item(name: str) -> str:
        log(effects, name)
        run = pk.current_run()
        assert run is not None
        run.state["items"] = [*run.state.get("items", []), name]
        return name

    store = pk.connect(url)
    log(path, run_id, "started", os.getpid())
    try:
        with pk.resume(
            thread, store=store, run_id=run_id, busy=opts.get("busy", "queue"),
            lease_ttl=float(opts.get("ttl", 2.0)), busy_timeout=opts.get("timeout", 120.0),
        ):
            log(path, run_id, "enter")
            for k in range(int(opts.get("steps", 3))):
                go = opts.get("go")
                if go and k == int(opts.get("at", 1)):
                    while not os.path.exists(go):
                        time.sleep(0.01)
                item(f"{run_id}.{k}")
    except pk.ThreadBusyError as exc:
        log(path, run_id, "busy", exc.unfinished_run or "-")
        return 3
    except pk.RunAbandonedError:
        log(path, run_id, "abandoned")
        return 5
    finally:
        store.close()
    log(path, run_id, "exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
