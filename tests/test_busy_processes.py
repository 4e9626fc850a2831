"""A second message mid-turn across real processes (#39): ``busy="interrupt"`` and
``busy="rollback"`` with the second message arriving while the first turn is in step k of 5,
on PostgreSQL and SQLite.

One process runs the first turns (``tests/busy_agent.py first``), another sends the second
messages (``second``: a second ``pk.resume`` on the thread with that busy policy); each serves
every case of its store, one a line. The ten (policy, k) cases are dealt over the two stores
(each store gets both policies, and between them every position of each), so the file costs
four process starts. Each case checks what the policy promises: ``interrupt`` keeps the first
turn's finished steps, visible in the state, and ends it ``interrupted``; ``rollback`` puts the
head's state back where the first turn started and ends it ``rolled_back``, its step records
still in the history; asked in its last step, the turn has no next step and completes. The
step-body log shows that no step of the first turn ran after the one it was in, and that the
second turn ran once, after it. Tests wait on events, never on time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import make_url, until

import persistkit as pk

HERE = Path(__file__).resolve().parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: (policy, k) by store: every store both policies; each (policy, k) on one store.
CASES = {
    "postgres": [("interrupt", 1), ("rollback", 2), ("interrupt", 3), ("rollback", 4), ("interrupt", 5)],
    "sqlite": [("rollback", 1), ("interrupt", 2), ("rollback", 3), ("interrupt", 4), ("rollback", 5)],
}


@pytest.fixture(params=sorted(CASES))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _log(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x] if path.exists() else []


def test_a_second_message_at_each_step_of_a_five_step_turn(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path, procs: list[subprocess.Popen[bytes]],
) -> None:
    url = make_url(backend, request, tmp_path_factory, isolated=True)
    log = tmp_path / "bodies.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "BUSY_LOG": str(log),
    }
    code = "import sys, busy_agent; busy_agent.main(sys.argv[1:])"
    roles = {}
    for role in ("first", "second"):
        p = subprocess.Popen([sys.executable, "-c", code, role, url], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
        roles[role] = p

    def ask(role: str, line: str) -> None:
        stdin = roles[role].stdin
        assert stdin is not None
        stdin.write(line.encode() + b"\n")
        stdin.flush()

    def answer(role: str) -> list[str]:
        p = roles[role]
        assert p.stdout is not None
        got = p.stdout.readline().decode().split()
        if not got:  # the process died: show why
            p.kill()
            _, err = p.communicate(timeout=30)
            pytest.fail(f"the {role} process ended: {err.decode()[-3000:]}")
        return got

    operator = pk.connect(url)
    try:
        for policy, k in CASES[backend]:
            t = f"busy-{policy}-{k}-{uuid.uuid4().hex[:8]}"
            ask("first", f"{t} {k}")
            until(lambda: f"{t}:first:{k}" in _log(log), f"the first turn to be in step {k}")  # noqa: B023
            ask("second", f"{t} {policy}")  # the second message, from another process
            assert answer("second") == [t, "completed"]
            stopped = "completed" if k == 5 else ("interrupted" if policy == "interrupt" else "rolled_back")
            assert answer("first") == [t, stopped]
            firsts = [f"{t}:first:{i}" for i in range(1, k + 1)]
            # the bodies in the order they ran: none of the first turn after step k, the second once, after it
            assert [x for x in _log(log) if x.startswith(f"{t}:")] == [f"{t}:before", *firsts, f"{t}:second"]
            kept = [] if stopped == "rolled_back" else firsts
            assert operator.get_state(t)["done"] == [f"{t}:before", *kept, f"{t}:second"], (policy, k)
            ends = {c.run_id: c.run_status for c in operator.history(t) if c.step is None}
            assert ends == {"zero": "completed", "first": stopped, "second": "completed"}, (policy, k)
            first_records = operator.history(t, run_id="first")
            assert len(first_records) == k + 1, (policy, k)  # its k steps and its end: nothing deleted
    finally:
        operator.close()
        for p in roles.values():
            if p.stdin is not None:
                p.stdin.close()
