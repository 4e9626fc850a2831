"""``persistkit cancel`` of a live parent run opened with ``busy=None`` (#39, F12), across real
processes on PostgreSQL and SQLite.

A parent process runs a lease-less run with two children (one in a thread of its process, one
handed to a queue) and goes on with steps; an operator's ``persistkit cancel THREAD RUN`` in
another process stops it: the run raises ``pk.RunCancelledError`` at the write of its step in
flight (it had no lease to hear the request through, so the cancel ended it in the store and
its next checkpoint was refused), no step runs after that one, both children end
``cancelled``, and the run's redelivery runs nothing. Step bodies are counted in a file; the
test waits on events, never on time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_url, until

import persistkit as pk

HERE = Path(__file__).resolve().parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory, isolated=True)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "CANCEL_LOG": str(tmp_path / "bodies.log"),
    }


def ran(env: dict[str, str]) -> Counter[str]:
    log = Path(env["CANCEL_LOG"])
    return Counter(x for x in log.read_text().splitlines() if x) if log.exists() else Counter()


def spawn(procs: list[subprocess.Popen[bytes]], env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    code = "import sys, cancel_agent; cancel_agent.main(sys.argv[1:])"
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stderr=subprocess.PIPE)
    procs.append(p)
    return p


def test_cli_cancel_of_a_live_lease_less_parent_stops_it_and_its_children(
    url: str, env: dict[str, str], procs: list[subprocess.Popen[bytes]]
) -> None:
    t = f"nolease-{uuid.uuid4().hex[:10]}"
    parent = spawn(procs, env, "lease_less_parent", url, t)
    until(lambda: ran(env)[f"{t}/going"] == 1 and ran(env)[f"{t}/here"] == 1, "the parent's steps and its child")
    cli = subprocess.run(
        [sys.executable, "-m", "persistkit", "cancel", t, "r1", "--url", url],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "status cancelled" in cli.stdout
    _, err = parent.communicate(timeout=120)
    assert parent.returncode == 3, err.decode()[-2000:]  # pk.RunCancelledError inside, not a ConflictError
    assert "stopped: cancelled" in err.decode()
    operator = pk.connect(url)
    try:
        history = operator.history(t)
        assert history[0].run_status == "cancelled"
        recorded = sum(1 for c in history if c.kind == "step" and c.step and c.step.endswith("tick"))
        assert ran(env)[f"{t}/tick"] == recorded + 1  # the step in flight ran, unrecorded; none after it
        until(lambda: [k.status for k in operator.children(t)] == ["cancelled", "cancelled"], "both children cancelled")
        assert ran(env)[f"{t}/here/after"] == 0 and ran(env)[f"{t}/queued"] == 0
        before = ran(env)[f"{t}/tick"]
        again = spawn(procs, env, "lease_less_parent", url, t)  # the parent's redelivery
        _, err = again.communicate(timeout=120)
        assert again.returncode == 3, err.decode()[-2000:]  # it runs nothing
        assert ran(env)[f"{t}/tick"] == before
    finally:
        operator.close()
