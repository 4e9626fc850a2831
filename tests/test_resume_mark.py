"""The resume mark (issue #34 §4): a block that continues an unfinished run records it once.

A process is SIGKILLed in the middle of a 20-step run and another process resumes it: the
first record the resumer writes says who resumed (host:pid), how many steps it replayed,
after which checkpoint, and whose lease it took over. Nothing else changes: the same number
of records as an uncrashed run (no write of its own, nothing per step), replay untouched,
a done mark does not copy it, a run that was not unfinished gets none.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit._cli import main

AGENT = Path(__file__).with_name("crash_agent.py")


def crash_and_resume(url: str, tmp: Path, thread: str, kill_at: int) -> tuple[int, int]:
    """Kill the agent inside step ``kill_at`` (SIGKILL), resume it in a second process:
    the two processes' pids."""
    counter = tmp / f"{thread}.log"
    first = subprocess.Popen([sys.executable, str(AGENT), url, thread, str(counter), str(kill_at), "in"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = first.communicate(timeout=120)
    assert first.returncode == -signal.SIGKILL, err
    second = subprocess.Popen([sys.executable, str(AGENT), url, thread, str(counter), "-1", "none"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert json.loads(out)["items"] == list(range(20))
    return first.pid, second.pid


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_sigkilled_run_resumed_in_another_process_is_recorded_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from conftest import make_url

    url = f"sqlite:///{tmp_path}/crash.db" if kind == "sqlite" else make_url(kind, request, tmp_path_factory)
    thread = uid("resume-mark")
    dead, resumer = crash_and_resume(url, tmp_path, thread, 13)
    host = socket.gethostname()
    with pk.connect(url) as store:
        history = store.history(thread)
    # 20 steps and the end, as an uncrashed run writes: the mark has no write of its own
    assert [cp.kind for cp in history] == ["end"] + ["step"] * 20
    marked = [cp for cp in history if cp.resumed is not None]
    assert len(marked) == 1, "one mark per resume, never per step"
    cp = marked[0]
    assert r_of(cp) == (cp.kind, cp.position) == ("step", "13")  # the first record the resumer wrote
    r = cp.resumed
    assert r is not None
    assert r.host == f"{host}:{resumer}" and r.replayed == 13
    assert r.took_over == f"{host}:{dead}" and r.holder_gone  # same machine: seen gone, not waited for
    by_pos = {c.position: c for c in history if c.kind == "step"}
    assert r.after == by_pos["12"].checkpoint_id  # the run's newest record when it resumed
    assert by_pos["12"].created_at <= r.at <= cp.created_at

    # `persistkit history` shows it: a line of its own in the table, and "resumed" in --json
    rows = _history(url, thread)
    line = next(row for row in rows.splitlines() if " resumed " in row)
    assert f"13 replayed in {host}:{resumer}"[-24:].lstrip("…") in line and " died " in line
    data = json.loads(_history(url, thread, "--json"))
    assert [row["resumed"] is not None for row in data].count(True) == 1
    got = next(row["resumed"] for row in data if row["resumed"])
    assert got["host"] == f"{host}:{resumer}" and got["replayed"] == 13 and got["took_over"] == f"{host}:{dead}"


def r_of(cp: pk.Checkpoint) -> tuple[str, str | None]:
    return cp.kind, cp.position


def _history(url: str, thread: str, *flags: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["history", thread, "--url", url, *flags])
    assert code == 0
    return buf.getvalue()


def _steps(stop_at: int | None, log: list[int]) -> Any:
    @pk.checkpointed(name="step")
    def step(i: int) -> int:
        if i == stop_at:
            raise KeyboardInterrupt  # the block stops unfinished, as a killed process would
        log.append(i)
        return i

    return step


def test_each_resume_of_an_unfinished_run_is_marked_and_replay_is_unchanged(local_store: pk.Store) -> None:
    tid, log = uid("resume-mark"), list[int]()
    for stop_at in (3, 6, None):
        step = _steps(stop_at, log)
        stops = pytest.raises(KeyboardInterrupt) if stop_at is not None else contextlib.nullcontext()
        with stops, pk.resume(tid, store=local_store) as run:
            for i in range(8):
                step(i)
    assert log == list(range(8))  # every committed step ran once
    history = list(reversed(local_store.history(tid)))
    marks = [(cp.position, cp.resumed.replayed, cp.resumed.took_over) for cp in history if cp.resumed]
    # the lease was given up by the interrupted block: nobody's lease was taken over
    assert marks == [("3", 3, None), ("6", 6, None)]
    # replay matching does not see the marks: the finished run replays whole, runs nothing
    step = _steps(None, log)
    with pk.resume(tid, store=local_store, run_id=run.run_id) as again:
        assert [step(i) for i in range(8)] == list(range(8))
    assert len(again.replayed) == 8 and not again.executed and log == list(range(8))


def test_no_mark_where_no_unfinished_run_was_continued(local_store: pk.Store) -> None:
    tid = uid("resume-mark")

    @pk.checkpointed(name="flaky")
    def flaky(left: list[int]) -> int:
        if left:
            left.pop()
            raise ValueError("once")
        return 1

    with pk.resume(tid, store=local_store) as run:  # a new turn
        flaky([])
    with pytest.raises(ValueError), pk.resume(tid, store=local_store) as failed:  # fails: an end record
        flaky([1])
    with pk.resume(tid, store=local_store, run_id=failed.run_id):  # a retry of a failed run: an attempt
        flaky([])
    with pk.resume(tid, store=local_store) as asked:
        pk.suspend({"ok?": 1})
    local_store.answer(tid, True)
    with pk.resume(tid, store=local_store, run_id=asked.run_id):  # an answered run goes on
        assert pk.suspend({"ok?": 1}) is True
        flaky([])
    assert run.status == "completed"
    assert not [cp for cp in local_store.history(tid) if cp.resumed is not None]


SENT: list[str] = []


@pk.register
def effect(note: str) -> None:
    SENT.append(note)


def test_a_done_mark_does_not_copy_the_resume_mark(local_store: pk.Store) -> None:
    tid, stop = uid("resume-mark"), {"at": 1}
    SENT.clear()
    @pk.checkpointed(name="notify")
    def notify(i: int) -> int:
        if i == stop["at"]:
            raise KeyboardInterrupt
        pk.after_commit(effect, f"sent {i}")
        return i

    with pytest.raises(KeyboardInterrupt), pk.resume(tid, store=local_store):
        notify(0)
        notify(1)
    stop["at"] = -1
    with pk.resume(tid, store=local_store):
        notify(0)
        notify(1)  # its effect runs, and a done mark (a copy of this record) records it
    assert SENT == ["sent 0", "sent 1"]
    history = local_store.history(tid)
    marks = [cp for cp in history if cp.kind == "mark"]
    assert marks and all(cp.resumed is None for cp in marks)
    assert [cp.position for cp in history if cp.resumed is not None] == ["1"]
