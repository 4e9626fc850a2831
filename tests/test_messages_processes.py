"""Messages into a run across SIGKILL at every position, in real processes (#39).

An agent receives three messages between its steps: one sent before the run starts, one
sent while the run is inside a step, one sent while it waits between steps
(tests/messages_agent.py). Its process is SIGKILLed just before, or just after, the record
of each of its six positions is written (a claimed message, a step's result); a new process
continues the run with the same run id. Each message is received exactly once, in order, at
its place; each step body runs once, twice only where the kill came between the body and its
record. The twelve kill points are dealt over SQLite and PostgreSQL in turn (each position
is killed on both stores, before its record on one and after it on the other). The test
talks to the agent through files and waits on them, never on time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import make_url

import persistkit as pk

HERE = Path(__file__).resolve().parent
KILLS = [f"{position}:{when}" for position in range(6) for when in ("before", "after")]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _drive(
    proc: subprocess.Popen[bytes], work: Path, store: pk.Store, thread: str, sent: list[str]
) -> int:
    """Plays the other side until the agent's process ends: the second message while step 1
    runs, the third while the run waits between steps 2 and 3; every step is let go on."""
    deadline = time.monotonic() + 120
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the agent's process did not end"
        if (work / "in-1").exists() and "during" not in sent:
            store.send(thread, "during", topic="chat", key="during")
            sent.append("during")
        if (work / "waiting").exists() and "between" not in sent:
            store.send(thread, "between", topic="chat", key="between")
            sent.append("between")
        for i in (1, 2, 3):
            if (work / f"in-{i}").exists():
                (work / f"go-{i}").touch()
        time.sleep(0.005)
    return proc.returncode


@pytest.mark.parametrize("kill", KILLS)
def test_each_message_is_received_once_across_a_kill(
    kill: str,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    kind = ("sqlite", "postgres")[KILLS.index(kill) % 2]
    url = make_url(kind, request, tmp_path_factory, isolated=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]
        ),
        "MSG_WORK": str(work),
    }
    thread, run_id = f"msgkill-{uuid.uuid4().hex[:8]}", "turn-1"
    store = pk.connect(url)
    try:
        store.send(thread, "before", topic="chat", key="before")
        sent = ["before"]
        code = "import sys, messages_agent; messages_agent.main(sys.argv[1:])"
        for attempt, how in enumerate((kill, "")):
            proc = subprocess.Popen(
                [sys.executable, "-c", code, url, thread, run_id, how],
                env=env,
                stderr=subprocess.PIPE,
            )
            try:
                status = _drive(proc, work, store, thread, sent)
            finally:
                if proc.poll() is None:
                    proc.kill()
                err = proc.stderr.read().decode()[-3000:] if proc.stderr else ""
                proc.wait()
            expected = -9 if attempt == 0 else 0
            assert status == expected, (
                f"attempt {attempt} ({how or 'no kill'}) exited {status}: {err}"
            )
        assert json.loads((work / "result").read_text()) == ["before", "during", "between"]
        messages = store.messages(thread, topic="chat")
        assert [m.value for m in messages] == ["before", "during", "between"]
        assert all(m.received for m in messages), "a message was left unreceived"
        ran = {i: len(list(work.glob(f"ran-{i}-*"))) for i in (1, 2, 3)}
        position, when = kill.split(":")
        twice = {int(position) // 2 + 1} if when == "before" and int(position) % 2 == 1 else set()
        assert ran == {i: 2 if i in twice else 1 for i in (1, 2, 3)}, (kill, ran)
        [end] = [cp for cp in store.history(thread) if cp.kind == "end"]
        assert end.run_status == "completed"
    finally:
        store.close()
