"""An agent that receives three messages between steps, run as a process by
tests/test_messages_processes.py (and killed there with SIGKILL at a chosen point).

    python -c "import messages_agent; messages_agent.main(argv)" URL THREAD RUN_ID KILL

``KILL`` is empty or ``POSITION:before`` / ``POSITION:after``: the process kills itself just
before, or just after, the record of that position is written (a step's result, or a
``pk.receive``'s claimed message). The test talks to it through files in ``$MSG_WORK``: a
step announces itself (``in-N``) and waits for ``go-N``; ``waiting`` says the run is between
its second and third step, waiting in ``pk.receive``. Each step body also leaves a file
``ran-N-…``, so the test counts how often each body ran.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import persistkit as pk
from persistkit.engine import _run

WORK = Path(os.environ.get("MSG_WORK", "."))


@pk.checkpointed(name="msg.work")
def work(i: int) -> int:
    (WORK / f"ran-{i}-{uuid.uuid4().hex}").touch()
    (WORK / f"in-{i}").touch()
    deadline = time.monotonic() + 60
    while not (WORK / f"go-{i}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never let step {i} go on")
        time.sleep(0.005)
    return i


def agent() -> list[Any]:
    first = pk.receive("chat", timeout=30)  # position 0: sent before the run started
    work(1)  # position 1: the test sends the second message while this step runs
    second = pk.receive("chat", timeout=30)  # position 2
    work(2)  # position 3
    (WORK / "waiting").touch()  # between steps: the test sends the third message now
    third = pk.receive("chat", timeout=30)  # position 4
    work(3)  # position 5
    return [first, second, third]


def main(argv: list[str]) -> None:
    url, thread, run_id, kill = argv
    if kill:
        where, when = kill.split(":")
        real = _run.Run.step_sync

        def dies(self: Any, position: str, name: str, digest: Any, **kw: Any) -> Any:
            if position == where and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)  # claimed or ran, never recorded
            out = real(self, position, name, digest, **kw)
            if position == where:
                os.kill(os.getpid(), signal.SIGKILL)  # recorded, the run goes no further
            return out

        _run.Run.step_sync = dies  # type: ignore[method-assign]
    store = pk.connect(url)
    with pk.resume(thread, store=store, run_id=run_id):
        got = agent()
    (WORK / "result").write_text(json.dumps(got))
    store.close()
