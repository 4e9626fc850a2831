"""A deploy while a run waits, in real processes (issue #21, "Deploys while runs wait").

Version 1 of a worker script starts a run and is SIGKILLed after its refund step
committed. Before the deploy, `persistkit replay-check` runs against version 2: without
the `pk.patched` guard it lists the old run (step, position) and exits 1; with the guard
it exits 0 and says the run still needs the patch's old path. Version 2 then resumes the
old run, which finishes on the old path (no committed step runs again), and a new run
takes the new path. Each script lives in its own folder under the same module name, as
two deploys of one program do; the tests wait for events in files, never for time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_url

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 60.0  # seconds any one wait may take before the test fails (a hang, not a timing)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCRIPT = '''
import os, sys, time
import persistkit as pk

EFFECTS = os.environ["DEPLOY_EFFECTS"]


def effect(text):
    with open(EFFECTS, "a") as f:
        f.write(text + "\\n")
        f.flush()
        os.fsync(f.fileno())


@pk.checkpointed
def charge(order):
    effect(f"charge {{order}}")
    return f"charged {{order}}"


@pk.checkpointed
def refund_v1(order):
    effect(f"refund_v1 {{order}}")
    return f"refunded {{order}} (v1)"


@pk.checkpointed
def refund_v2(order):
    effect(f"refund_v2 {{order}}")
    return f"refunded {{order}} (v2)"


@pk.checkpointed
def notify(order, text):
    effect(f"notify {{order}} {{text}}")
    return text


def entry(thread_id, run_id, mode=""):
    store = pk.connect(os.environ["DEPLOY_URL"])
    with pk.resume(thread_id, store=store, run_id=run_id) as run:
        charge(run_id)
{refund}
        if mode == "hang":
            effect(f"ready {{run_id}}")
            time.sleep(600)  # killed here: the refund is committed, the notice is not
        if mode == "suspend" or thread_id.endswith("-waits"):
            text = f"{{text}}, {{pk.suspend('approve the refund?')}}"
        notify(run_id, text)
    effect(f"{{run.status}} {{run_id}}")


if __name__ == "__main__":
    entry(sys.argv[1], sys.argv[2], *sys.argv[3:])
'''

V1 = "        text = refund_v1(run_id)"
V2 = """        if pk.patched("refund-v2"):
            text = refund_v2(run_id)
        else:
            text = refund_v1(run_id)"""
V2_UNGUARDED = "        text = refund_v2(run_id)"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory, isolated=True)


def _version(tmp: Path, name: str, refund: str) -> Path:
    folder = tmp / name
    folder.mkdir()
    (folder / "deploy_agent.py").write_text(textwrap.dedent(SCRIPT).format(refund=refund))
    return folder


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_deploy_between_crash_and_resume(url: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    effects.touch()
    v1, v2, v2u = _version(tmp_path, "v1", V1), _version(tmp_path, "v2", V2), _version(tmp_path, "v2u", V2_UNGUARDED)
    tag = uuid.uuid4().hex[:10]
    t_old, t_new = f"deploy-{tag}-old", f"deploy-{tag}-new"

    def env(folder: Path) -> dict[str, str]:
        path = os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")])
        return {**os.environ, "PYTHONPATH": path, "DEPLOY_URL": url, "DEPLOY_EFFECTS": str(effects)}

    def script(folder: Path, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(folder / "deploy_agent.py"), *args], env=env(folder), cwd=folder)

    def replay_check(folder: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "persistkit", "replay-check", url, "deploy_agent:entry", "--prefix", f"deploy-{tag}"],
            env=env(folder), cwd=folder, capture_output=True, text=True, timeout=DEADLINE,
        )

    def lines() -> list[str]:
        return [line for line in effects.read_text().splitlines() if line]

    old = script(v1, t_old, "r-old", "hang")
    until(lambda: "ready r-old" in lines(), "version 1 committed its refund")
    old.send_signal(signal.SIGKILL)
    old.wait(DEADLINE)
    assert lines() == ["charge r-old", "refund_v1 r-old", "ready r-old"]

    with pk.connect(url) as store:
        before = [(c.checkpoint_id, c.kind, c.step) for c in store.history(t_old)]

    bad = replay_check(v2u)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"STOPS thread {t_old} run r-old (running): step 'refund_v2' at position 1: NonDeterminismError" in bad.stdout
    good = replay_check(v2)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"NEEDS OLD PATH thread {t_old} run r-old: pk.patched('refund-v2')" in good.stdout
    with pk.connect(url) as store:  # the checks wrote nothing
        assert [(c.checkpoint_id, c.kind, c.step) for c in store.history(t_old)] == before

    # the deploy: version 2 resumes the old run (old path), and a new run takes the new path
    assert script(v2, t_old, "r-old").wait(DEADLINE) == 0
    assert script(v2, t_new, "r-new").wait(DEADLINE) == 0
    assert lines()[3:] == [
        "notify r-old refunded r-old (v1)",  # the committed charge and refund did not run again
        "completed r-old",
        "charge r-new", "refund_v2 r-new", "notify r-new refunded r-new (v2)", "completed r-new",
    ]
    with pk.connect(url) as store:
        assert [c.step for c in store.history(t_old) if c.kind == "step"] == ["notify", "refund_v1", "charge"]
        assert store.history(t_old, limit=1)[0].run_status == "completed"
    final = replay_check(v2)
    assert final.returncode == 0 and "0 waiting run(s) replayed" in final.stdout


@pytest.mark.skipif(not hasattr(pk, "suspend"), reason="pk.suspend is another part of issue 21, not merged here yet")
def test_deploy_while_a_run_is_suspended(url: str, tmp_path: Path) -> None:
    """Version 1 suspends a run for approval after its refund and exits; the replay check
    against version 2 says it waits (guarded) or stops (unguarded); the approval arrives
    from this process; version 2 finishes the run on the old path, and a new run of
    version 2 takes the new path through its own suspend."""
    effects = tmp_path / "effects"
    effects.touch()
    v1, v2, v2u = _version(tmp_path, "v1", V1), _version(tmp_path, "v2", V2), _version(tmp_path, "v2u", V2_UNGUARDED)
    tag = uuid.uuid4().hex[:10]
    t_old, t_new = f"deploy-{tag}-old-waits", f"deploy-{tag}-new-waits"

    def env(folder: Path) -> dict[str, str]:
        path = os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")])
        return {**os.environ, "PYTHONPATH": path, "DEPLOY_URL": url, "DEPLOY_EFFECTS": str(effects)}

    def script(folder: Path, *args: str) -> int:
        argv = [sys.executable, str(folder / "deploy_agent.py"), *args]
        return subprocess.run(argv, env=env(folder), cwd=folder, timeout=DEADLINE).returncode

    def replay_check(folder: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "persistkit", "replay-check", url, "deploy_agent:entry", "--prefix", f"deploy-{tag}"],
            env=env(folder), cwd=folder, capture_output=True, text=True, timeout=DEADLINE,
        )

    def lines() -> list[str]:
        return [line for line in effects.read_text().splitlines() if line]

    assert script(v1, t_old, "r-old") == 0
    assert lines() == ["charge r-old", "refund_v1 r-old", "suspended r-old"]
    bad = replay_check(v2u)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"STOPS thread {t_old} run r-old (suspended): step 'refund_v2' at position 1" in bad.stdout
    good = replay_check(v2)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"NEEDS OLD PATH thread {t_old} run r-old: pk.patched('refund-v2')" in good.stdout
    with pk.connect(url) as store:
        store.answer(t_old, "approved")
    assert script(v2, t_old, "r-old") == 0
    assert script(v2, t_new, "r-new") == 0
    with pk.connect(url) as store:
        store.answer(t_new, "approved too")
    assert script(v2, t_new, "r-new") == 0
    assert lines()[3:] == [
        "notify r-old refunded r-old (v1), approved", "completed r-old",
        "charge r-new", "refund_v2 r-new", "suspended r-new",
        "notify r-new refunded r-new (v2), approved too", "completed r-new",
    ]
