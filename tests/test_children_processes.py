"""Child runs across real processes (#39), on PostgreSQL and SQLite.

A supervisor process is SIGKILLed after starting two of its three children (once after they
finished, once between recording the second start and handing it over): its resume starts no
child twice and starts the third. A parent is SIGKILLed while its child runs on in a queue
worker process: its resume hands nothing over again and waits for the child's result. A parent with three children (one in a thread of its
process, one suspended, one in a queue worker process) is cancelled by an operator; the worker
is SIGKILLed during the cancel, and its redelivery runs nothing. A run SIGKILLed while it holds
the lease of a thread a child is then started on: pk.start raises ThreadBusyError at once,
naming that run, instead of waiting for it (#39 F8). Step bodies are counted in a file; tests
wait on events, never on time.
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
        "PYTHONPATH": os.pathsep.join(
            [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]
        ),
        "CHILDREN_LOG": str(tmp_path / "bodies.log"),
        "CHILDREN_QUEUE": str(tmp_path / "queue.json"),
    }


def ran(env: dict[str, str]) -> Counter[str]:
    log = Path(env["CHILDREN_LOG"])
    return Counter(x for x in log.read_text().splitlines() if x) if log.exists() else Counter()


def spawn(
    procs: list[subprocess.Popen[bytes]], env: dict[str, str], *args: str
) -> subprocess.Popen[bytes]:
    code = "import sys, children_agent; children_agent.main(sys.argv[1:])"
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stderr=subprocess.PIPE)
    procs.append(p)
    return p


@pytest.mark.parametrize("kill_at", ["finished", "handover"])
def test_a_supervisor_killed_after_two_of_three_children(
    url: str, env: dict[str, str], procs: list[subprocess.Popen[bytes]], kill_at: str
) -> None:
    import children_agent as agent

    t = f"sup-{uuid.uuid4().hex[:10]}"
    sup = spawn(procs, env, "supervisor", url, t, kill_at)
    _, err = sup.communicate(timeout=120)
    assert sup.returncode == -9, err.decode()[-2000:]
    store = pk.connect(url)
    try:
        kids = store.children(t)
        assert [k.child.position for k in kids] == [
            "0",
            "1",
        ]  # two starts recorded, the third never made
        agent.LOG = Path(env["CHILDREN_LOG"])
        with pk.resume(t, store=store, run_id="r1") as run:  # the supervisor's redelivery
            got = pk.gather(*(pk.start(agent.research, f"{t}/{x}") for x in "abc"))
        assert run.status == "completed"
        assert got == [f"{t}/{x}".upper() for x in "abc"]
        assert {k: v for k, v in ran(env).items()} == {
            f"{t}/{x}": 1 for x in "abc"
        }  # no child ran twice
        assert [k.status for k in store.children(t)] == ["completed"] * 3
    finally:
        store.close()


def test_a_child_survives_its_parents_crash_and_the_resumed_parent_waits_for_it(
    url: str, env: dict[str, str], procs: list[subprocess.Popen[bytes]]
) -> None:
    import children_agent as agent

    t = f"srv-{uuid.uuid4().hex[:10]}"
    parent = spawn(procs, env, "waiting_parent", url, t)
    until(lambda: ran(env)[f"{t}/waiting"] == 1, "the parent to wait for its child")
    worker = spawn(procs, env, "queue_worker", url)
    until(lambda: ran(env)[f"{t}/child"] == 1, "the child's step to run in the worker")
    parent.kill()  # the parent dies while its child runs on in the worker
    parent.wait(timeout=30)
    store = pk.connect(url)
    try:
        assert [k.status for k in store.children(t)] == ["running"]
        agent.LOG = Path(env["CHILDREN_LOG"])
        os.environ["CHILDREN_QUEUE"] = env[
            "CHILDREN_QUEUE"
        ]  # agent.enqueue's file, if it were called
        try:
            with pk.resume(t, store=store, run_id="r1") as run:  # the parent's redelivery
                handle = pk.start(agent.gated, f"{t}/child", executor=agent.enqueue)
                Path(env["CHILDREN_LOG"] + ".go").touch()  # now the child may finish
                assert handle.result() == f"{t}/child".upper()
        finally:
            del os.environ["CHILDREN_QUEUE"]
        assert run.status == "completed"
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err.decode()[-2000:]
        assert (
            len(Path(env["CHILDREN_QUEUE"] + ".all").read_text().splitlines()) == 1
        )  # handed over once
        assert ran(env)[f"{t}/child"] == 1  # the child's step ran once, in the worker
    finally:
        store.close()


def test_cancel_of_a_parent_reaches_three_children_one_in_a_killed_worker(
    url: str, env: dict[str, str], procs: list[subprocess.Popen[bytes]]
) -> None:
    t = f"par-{uuid.uuid4().hex[:10]}"
    parent = spawn(procs, env, "cancel_parent", url, t)
    until(
        lambda: Path(env["CHILDREN_QUEUE"]).exists() and ran(env)[f"{t}/started"] == 1,
        "the three starts",
    )
    worker = spawn(procs, env, "worker", url)
    until(
        lambda: ran(env)[f"{t}/worker"] == 1 and ran(env)[f"{t}/here"] == 1,
        "both long steps to run",
    )
    operator = pk.connect(url)
    try:
        kids = {k.child.position: k for k in operator.children(t)}
        assert {p: k.status for p, k in kids.items()} == {
            "0": "running",
            "1": "suspended",
            "2": "running",
        }
        assert operator.cancel(t, "r1") == "requested"
        worker.kill()  # the queue worker dies during the cancel: the stop stays in its child's lease record
        worker.wait(timeout=30)
        _, err = parent.communicate(timeout=120)
        assert parent.returncode == 3, err.decode()[
            -2000:
        ]  # the parent stopped with pk.RunCancelledError
        again = spawn(procs, env, "worker", url)  # the queue redelivers the worker's task
        _, err = again.communicate(timeout=120)
        assert again.returncode == 3, err.decode()[-2000:]  # it runs nothing
        until(
            lambda: all(k.status == "cancelled" for k in operator.children(t)),
            "every child cancelled",
        )
        assert operator.history(t)[0].run_status == "cancelled"
        counts = ran(env)
        assert counts[f"{t}/here"] == counts[f"{t}/worker"] == counts[f"{t}/parked"] == 1
        assert not [k for k in counts if k.endswith("/after")]  # no step after the stop ran
    finally:
        operator.close()


@pytest.mark.parametrize("executor", ["inline", "thread"])
def test_a_child_thread_whose_run_died_holding_its_lease_fails_fast(
    url: str, env: dict[str, str], procs: list[subprocess.Popen[bytes]], executor: str
) -> None:
    """A run of the named child thread died in a step, its lease still held by the dead process:
    pk.start raises ThreadBusyError naming that run (it waited up to busy_timeout, 300 s, then
    left the parent waiting for a child that never ran); once that run is given up, the child runs."""
    import children_agent as agent

    t, kid = f"sup-{uuid.uuid4().hex[:10]}", f"kid-{uuid.uuid4().hex[:10]}"
    holder = spawn(procs, env, "holder", url, kid)
    until(lambda: ran(env)[f"{kid}/old"] == 1, "the holder's step to run")
    holder.kill()
    holder.wait(timeout=30)
    store = pk.connect(url)
    try:
        agent.LOG = Path(env["CHILDREN_LOG"])
        with pk.resume(t, store=store, run_id="r1") as run:
            with pytest.raises(pk.ThreadBusyError, match=r"store\.abandon") as busy:
                pk.start(agent.research, f"{t}/a", thread_id=kid, executor=executor)
            assert busy.value.unfinished_run == "old" and busy.value.thread_id == kid
        assert run.status == "completed" and store.children(t) == []
        store.abandon(kid, "old")
        with pk.resume(t, store=store, run_id="r2"):
            h = pk.start(agent.research, f"{t}/a", thread_id=kid, executor=executor)
            assert h.result() == f"{t}/a".upper()
        assert ran(env)[f"{t}/a"] == 1
    finally:
        store.close()
