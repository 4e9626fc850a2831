"""A 20-step agent for the crash tests, run as its own process.

    python crash_agent.py URL THREAD COUNTER_FILE KILL_AT WHEN

Each step appends one line to COUNTER_FILE (a side effect persistkit does
not know about) before it returns. With KILL_AT >= 0 the process SIGKILLs
itself at that step: WHEN=in kills inside the step after its side effect
(the step is in flight), WHEN=after kills right after the step returned
(its checkpoint has committed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Annotated

import persistkit as pk


class Log(pk.State, name="tests.crash_agent.Log"):
    items: Annotated[list[int], pk.append] = []
    total: Annotated[int, pk.add] = 0


def main() -> None:
    url, thread, counter, kill_at, when = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

    @pk.checkpointed(name="work")
    def work(i: int) -> int:
        with open(counter, "a") as f:
            f.write(f"{i}\n")
            f.flush()
            os.fsync(f.fileno())
        if i == kill_at and when == "in":
            os.kill(os.getpid(), signal.SIGKILL)
        run = pk.current_run()
        assert run is not None
        run.state.items.append(i)
        run.update(total=i)
        return i * i

    store = pk.connect(url)
    with pk.resume(thread, store=store, state=Log) as run:
        squares = []
        for i in range(20):
            squares.append(work(i))
            if i == kill_at and when == "after":
                os.kill(os.getpid(), signal.SIGKILL)
    print(json.dumps({"squares": squares, "items": list(run.state.items), "total": run.state.total}))


if __name__ == "__main__":
    main()
