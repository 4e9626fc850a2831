"""A rollback interrupted by SIGKILL, finished by a new process (issue #21, Sagas).

``tests/saga_agent.py`` books a..d, fails for good at step 5, and rolls back (undo d, c, b,
a); it kills itself when the compensation of ``b`` starts (before its effect) or right
after its effect. A new process resumes the run (same run_id): the rollback completes, no
forward step runs again, and every compensation ran exactly once, except the one in flight
when the process died after its effect, which ran again with the same idempotency key
(at-least-once for the step in flight, as for any step). Effects are counted in a file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_url

import persistkit as pk

HERE = Path(__file__).resolve().parent
AGENT = HERE / "saga_agent.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory, isolated=True)


def _agent(url: str, thread: str, run_id: str, effects: Path, kill: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, str(AGENT), url, thread, run_id, str(effects), kill]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_rollback_killed_midway_is_finished_by_a_new_process(url: str, tmp_path: Path, when: str) -> None:
    thread, run_id, effects = f"saga-{uuid.uuid4().hex}", uuid.uuid4().hex, tmp_path / "effects"
    effects.touch()
    first = _agent(url, thread, run_id, effects, f"{when}:b")
    assert first.returncode == -signal.SIGKILL, first.stderr
    lines = effects.read_text().splitlines()
    undone_first = [line.split(" ")[0] for line in lines if line.startswith("undo:")]
    assert undone_first == (["undo:d", "undo:c"] + (["undo:b"] if when == "after" else []))
    with pk.connect(url) as store:
        assert store.history(thread, limit=1)[0].run_status == "compensating"

    second = _agent(url, thread, run_id, effects, "none")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == {"outcome": "compensated"}

    lines = effects.read_text().splitlines()
    effect_names = Counter(line.split(" ")[0] for line in lines)
    forward = {"book:a": 1, "book:b": 1, "book:c": 1, "book:d": 1, "fail": 1}
    assert {k: v for k, v in effect_names.items() if not k.startswith("undo:")} == forward  # no forward step again
    in_flight = 2 if when == "after" else 1  # the one killed after its effect ran again (at-least-once)
    assert {k: v for k, v in effect_names.items() if k.startswith("undo:")} == {
        "undo:d": 1, "undo:c": 1, "undo:b": in_flight, "undo:a": 1
    }
    assert [line.split(" ")[0] for line in lines if line.startswith("undo:")][-2:] == ["undo:b", "undo:a"]
    keys = {line.split(" ")[1] for line in lines if line.startswith("undo:b")}
    assert len(keys) == 1  # the same idempotency key on both attempts
    with pk.connect(url) as store:
        hist = store.history(thread)
        assert hist[0].kind == "end" and hist[0].run_status == "compensated"
        assert [c.position for c in reversed(hist) if c.position and c.position.startswith("c/")] == [
            "c/0", "c/1", "c/2", "c/3"
        ]
    # and a redelivery after that runs nothing at all
    third = _agent(url, thread, run_id, effects, "none")
    assert json.loads(third.stdout) == {"outcome": "compensated"}
    assert effects.read_text().splitlines() == lines
